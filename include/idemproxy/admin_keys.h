/* SPDX-License-Identifier: MIT */
/* The key inspection and purge paths of the admin listener:
 *   GET    /keys/<key>[?body=1]     every stored record of <key>, across scopes (JSON)
 *   DELETE /keys/<key>?scope=<hash> removes one, so its request may run again
 *   GET    /keys?state=unknown[&cursor=C]  a page of the keys whose outcome is unknown
 *   GET    /keys?resource=ID[&scope=<hash>]  the keys whose answer created the resource ID
 *   PUT    /keys/<key>?scope=<hash> completes an unknown key with the answer in the
 *                                   body, which its duplicates then get
 *                                   (doc/guarantees.md, Unknown outcomes) */
#ifndef IDEMPROXY_ADMIN_KEYS_H
#define IDEMPROXY_ADMIN_KEYS_H

#include <microhttpd.h>

#include "idemproxy/common.h"
#include "idemproxy/outcome.h"

#define ADMIN_KEYS_PATH "/keys/"
#define ADMIN_KEYS_LIST_PATH "/keys"

struct store;

/* One call to /keys, as the admin listener read it. */
struct admin_keys_call {
    const char *prefix; /* the store keys' prefix (--key-prefix) */
    const char *target; /* the raw request target, as the client sent it */
    const char *method;
    struct span body;    /* PUT: the request body */
    bool body_too_large; /* PUT: the body went past what the listener takes */
    uint64_t ttl_ms;     /* PUT: how long an answer is kept when its key does not say */
};

/* Answers <c> (its path, once percent-decoded here, is ADMIN_KEYS_LIST_PATH
 * or starts with ADMIN_KEYS_PATH) for the store <st> (NULL when enforcement
 * is off). Access control is the caller's (admin.c). Runs on the admin
 * thread and waits, bounded, for the store; DELETE and PUT are logged with
 * the operator's address. Returns what MHD_queue_response() returns. */
enum MHD_Result admin_keys_serve(struct MHD_Connection *conn, struct store *st,
                                 const struct admin_keys_call *c);

/* Answers with the problem <p> (problem.h: its status, headers and JSON
 * body, with <detail>; WWW-Authenticate for the 401; Allow: <allow> when
 * not NULL, for the 405), not to be stored. Every error of the admin
 * listener is one of these. */
enum MHD_Result admin_keys_problem(struct MHD_Connection *conn, enum problem p, const char *detail,
                                   const char *allow);

#endif
