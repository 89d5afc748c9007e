/* SPDX-License-Identifier: MIT */
/* The client-facing HTTP server (libmicrohttpd in epoll mode, run by the event
 * loop): request intake, body chunks into the pipeline, suspend while the
 * store and the upstream work, resume with the answer. Never waits on Redis
 * or upstream. */
#ifndef IDEMPROXY_FRONT_H
#define IDEMPROXY_FRONT_H

#include "idemproxy/common.h"

struct config;
struct front;
struct loop;
struct pipeline;
struct upstream;

struct upstream_header;

/* Checks the message framing of a request's header section (RFC 9112 section
 * 6), as libmicrohttpd parsed it: it takes the first of several
 * Content-Length or Transfer-Encoding fields, accepts both together, reads
 * an unknown transfer coding until the connection closes, and keeps a name
 * with a space before its colon. What one parser could read as one request
 * and another as two is refused here. Returns NULL when the framing is
 * clear, or why not, with the status to answer in <ret_status>: 400 for a
 * field name that is not a token, a Content-Length that is not digits, two
 * that differ, two Transfer-Encoding fields, or both headers; 501 for a
 * transfer coding other than chunked alone. */
const char *front_framing_error(const struct upstream_header *headers, size_t n,
                                unsigned *ret_status);

/* Listens on cfg->listen and serves through <pl>, run by <loop>, forwarding
 * to <up> (which runs on the same loop); all borrowed: they must outlive the
 * front end, and the loop must not be running yet. Several front ends may
 * listen on one address (SO_REUSEPORT: the kernel spreads connections over
 * them). Returns 0 with it in <ret>, or a negative errno (-EADDRINUSE and
 * the like when the address cannot be bound). */
int front_start(const struct config *cfg, struct pipeline *pl, struct loop *loop,
                struct upstream *up, struct front **ret);

/* Stops accepting new connections; open ones are still served. Any thread. */
void front_quiesce(struct front *f);

/* Requests that are open: read, running, or being answered. */
unsigned front_requests(const struct front *f);

/* Stops the server and frees it. Only call once the loop has stopped and
 * front_requests() is 0 (no connection is suspended). NULL-safe. */
void front_stop(struct front *f);

#endif
