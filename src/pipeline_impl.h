/* SPDX-License-Identifier: MIT */
/* What the pipeline's three files share: the pipeline and its request, and
 * the steps each calls further down. Calls run one way: pipeline.c (steps
 * 1-4: admits, locks, holds duplicates) -> pipeline_upstream.c (steps 5-6:
 * forwards, and ends the lock with the upstream's answer: stored, released
 * or unknown) -> pipeline_answer.c (the answer, and the request's end),
 * which both call; scripts/check-shape holds them to it. */
#ifndef IDEMPROXY_PIPELINE_IMPL_H
#define IDEMPROXY_PIPELINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "idemproxy/admission.h"
#include "idemproxy/flow.h"
#include "idemproxy/loop.h"
#include "idemproxy/pipeline.h"
#include "idemproxy/reconciler.h"
#include "idemproxy/request.h"
#include "idemproxy/store.h"
#include "idemproxy/trace.h"
#include "idemproxy/upstream.h"
#include "idemproxy/waitlist.h"

struct pipeline {
    struct store *st;
    struct worker_pool *pool;
    struct waitlist *waits; /* owned: --wait's held duplicates (waitlist.h), NULL without */
    struct leases *leases;  /* owned: held locks and their heartbeat (lease.h) */
    struct reconciler *rc;  /* owned: the probes of unknown keys (reconciler.h) */
    struct pipeline_forwarder fwd;
    pthread_mutex_t routes_mu;  /* guards <routes> while a request takes its reference */
    struct route_table *routes; /* owned reference: what new requests are matched against */
    uint64_t min_lock_ttl_ms;   /* the heartbeat was set up for locks this short */
    const char *key_prefix;     /* --key-prefix, borrowed from the configuration */
    bool enabled;               /* IDEMPOTENCY_ENABLED */
    const char *proto;          /* X-Forwarded-Proto: "https" with --tls-cert-file */
    const char *id_header;      /* --request-id-header, borrowed; NULL: none */
    const char *storage_header; /* --storage-header, borrowed; NULL: none */
    /* Exchanges going on after their client was answered: a 504 at
     * --upstream-timeout, or a streamed answer's head. */
    atomic_uint late;
    struct tracer *tracer; /* borrowed: --otlp-endpoint's exporter; NULL: no tracing */
    double trace_sample;   /* --trace-sample */
};

/* A request's part of its trace (pipeline_trace.c; doc/operations.md,
 * Tracing), while tracing is on: its context was continued or started. */
struct pipeline_trace {
    struct trace_ctx ctx; /* its trace, the span of the request (SERVER), sampled or not */
    uint8_t parent[TRACE_SPAN_LEN];    /* the client's span; zeros: none */
    uint8_t client[TRACE_SPAN_LEN];    /* the upstream exchange's span (CLIENT) */
    char own[TRACEPARENT_LEN + 1];     /* ctx as a traceparent: kept with the lock */
    char forward[TRACEPARENT_LEN + 1]; /* what goes upstream */
    char link[STORE_TRACE_LEN + 1];    /* the request that ran the key, from the store */
    uint64_t start_ns, store_ns, upstream_ns, finish_ns;
    bool upstream_open;       /* the CLIENT span is started and not yet ended */
    unsigned upstream_status; /* a streamed answer's, from its head */
    const char *finish_op;    /* the lock's end under way: "complete", "release", "unknown" */
};

/* A request as the pipeline knows it: the request the front end handed over,
 * what admission decided of it, and the run's own state. The front end holds
 * a handle on it and sees none of it. */
struct pipeline_req {
    struct request *rq;         /* owned: what the front end read */
    struct pipeline_answer out; /* the answer, until it is handed over; owns its <id> */
    struct pipeline *pl;
    /* The front end's reference, and a late exchange's (doc/guarantees.md,
     * Unknown outcomes): the last one frees it. */
    atomic_int refs;
    bool decided; /* the answer was handed over */
    bool late;    /* answered 504 at --upstream-timeout; its exchange goes on */
    bool forwarded;
    bool running; /* pipeline_end() ran it: counted in flight */
    /* owned: the method, once late (the front end's copy may go); on a
     * route that reconciles, the header fields' bytes follow its NUL */
    char *late_method;
    const char *unknown;  /* the cause, once this request made its key unknown */
    const char *reason;   /* why admission refused it, for the access line; NULL: it did not */
    char *reason_buf;     /* owned: <reason>, when it had to be copied */
    struct admission adm; /* its route, key, fingerprint and body (admission.h) */
    struct store_token tok;
    /* (the bools beside <tok> fill what its 33 bytes leave of 40) */
    /* A streamed answer (doc/guarantees.md, "Streaming"): its head went to
     * the front end before its body was in, the body goes through <flow>,
     * and the exchange holds a reference until it ends. Loop thread. */
    bool streamed;
    bool keep;           /* ... keyed, and to be stored when whole */
    bool accounted;      /* its access line is written */
    bool body_streaming; /* its body passed ADMISSION_STREAM_MIN: it goes through <up_flow> */
    bool front_gone;     /* its client went while its body streamed (below) */
    bool body_over;      /* its body passed max-passthrough-body: the exchange was ended, 413 */
    struct lease *lease; /* reference while the lock is held */
    struct upstream_request up_req; /* what is forwarded: borrows from this request */
    struct upstream_why up_why;     /* why the exchange failed, when it did */
    uint64_t acquire_sent_ms;
    uint64_t start_us;         /* metrics_now_us() when the headers were in */
    uint64_t store_sent_us;    /* the acquire in progress */
    uint64_t upstream_sent_us; /* when it was forwarded */
    uint64_t upstream_us;      /* what the upstream took, once <forwarded> */
    struct flow *flow;         /* owned, once it streams: small requests stay in one tcache size */
    struct record *capture; /* a keyed streamed answer: its record, whose body is the flow's copy */
    struct loop_task ended; /* the exchange's end, brought back to the request's loop */
    /* A streamed request body (adm.streams): the front end writes, the
     * upstream reads. Its client may go before the answer (front_gone):
     * the answer is then dropped. */
    struct flow *up_flow; /* owned, once it streams */
    void (*body_wake)(void *ctx);
    void *body_wake_ctx;
    struct waitlist_entry wait;   /* --wait: a duplicate held until the first request ends */
    struct pipeline_trace *trace; /* owned, while tracing is on */
    pipeline_answer_fn *answer;
    void *answer_ctx;
};

