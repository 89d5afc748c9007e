/* SPDX-License-Identifier: MIT */
/* The per-request idempotency state machine (SPEC §1, §5): decides the
 * outcome, drives the store and the upstream, keeps the lock alive, and is
 * the only place that maps errors to outcomes. The front end feeds it a
 * request in three steps (begin, body, end) and gets every answer back
 * through one callback, refusals included. */
#ifndef IDEMPROXY_PIPELINE_H
#define IDEMPROXY_PIPELINE_H

#include "idemproxy/common.h"
#include "idemproxy/http.h"
#include "idemproxy/outcome.h"
#include "idemproxy/upstream.h"

struct config;
struct loop;
struct route_table;
struct pipeline;
struct record;
struct req;
struct store;
struct worker_pool;

/* How the answer comes out, the one way it does: runs exactly once per request
 * given to pipeline_begin(), once <r>->out is set (<decided> true). It may
 * run inside the call that decides it: inside pipeline_begin() or
 * pipeline_body() for a refusal (bad_request, a key error, 413), inside
 * pipeline_end() when the store and the forwarder answer at once (the memory
 * store, a refused forward or store call). Otherwise it runs later, on a loop,
 * store or worker thread. A request freed before pipeline_end() with nothing
 * decided gets none. */
typedef void req_done_fn(struct req *r, void *ctx);

/* What the front end fills before pipeline_begin(), from the HTTP layer;
 * borrowed spans stay valid for the life of the request. The pipeline only
 * reads it. */
struct req_intake {
    struct span method;
    struct span target;          /* raw request target, exactly as received */
    char *target_buf;            /* owned: the bytes of <target> */
    const char *head_uri;        /* where libmicrohttpd parsed the target, in its own buffer */
    struct http_header *headers; /* owned array; the spans borrow the front end's memory */
    size_t nheaders, headers_cap;
    char client_ip[64];
    bool http11; /* HTTP/1.1 (a Host field is required), not 1.0 */
    /* Set when the HTTP layer hid bytes of the header section from the front
     * end (a NUL inside a value or the target): why, or NULL. */
    const char *head_error;
    struct loop *loop; /* the loop it came in on: the forwarder picks that loop's upstream */
    void *conn;        /* the front end's: the client connection, once it waits for the answer */
    bool sent;         /* the front end's: the answer is queued */
};

/* What the pipeline hands back: set once, before the done callback, and only
 * read by the front end after it. */
struct req_answer {
    struct record *answer;     /* owned reference; NULL: out of memory, drop the connection */
    const char *replayed;      /* value of the replay header ("true"/"false"), or NULL for none */
    const char *replay_header; /* its name (the route's replay-header), valid until req_free() */
    enum outcome outcome;
    bool decided; /* the answer is set and the done callback was called */
};

/* A request. The front end owns it: it fills <in>, sends <out>, and frees it
 * with req_free() once the answer was sent (or the client is gone). The
 * pipeline keeps the rest of its state behind it, out of the front end's
 * sight (pipeline.c). */
struct req {
    struct req_intake in;
    struct req_answer out;
};

/* Where the pipeline forwards a request, with upstream_submit()'s contract:
 * the program passes the upstream client of <loop> (the one the request came
 * in on), a test a fake. */
struct pipeline_forwarder {
    int (*submit)(void *ctx, struct loop *loop, const struct upstream_request *req,
                  upstream_done_fn *done, void *done_ctx);
    void *ctx;
};

/* Creates the pipeline, matching requests against the routes <t> (a
 * reference is taken). Borrows <cfg> (its settings that need a restart: the
 * key prefix, whether enforcement is on), <st> (NULL when enforcement is
 * off), <pool> and <fwd> (copied): they must outlive it. The --wait
 * subscriber is set up when a route waits, and the lock heartbeat for the
 * shortest lock-ttl. Returns 0 or -ENOMEM. */
int pipeline_new(const struct config *cfg, struct route_table *t, struct store *st,
                 struct worker_pool *pool, const struct pipeline_forwarder *fwd,
                 struct pipeline **ret);

/* Returns a new request bound to <pl>, or NULL on OOM. */
struct req *req_new(struct pipeline *pl);

/* Adds a header of the request (borrowed spans). Returns 0 or -ENOMEM. */
int req_add_header(struct req *r, struct span name, struct span value);

/* Frees <r> and everything it owns. NULL-safe. Must not be called between
 * pipeline_end() and the done callback. */
void req_free(struct req *r);

/* The request comes in three steps, its answer out through <done>(<r>,
 * <ctx>) (see req_done_fn). pipeline_begin() is called once the request line
 * and headers are in: it refuses what is malformed at the HTTP level
 * (bad_request: <r>->in.head_error, the request line, the header fields and
 * their framing; such an answer closes the connection), decides passthrough or
 * enforcement, and checks the key and the announced body size. */
void pipeline_begin(struct pipeline *pl, struct req *r, req_done_fn *done, void *ctx);

/* Feeds <n> body bytes: buffered (once) and hashed. Past --max-body the body is
 * dropped and a 413 decided; bytes fed after a decision are discarded. */
void pipeline_body(struct pipeline *pl, struct req *r, const char *p, size_t n);

/* The body is complete: runs the request (store, upstream) unless its answer
 * was already decided, in which case it does nothing. */
void pipeline_end(struct pipeline *pl, struct req *r);

/* Makes <t> (a reference is taken) the routes of the requests that begin
 * from now on; those already begun keep theirs. Returns 0, or 1 when
 * settings of <t> cannot take full effect without a restart (a wait when no
 * route waited at start, a lock-ttl shorter than at start), said in <why>,
 * one line per route. */
int pipeline_set_routes(struct pipeline *pl, struct route_table *t, char *why, size_t whylen);

/* On SIGTERM: duplicates held by --wait get their 409 at once (within
 * 50 ms), and no new one is held, so that draining need not wait for them. */
void pipeline_quiesce(struct pipeline *pl);

/* The exchanges going on after their client got a 504 at --upstream-timeout
 * (SPEC §9): shutdown waits for them as for open requests. Any thread. */
unsigned pipeline_late(struct pipeline *pl);

/* Stops lock heartbeats and store retries from touching the store; call
 * before the worker pool and the store are freed. */
void pipeline_stop(struct pipeline *pl);

/* Frees <pl>. NULL-safe. */
void pipeline_free(struct pipeline *pl);

#endif
