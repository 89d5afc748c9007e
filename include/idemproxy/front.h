/* SPDX-License-Identifier: MIT */
/* The client-facing HTTP server (libmicrohttpd in epoll mode, run by the event
 * loop): request intake, body chunks into the pipeline, suspend while the
 * store and the upstream work, resume with the answer. Never waits on Redis
 * or upstream. */
#ifndef IDEMPROXY_FRONT_H
#define IDEMPROXY_FRONT_H

#include "idemproxy/common.h"

struct config;
struct config_addr;
struct front;
struct loop;
struct pipeline;

struct http_header;

/* True when another socket listens on <a>. The front ends set SO_REUSEPORT
 * (each loop gets its share of the connections), so a second proxy started
 * on the same address would silently share its traffic, each with its own
 * memory store: a probe without SO_REUSEPORT finds it first. */
bool front_address_taken(const struct config_addr *a);

/* Each client connection and each upstream connection is a descriptor:
 * raises the soft limit as far as allowed, and warns when
 * --max-connections cannot fit. Call before threads start. */
void front_raise_fd_limit(const struct config *cfg);

/* libmicrohttpd 0.9.75 parses a header section in place, in one buffer, and
 * hands out the method, the target, the version and each field as C strings:
 * a NUL a client sent inside one of them ends it there, and the rest is lost
 * without a sign (key "abc\0zzz" would be key "abc"). This finds such bytes:
 * <head> is the header section as parsed in place (it starts at the method;
 * its length is MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE), <method>, <uri>
 * (as the URI callback saw it) and <version> views into it, and <h> the <n>
 * fields in order (values without their trailing whitespace). In between
 * there may only be what the parser replaced or skipped: the NUL of each
 * separator and line end, spaces after the method, whitespace around a value.
 * Returns NULL when every byte is accounted for, or why not (a NUL inside a
 * part, or a folded field line, which the parser moves elsewhere). A NUL
 * right before a line's end cannot be told from a CR: what precedes it is
 * all the client sent, so nothing is lost. */
const char *front_head_hidden(struct span head, struct span method, struct span uri,
                              struct span version, const struct http_header *h, size_t n);

/* Listens on cfg->listen and serves through <pl>, run by <loop>; both
 * borrowed: they must outlive the front end, and the loop must not be
 * running yet. Several front ends may
 * listen on one address (SO_REUSEPORT: the kernel spreads connections over
 * them). Returns 0 with it in <ret>, or a negative errno (-EADDRINUSE and
 * the like when the address cannot be bound). */
int front_start(const struct config *cfg, struct pipeline *pl, struct loop *loop,
                struct front **ret);

/* Stops accepting new connections; open ones are still served. Any thread. */
void front_quiesce(struct front *f);

/* Requests that are open: read, running, or being answered. */
unsigned front_requests(const struct front *f);

/* Stops the server and frees it. Only call once the loop has stopped and
 * front_requests() is 0 (no connection is suspended). NULL-safe. */
void front_stop(struct front *f);

#endif