/* pipeline_answer.c: what both steps call down into */

/* Sets the answer of <r>: <rec> (a reference it takes over), its outcome and
 * the replay header's value (NULL: none). */
void pipeline_set_answer(struct pipeline_req *r, struct record *rec, enum outcome o,
                         const char *replayed);

/* Sets a problem answer; a record that cannot be built (OOM) leaves none:
 * the front end then drops the connection. */
void pipeline_set_problem(struct pipeline_req *r, enum problem p, enum outcome o,
                          const char *detail);

/* Hands <r> back to the front end with its answer, counted and logged
 * first. The one exit. */
void pipeline_finish(struct pipeline_req *r);

/* The exchange of <r> may outlive its client: its method, the front end's
 * memory, is copied (the target is the request's own), and on a route that
 * reconciles its header fields too, for the probe of its key. */
void pipeline_keep_method(struct pipeline_req *r);

/* Counts <r> in the metrics and writes its access line, once. */
void pipeline_account(struct pipeline_req *r);

/* Counts and logs that <r> made its key's outcome unknown for <cause>. */
void pipeline_became_unknown(struct pipeline_req *r, enum store_cause cause);

/* Drops a reference to <r>: the front end's or its late exchange's; the
 * last frees it. */
void pipeline_req_unref(struct pipeline_req *r);

/* The answers of what the store found of <r>'s key: a 503 for the store's
 * failure <err>; the answer of an unknown key (<res>: made so by this
 * acquire, or found); of one whose stored answer does not open (<why>
 * logged, a 503 that runs nothing again, whatever --on-store-error says);
 * the replay of its stored answer <rec> (borrowed); the 422 of a key used
 * for another request, naming the <resource> its answer created when sane. */
void pipeline_answer_store_error(struct pipeline_req *r, int err);
void pipeline_answer_unknown(struct pipeline_req *r, const struct store_result *res);
void pipeline_answer_unreadable(struct pipeline_req *r, const char *why);
void pipeline_answer_stored(struct pipeline_req *r, struct record *rec);
void pipeline_answer_mismatch(struct pipeline_req *r, struct span resource);

/* pipeline_trace.c: the spans of a request, each step's, below every other
 * file of the pipeline (doc/operations.md, Tracing). Each does nothing
 * without a tracer. */

/* pipeline_begin(): the client's traceparent continued, or a trace started. */
void pipeline_trace_begin(struct pipeline_req *r);

/* The acquire is sent now; the traceparent to keep with <r>'s lock
 * (store_lock.trace), empty: none. */
struct span pipeline_trace_acquire(struct pipeline_req *r);

/* The acquire, sent at <r>->trace.store_ns, has answered <res> (NULL: the
 * store failed): its span; the executing request's context kept for a link. */
void pipeline_trace_acquired(struct pipeline_req *r, const struct store_result *res);

/* The exchange starts: the span it will be; returns the traceparent that
 * names it upstream (NULL without tracing: the client's go as they came). */
const char *pipeline_trace_forward(struct pipeline_req *r);

/* A streamed answer's head came with <status>. */
void pipeline_trace_head(struct pipeline_req *r, unsigned status);

/* The exchange ended: answered <status> (0: none), failed when <failed>. */
void pipeline_trace_upstream_end(struct pipeline_req *r, unsigned status, bool failed);

/* The lock's end (<op>: "complete", "release", "unknown") begins / has
 * reported: its span. */
void pipeline_trace_finish_begin(struct pipeline_req *r, const char *op);
void pipeline_trace_finish_end(struct pipeline_req *r);

/* The request's end, as its access line is written: its SERVER span. */
void pipeline_trace_end(struct pipeline_req *r, unsigned status);

/* The trace id of <r> in hex (33 bytes), or "" without tracing. */
void pipeline_trace_id(const struct pipeline_req *r, char out[2 * TRACE_ID_LEN + 1]);

/* pipeline_upstream.c: what pipeline.c calls down into */

/* Forwards <r> (keyed under its lock, or passed through); its answer ends
 * the lock and answers the client. */
void pipeline_forward(struct pipeline_req *r);

/* Completes the lock of <r> with <rec> (a reference the lease takes over),
 * or releases it when <rec> is NULL; <r> is answered once the first attempt
 * has reported back (store failures are retried without it: lease.h). */
void pipeline_lease_end(struct pipeline_req *r, struct record *rec);

#endif
