/* SPDX-License-Identifier: MIT */
/* The per-request idempotency state machine (README.md, What it does with each
 * request): decides the outcome, drives the store and the upstream, keeps the
 * lock alive, and is the only place that maps errors to outcomes. The front
 * end hands it a request (request.h) in three steps (begin, body, end) and
 * gets every answer back through one call, refusals included. */
#ifndef IDEMPROXY_PIPELINE_H
#define IDEMPROXY_PIPELINE_H

#include "idemproxy/common.h"
#include "idemproxy/outcome.h"
#include "idemproxy/upstream.h"

struct config;
struct flow;
struct loop;
struct pipeline;
struct pipeline_req;
struct record;
struct request;
struct route_table;
struct store;
struct worker_pool;

/* A request's answer, handed to the front end in one call. */
struct pipeline_answer {
    struct record *rec;        /* a reference the callee takes over; NULL: out of memory, drop the
                                  connection */
    const char *replay_header; /* the route's replay-header: valid until pipeline_req_free() */
    const char *replayed;      /* its value ("true"/"false"), or NULL for none */
    /* The request id (doc/operations.md, Metrics and access log), set on every
     * answer in place of any field of that name in <rec>: valid until
     * pipeline_req_free(); NULL: none. */
    const char *id_header;
    const char *id;
    enum outcome outcome;
    /* A streamed answer's body (flow.h; doc/guarantees.md, "Streaming"):
     * <rec> gives the status and headers only, and the body is read from
     * here with flow_read() until FLOW_END or FLOW_CUT, the front end being
     * its reader (flow_set_reader()); its announced length is body->length.
     * Valid until pipeline_req_free(). NULL: the body is <rec>'s. */
    struct flow *body;
};

/* How the answer comes out, the one way it does: runs exactly once per
 * request given to pipeline_begin(). It may run inside the call that decides
 * it: inside pipeline_begin() or pipeline_body() for a refusal (bad_request,
 * a key error, 413), inside pipeline_end() when the store and the forwarder
 * answer at once (the memory store, a refused forward or store call).
 * Otherwise it runs later, on a loop, store or worker thread. A request
 * freed before pipeline_end() with nothing decided gets none. */
typedef void pipeline_answer_fn(void *ctx, const struct pipeline_answer *a);

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
 * off: answers go to it in clear, and come back in clear, a sealing filter
 * being a store too), <pool> and <fwd> (copied): they must outlive it. The --wait subscriber is set
 * up when a route waits, and the lock heartbeat for the shortest lock-ttl. Returns 0 or -ENOMEM. */
int pipeline_new(const struct config *cfg, struct route_table *t, struct store *st,
                 struct worker_pool *pool, const struct pipeline_forwarder *fwd,
                 struct pipeline **ret);

/* Traces every request from now on to <t> (borrowed: it must outlive the
 * pipeline; NULL: none), sampled at cfg->trace_sample (doc/operations.md,
 * Tracing). Before the first request. */
struct tracer;
void pipeline_set_tracer(struct pipeline *pl, struct tracer *t);

/* The request comes in three steps, its answer out through <answer>(<ctx>,
 * ...) (see pipeline_answer_fn). pipeline_begin() is called once the request
 * line and headers are in; it takes <rq> over (freed with the request). It
 * refuses what is malformed at the HTTP level (bad_request: rq->head_error,
 * the request line, the header fields and their framing), decides
 * passthrough or enforcement, and checks the key and the announced body
 * size. Returns the pipeline's request, or NULL when out of memory (<rq>
 * freed, no answer: drop the connection). */
struct pipeline_req *pipeline_begin(struct pipeline *pl, struct request *rq,
                                    pipeline_answer_fn *answer, void *ctx);

/* Feeds <n> body bytes. A keyed request's (or a small passthrough one's) are
 * buffered (once) and hashed: past --max-body the body is dropped and a 413
 * decided. A large passthrough body streams (doc/guarantees.md,
 * "Streaming"): its request was forwarded from pipeline_begin() on, and the
 * bytes go to the upstream as they come; past the route's
 * max-passthrough-body the exchange is ended and answered 413. Bytes fed
 * after a decision, or once the exchange is over, are discarded. Returns the
 * bytes taken: <n>, or fewer when the upstream has no room for them yet
 * (only a streamed body): the body wake-up (pipeline_set_body_wake()) runs
 * once it has, and the rest is fed again then. */
size_t pipeline_body(struct pipeline_req *r, const char *p, size_t n);

/* The front end's wake-up for a streamed body that pipeline_body() did not
 * take whole: <fn>(<ctx>) runs on the request's loop, from inside the
 * upstream's calls (it notes and schedules). Set it once, after
 * pipeline_begin(). */
void pipeline_set_body_wake(struct pipeline_req *r, void (*fn)(void *ctx), void *ctx);

/* The body is complete: runs the request (store, upstream) unless its answer
 * was already decided, in which case it does nothing, but for a body that
 * streams to an upstream that answered first: it is ended whole. */
void pipeline_end(struct pipeline_req *r);

/* The front end is done with <r> (answered, or the client is gone): a
 * streamed answer's body has no reader from now (a passthrough exchange is
 * ended upstream, a keyed one goes on and is stored), and its access line
 * is written with the bytes the client took. Must not be called between
 * pipeline_end() and the answer, but for a request whose body streams: its
 * client may go before its answer, which then never comes (the exchange is
 * ended upstream). NULL-safe. */
void pipeline_req_free(struct pipeline_req *r);

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
 * (doc/guarantees.md, Unknown outcomes): shutdown waits for them as for open
 * requests. Any thread. */
unsigned pipeline_late(struct pipeline *pl);

/* Stops lock heartbeats and store retries from touching the store; call
 * before the worker pool and the store are freed. */
void pipeline_stop(struct pipeline *pl);

/* Frees <pl>. NULL-safe. */
void pipeline_free(struct pipeline *pl);

#endif
