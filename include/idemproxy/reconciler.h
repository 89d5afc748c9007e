/* SPDX-License-Identifier: MIT */
/* The probes of unknown keys (doc/configuration.md, Reconcile): one job per
 * key this process made unknown or answered as unknown, on the loop of the
 * request it was made from. A job claims each probe from the store (which
 * paces them for every proxy: settle, every, attempts), sends it through
 * the upstream client of its loop, judges the answer (reconcile.h), and
 * tells the store: found completes the key, absent twice releases it,
 * anything else leaves it to the operator. The probe's headers are copied
 * from the request at hand, only those of the key's scope. */
#ifndef IDEMPROXY_RECONCILER_H
#define IDEMPROXY_RECONCILER_H

#include "idemproxy/common.h"
#include "idemproxy/store.h"
#include "idemproxy/upstream.h"

struct loop;
struct reconciler;
struct request;
struct route;
struct route_table;

/* Sends <req> through the upstream client of <loop>, with upstream_submit()'s
 * contract (the pipeline's forwarder). */
typedef int reconciler_submit_fn(void *ctx, struct loop *loop, const struct upstream_request *req,
                                 upstream_done_fn *done, void *done_ctx);

#define RECONCILER_JOBS_MAX 10000 /* keys probed at once by one process */

/* Creates the reconciler over <st> (borrowed), sending probes with
 * <submit>(<submit_ctx>, ...) with X-Forwarded-Proto <proto> (static).
 * A key whose holder was lost is not probed before <holder_ms> more than its
 * route's settle (the holder's exchange may go on that long: the upstream
 * and late timeouts). Returns 0 or -ENOMEM. */
int reconciler_new(struct store *st, reconciler_submit_fn *submit, void *submit_ctx,
                   const char *proto, uint64_t holder_ms, struct reconciler **ret);

/* What a job starts from. All borrowed for the call. */
struct reconciler_key {
    struct route_table *routes; /* a reference is taken: <route> is one of its routes */
    const struct route *route;  /* with a reconcile: block */
    const char *store_key;
    struct span key;          /* the idempotency key, for {key} */
    const struct request *rq; /* the request at hand: its headers, Host, client and loop */
    struct span body;         /* its body, for {body:} */
    bool made;                /* this request made the key unknown: no probe before settle */
    enum store_cause cause;   /* why it is unknown */
    /* the route's scope (jwt or trusted header) found a principal in <rq>:
     * its header counts as part of the key's scope (else it does not) */
    bool principal;
};

/* Starts probing <k>'s key, unless a job of this process already does, or
 * RECONCILER_JOBS_MAX run, or the reconciler stopped; a target that cannot
 * be built (a {body:} the body does not fill) is a failed probe, logged and
 * counted. Any thread: the job runs on rq->loop. */
void reconciler_start(struct reconciler *rc, const struct reconciler_key *k);

/* Probes running or waiting now. Any thread. */
unsigned reconciler_jobs(struct reconciler *rc);

/* No new job from now on; the waiting ones are dropped. Call once the loops
 * have stopped. Jobs whose store call or probe is still out end when it
 * calls back. */
void reconciler_stop(struct reconciler *rc);

/* Frees <rc> (after reconciler_stop(), once the store and the upstream
 * clients have called back). NULL-safe. */
void reconciler_free(struct reconciler *rc);

#endif
