/* SPDX-License-Identifier: MIT */
/* A client's request as the front end read it: the request line, the header
 * fields in order, where it came from. The front end makes and fills it; the
 * pipeline takes it over (pipeline_begin()) and only reads it. Pure data:
 * one thread at a time. */
#ifndef IDEMPROXY_REQUEST_H
#define IDEMPROXY_REQUEST_H

#include "idemproxy/common.h"
#include "idemproxy/http.h"

struct loop;

struct request {
    struct span method;          /* borrowed from the front end's memory */
    struct span target;          /* the request target exactly as received: <target_buf> */
    char *target_buf;            /* owned */
    struct http_header *headers; /* owned array; the spans borrow the front end's memory */
    size_t nheaders, headers_cap;
    char client_ip[64];
    bool http11; /* HTTP/1.1 (a Host field is required), not 1.0 */
    /* Set when the HTTP layer hid bytes of the header section from the front
     * end (a NUL inside a value or the target): why, or NULL. */
    const char *head_error;
    struct loop *loop; /* the loop it came in on: the forwarder picks that loop's upstream */
};

/* Returns a new request whose target is a copy of <target>, or NULL on OOM. */
struct request *request_new(const char *target);

/* Adds a header field (borrowed spans). Returns 0 or -ENOMEM. */
int request_add_header(struct request *rq, struct span name, struct span value);

/* The first field named <name> (case-insensitive), NULL when none; how many
 * there are in <ret_count> (may be NULL). */
const struct span *request_header(const struct request *rq, struct span name, size_t *ret_count);

#define REQUEST_ID_MAX 200 /* bytes of a request id kept as the client sent it */

/* The request id of <rq> (doc/operations.md, Metrics and access log) into
 * <out>, NUL-terminated: the value of its one <header> field when that is 1 to
 * REQUEST_ID_MAX bytes of 0x21-0x7E, else a new one, 128 random bits in hex.
 * Returns true when it was kept, false when made. */
bool request_id_pick(const struct request *rq, struct span header, char out[REQUEST_ID_MAX + 1]);

/* Whether <v> may be kept as a request id: 1 to REQUEST_ID_MAX bytes of 0x21-0x7E. */
bool request_id_is_valid(struct span v);

/* Frees <rq> and what it owns. NULL-safe. */
void request_free(struct request *rq);

#endif
