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
};

/* A request as the pipeline knows it: the request the front end handed over,
 * what admission decided of it, and the run's own state. The front end holds
 * a handle on it and sees none of it. */
struct pipeline_req {
    struct request *rq;         /* owned: what the front end read */
    struct pipeline_answer out; /* the answer, until it is handed over */
    char *id;                   /* owned: its request id, when the pipeline has a header for it */
    struct pipeline *pl;
    /* The front end's reference, and a late exchange's (doc/guarantees.md,
     * Unknown outcomes): the last one frees it. */
    atomic_int refs;
    bool decided; /* the answer was handed over */
    bool late;    /* answered 504 at --upstream-timeout; its exchange goes on */
    /* owned: the method, once late (the front end's copy may go); on a
     * route that reconciles, the header fields' bytes follow its NUL */
    char *late_method;
    const char *unknown;  /* the cause, once this request made its key unknown */
    const char *reason;   /* why admission refused it, for the access line; NULL: it did not */
    char *reason_buf;     /* owned: <reason>, when it had to be copied */
    struct admission adm; /* its route, key, fingerprint and body (admission.h) */
    struct store_token tok;
    struct lease *lease;            /* reference while the lock is held */
    struct upstream_request up_req; /* what is forwarded: borrows from this request */
    struct upstream_why up_why;     /* why the exchange failed, when it did */
    uint64_t acquire_sent_ms;
    uint64_t start_us;         /* metrics_now_us() when the headers were in */
    uint64_t store_sent_us;    /* the acquire in progress */
    uint64_t upstream_sent_us; /* when it was forwarded */
    uint64_t upstream_us;      /* what the upstream took, once <forwarded> */
    bool forwarded;
    bool running; /* pipeline_end() ran it: counted in flight */
    /* A streamed answer (doc/guarantees.md, "Streaming"): its head went to
     * the front end before its body was in, the body goes through <flow>,
     * and the exchange holds a reference until it ends. Loop thread. */
    bool streamed;
    bool keep;              /* ... keyed, and to be stored when whole */
    bool accounted;         /* its access line is written */
    bool body_streaming;    /* its body passed ADMISSION_STREAM_MIN: it goes through <up_flow> */
    bool front_gone;        /* its client went while its body streamed (below) */
    bool body_over;         /* its body passed max-passthrough-body: the exchange was ended, 413 */
    struct flow *flow;      /* owned, once it streams: small requests stay in one tcache size */
    struct record *capture; /* a keyed streamed answer: its record, whose body is the flow's copy */
    struct loop_task ended; /* the exchange's end, brought back to the request's loop */
    /* A streamed request body (adm.streams): the front end writes, the
     * upstream reads. Its client may go before the answer (front_gone):
     * the answer is then dropped. */
    struct flow *up_flow; /* owned, once it streams */
    void (*body_wake)(void *ctx);
    void *body_wake_ctx;
    struct waitlist_entry wait; /* --wait: a duplicate held until the first request ends */
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

/* pipeline_upstream.c: what pipeline.c calls down into */

/* Forwards <r> (keyed under its lock, or passed through); its answer ends
 * the lock and answers the client. */
void pipeline_forward(struct pipeline_req *r);

/* Completes the lock of <r> with <rec> (a reference the lease takes over),
 * or releases it when <rec> is NULL; <r> is answered once the first attempt
 * has reported back (store failures are retried without it: lease.h). */
void pipeline_lease_end(struct pipeline_req *r, struct record *rec);

#endif
