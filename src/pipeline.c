/* SPDX-License-Identifier: MIT */
/* The per-request idempotency state machine, in the order a request lives:
 * admission decides what it is from its head (pipeline_begin) and its body
 * (pipeline_body: admission.h), then (pipeline_end) the store's lock is asked
 * for, a duplicate may be held (--wait), the request is forwarded, and the
 * upstream's answer is stored and handed back (those two steps are in
 * pipeline_upstream.c, and every answer is set and handed back by
 * pipeline_answer.c; pipeline_impl.h is what the three files share).
 * pipeline_begin() and pipeline_body() run on the front end's event loop;
 * from pipeline_end() on,
 * the request follows its store calls and its upstream call, whose callbacks
 * mostly come back on that same loop (a held duplicate's retry or a
 * heartbeat runs on a worker thread), one thread at a time, until its done
 * callback hands it back. Held locks are leases (lease.h: heartbeat,
 * confirmation, the finishing chain and its retries); held duplicates are a
 * waitlist (waitlist.h). */
#include "idemproxy/pipeline.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "idemproxy/admission.h"
#include "idemproxy/config.h"
#include "idemproxy/keysource.h"
#include "idemproxy/lease.h"
#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "idemproxy/metrics.h"
#include "idemproxy/problem.h"
#include "idemproxy/record.h"
#include "idemproxy/request.h"
#include "idemproxy/route.h"
#include "idemproxy/scope.h"
#include "idemproxy/store.h"
#include "idemproxy/waitlist.h"
#include "idemproxy/worker.h"

#include "pipeline_impl.h"

static void acquire(struct pipeline_req *r);
static void wait_scope(struct pipeline_req *r);

/* One per request, calloc()ed: glibc serves a block under 1024 bytes (with
 * its header) from a small bin, and a larger one from the large bins, which
 * consolidate the fast bins first (measured: 2,600 instructions a request).
 * What only streamed requests need is allocated apart (their flows). */
_Static_assert(sizeof(struct pipeline_req) <= 1008, "struct pipeline_req stays a small-bin block");

/* Failures that repeat across requests: the first of a kind is logged, then
 * a count every 10 s (log.h). */
static struct log_burst store_failures = LOG_BURST_INIT("store failures");

/* Answers the refusal <ref> of admission. Its access line, the one line a
 * refused request gets, says why (what the client sent is escaped there). */
static void refuse(struct pipeline_req *r, const struct admission_refusal *ref)
{
    if (ref->why)
        r->reason = ref->why;
    else if (ref->detail[0] && (r->reason_buf = strdup(ref->detail)))
        r->reason = r->reason_buf;
    pipeline_set_problem(r, ref->problem, ref->outcome, ref->detail[0] ? ref->detail : NULL);
    pipeline_finish(r);
}

struct pipeline_req *pipeline_begin(struct pipeline *pl, struct request *rq,
                                    pipeline_answer_fn *answer, void *ctx)
{
    struct pipeline_req *r = calloc(1, sizeof(*r));
    struct admission_refusal ref;
    struct route_table *t;

    if (!r) {
        request_free(rq);
        return NULL;
    }
    r->pl = pl;
    r->rq = rq;
    atomic_init(&r->refs, 1);
    r->answer = answer;
    r->answer_ctx = ctx;
    r->start_us = metrics_now_us();
    r->out.outcome = OUTCOME_PASSTHROUGH;
    pipeline_trace_begin(r);
    if (pl->id_header) {
        char id[REQUEST_ID_MAX + 1];

        (void)request_id_pick(rq, span_from_cstr(pl->id_header), id);
        r->out.id = strdup(id); /* on OOM the answer goes without one */
        r->out.id_header = r->out.id ? pl->id_header : NULL;
    }
    pthread_mutex_lock(&pl->routes_mu);
    t = route_table_ref(pl->routes); /* admission takes it over */
    pthread_mutex_unlock(&pl->routes_mu);
    if (admission_head(&r->adm, t, rq, pl->key_prefix, pl->enabled, &ref))
        refuse(r, &ref);
    return r;
}

void pipeline_set_body_wake(struct pipeline_req *r, void (*fn)(void *ctx), void *ctx)
{
    r->body_wake = fn; /* the flow is made when the body starts to stream */
    r->body_wake_ctx = ctx;
}

/* A streamed body's bytes: to the upstream, within max-passthrough-body. */
static size_t body_stream(struct pipeline_req *r, const char *p, size_t n)
{
    struct flow *f = r->up_flow;
    size_t max = r->adm.route->settings.max_passthrough_body_bytes;

    if (r->body_over || f->ended || n == 0)
        return n; /* discarded */
    if (max > 0 && (f->written > max || n > max - f->written)) {
        /* A chunked body crossed the limit: the exchange ends (the upstream
         * sees its request cut), and the answer is 413. */
        r->body_over = true;
        flow_end(f, false);
        return n;
    }
    return flow_write(f, p, n);
}

/* A body that may stream passed ADMISSION_STREAM_MIN: the exchange starts,
 * the bytes read so far first. Before, a malformed or cut body is the
 * client's alone: nothing of it has gone. */
static int body_start(struct pipeline_req *r)
{
    r->up_flow = malloc(sizeof(*r->up_flow));
    if (!r->up_flow)
        return -ENOMEM;
    flow_init(r->up_flow);
    flow_set_writer(r->up_flow, r->body_wake, r->body_wake_ctx);
    r->body_streaming = true;
    flow_set_length(r->up_flow, r->adm.body_length);
    (void)flow_write(r->up_flow, r->adm.body.data, r->adm.body.len); /* an empty flow takes it */
    buf_done(&r->adm.body);
    r->running = true;
    metrics_inflight_add(1);
    pipeline_forward(r);
    return 0;
}

size_t pipeline_body(struct pipeline_req *r, const char *p, size_t n)
{
    struct admission_refusal ref;
    size_t max = r->adm.route->settings.max_passthrough_body_bytes;

    if (r->body_streaming)
        return body_stream(r, p, n);
    if (r->decided)
        return n;
    if (r->adm.streams && max > 0 && n > max - r->adm.body.len) {
        r->reason = "its body passed --max-passthrough-body";
        pipeline_set_problem(r, PROBLEM_PAYLOAD_TOO_LARGE, OUTCOME_TOO_LARGE,
                             ADMISSION_PASSTHROUGH_TOO_LARGE);
        pipeline_finish(r);
        return n;
    }
    if (r->adm.streams && n > ADMISSION_STREAM_MIN - r->adm.body.len) {
        if (body_start(r) == 0)
            return body_stream(r, p, n);
        pipeline_set_problem(r, PROBLEM_INTERNAL, OUTCOME_INTERNAL_ERROR, "Out of memory.");
        pipeline_finish(r);
        return n;
    }
    if (admission_body(&r->adm, p, n, &ref))
        refuse(r, &ref); /* and what comes after is discarded */
    return n;
}

/* ---- 3. The run: the lock first, when the key is enforced ---- */

void pipeline_end(struct pipeline_req *r)
{
    struct admission_refusal ref;

    if (r->body_streaming) {        /* running since its body passed ADMISSION_STREAM_MIN */
        flow_end(r->up_flow, true); /* whole, even when the answer came first */
        return;
    }
    if (r->decided)
        return;
    r->running = true;
    metrics_inflight_add(1);
    if (admission_end(&r->adm, r->rq, &ref))
        refuse(r, &ref);
    else if (!r->adm.enforced)
        pipeline_forward(r); /* passthrough: no key, none required, or not enforced */
    else if (r->adm.scope_wait)
        wait_scope(r);
    else
        acquire(r);
}

/* A request whose token names a kid its keys-url's set lacked, held until
 * the refetch that kid asked for is done (doc/configuration.md, Scope). */
struct scope_hold {
    struct scope_waiter w;
    struct loop_task t;
    struct pipeline_req *r; /* a reference of the hold's */
};

/* On the request's loop: its principal again, then on as any request. */
static void rescope(void *ctx)
{
    struct scope_hold *h = ctx;
    struct pipeline_req *r = h->r;
    struct admission_refusal ref;

    free(h);
    if (admission_rescope(&r->adm, r->rq, &ref))
        refuse(r, &ref);
    else if (!r->adm.enforced)
        pipeline_forward(r); /* on-unverified: passthrough */
    else
        acquire(r);
    pipeline_req_unref(r);
}

/* On the fetcher's thread: back to the request's loop (or here, once the
 * loops have stopped). */
static void on_keys_fetched(void *ctx)
{
    struct scope_hold *h = ctx;

    if (!h->r->rq->loop || loop_post(h->r->rq->loop, &h->t) < 0)
        rescope(h);
}

static void wait_scope(struct pipeline_req *r)
{
    struct scope_hold *h = calloc(1, sizeof(*h));

    if (!h) {
        pipeline_set_problem(r, PROBLEM_INTERNAL, OUTCOME_INTERNAL_ERROR, "Out of memory.");
        pipeline_finish(r);
        return;
    }
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    *h = (struct scope_hold){ .w = { .fn = on_keys_fetched, .ctx = h },
                              .t = { .fn = rescope, .ctx = h },
                              .r = r };
    if (scope_wait_keys(r->adm.route->scope, &h->w) == 0)
        return;
    rescope(h); /* no refetch is coming: refused now */
}

static void on_acquired(void *ctx, int err, const struct store_result *res);

/* Asks the store for the lock of <r>, under a new token; a store that refuses
 * the call at once answers 503. */
static void acquire(struct pipeline_req *r)
{
    struct pipeline *pl = r->pl;
    int err = store_token_new(&r->tok);

    r->acquire_sent_ms = now_ms();
    r->store_sent_us = metrics_now_us();
    if (err == 0)
        err = store_acquire(
            pl->st, span_from_cstr(r->adm.store_key), r->adm.digest, &r->tok,
            &(struct store_lock){
                .lease_ms = r->adm.route->settings.lock_ttl_ms,
                .keep_ms = r->adm.ttl_ms,
                .take_over = r->adm.route->settings.on_unknown == CONFIG_ON_UNKNOWN_RETRY,
                .about = { .route = span_from_cstr(r->adm.route->name),
                           .method = r->rq->method,
                           .target = r->adm.fwd_target },
                .tombstones = r->adm.route->settings.tombstone_ttl_ms > 0,
                .prefix_len = strlen(pl->key_prefix),
                .trace = pipeline_trace_acquire(r),
            },
            on_acquired, r);
    if (err < 0) {
        metrics_store_error();
        pipeline_answer_store_error(r, err);
        pipeline_finish(r);
    }
}

static bool wait_hold(struct pipeline_req *r, uint64_t now);
static void on_confirmed(void *ctx, int err);

static void on_acquired(void *ctx, int err, const struct store_result *res)
{
    struct pipeline_req *r = ctx;
    struct pipeline *pl = r->pl;
    const struct route_settings *rs = &r->adm.route->settings;
    uint64_t now = now_ms();

    metrics_store_call(METRICS_STORE_ACQUIRE, metrics_now_us() - r->store_sent_us);
    pipeline_trace_acquired(r, err == 0 ? res : NULL);
    if (err == 0 && res->status == STORE_ACQUIRED) {
        r->lease =
            lease_start(pl->leases, r->adm.store_key, &r->tok, r->acquire_sent_ms, rs->lock_ttl_ms);
        if (!r->lease) {
            pipeline_set_problem(r, PROBLEM_INTERNAL, OUTCOME_INTERNAL_ERROR, "Out of memory.");
            pipeline_finish(r); /* the lock expires within --lock-ttl */
            return;
        }
        /* A holder that stalled past half its lock TTL confirms the lock first. */
        if (now - r->acquire_sent_ms > rs->lock_ttl_ms / 2) {
            lease_confirm(r->lease, on_confirmed, r);
            return;
        }
        pipeline_forward(r);
        return;
    }
    if (err == 0 && res->status == STORE_IN_FLIGHT && wait_hold(r, now)) {
        return; /* held: the first request's end, or the deadline, resumes it */
    } else if (err == 0 && res->status == STORE_IN_FLIGHT) {
        pipeline_set_problem(
            r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
            "A request with this Idempotency-Key is still being processed; retry later.");
    } else if (err == 0 && res->status == STORE_MISMATCH) {
        pipeline_answer_mismatch(r, res->resource);
    } else if (err == 0 && res->status == STORE_UNKNOWN) {
        pipeline_answer_unknown(r, res);
    } else if (err == 0 && res->status == STORE_COMPLETED) {
        pipeline_answer_stored(r, res->rec);
    } else if (err == 0 && res->status == STORE_UNREADABLE) {
        pipeline_answer_unreadable(r, res->unreadable);
    } else if (err == 0 && res->status == STORE_EXPIRED) {
        pipeline_set_problem(r, PROBLEM_KEY_EXPIRED, OUTCOME_EXPIRED,
                             "This Idempotency-Key was used for a request whose stored answer has "
                             "expired; nothing was run. Use a new key.");
    } else {
        char why[1024];

        metrics_store_error();
        if (err < 0)
            store_why(r->pl->st, err, why, sizeof(why));
        else
            snprintf(why, sizeof(why), "unexpected answer");
        if (log_enabled(LOG_LEVEL_WARN) && log_burst_admit(&store_failures, why))
            log_warn("store acquire of key %s failed: %s", r->adm.store_key, why);
        if (r->adm.routes->on_store_error == CONFIG_ON_STORE_ERROR_PASSTHROUGH) {
            r->out.outcome = OUTCOME_STORE_ERROR;
            pipeline_forward(r); /* unprotected, as configured */
            return;
        }
        pipeline_answer_store_error(r, err);
    }
    pipeline_finish(r);
}

/* The lock of a holder that stalled is confirmed (or lost) before it runs. */
static void on_confirmed(void *ctx, int err)
{
    struct pipeline_req *r = ctx;

    if (err == 0) {
        pipeline_forward(r);
        return;
    }
    if (err == -ESTALE)
        pipeline_set_problem(r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
                             "This request stalled and its lock passed to another request.");
    else
        pipeline_set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                             "The idempotency store could not confirm the lock.");
    /* Not forwarded: given back, or its lapsed lease would look like a lost
     * holder's. Stale, the key may have been found unknown with this token
     * (doc/guarantees.md, Unknown outcomes): nothing ran, so that is given
     * back too; another holder's lock is left alone (the release is
     * fenced). */
    pipeline_lease_end(r, NULL);
}

/* ---- 4. --wait: a duplicate held until the first request ends ---- */

/* With --wait, holds <r> (whose key is in flight). Returns false when it is
 * not held: no --wait, its wait is over, or the proxy is stopping. */
static bool wait_hold(struct pipeline_req *r, uint64_t now)
{
    if (!r->pl->waits || r->adm.route->settings.wait_ms == 0)
        return false;
    r->wait.key = r->adm.store_key;
    if (r->wait.until_ms == 0)
        r->wait.until_ms = now + r->adm.route->settings.wait_ms; /* the route's, not the list's */
    return waitlist_hold(r->pl->waits, &r->wait, now);
}

static struct pipeline_req *preq_of_wait(struct waitlist_entry *e)
{
    return (struct pipeline_req *)(void *)((char *)e - offsetof(struct pipeline_req, wait));
}

/* A held duplicate's key was completed or released, or it is time to look:
 * it replays, executes (the first ended without storing), or is held again. */
static void on_wait_retry(void *ctx, struct waitlist_entry *e)
{
    (void)ctx;
    acquire(preq_of_wait(e));
}

static void on_wait_expired(void *ctx, struct waitlist_entry *e)
{
    struct pipeline_req *r = preq_of_wait(e);

    (void)ctx;
    pipeline_set_problem(r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
                         "A request with this Idempotency-Key is still being processed (waited "
                         "--wait); retry later.");
    pipeline_finish(r);
}

/* ---- Lifecycle ---- */

int pipeline_new(const struct config *cfg, struct route_table *t, struct store *st,
                 struct worker_pool *pool, const struct pipeline_forwarder *fwd,
                 struct pipeline **ret)
{
    struct pipeline *pl = calloc(1, sizeof(*pl));
    uint64_t wait_ms = route_table_max_wait(t);
    int err = 0;

    if (!pl)
        return -ENOMEM;
    pthread_mutex_init(&pl->routes_mu, NULL);
    pl->routes = route_table_ref(t);
    pl->key_prefix = cfg->key_prefix;
    pl->enabled = cfg->enabled;
    pl->proto = cfg->tls_cert_file ? "https" : "http";
    pl->id_header =
        cfg->request_id_header && cfg->request_id_header[0] ? cfg->request_id_header : NULL;
    pl->storage_header = cfg->storage_header && cfg->storage_header[0] ? cfg->storage_header : NULL;
    pl->st = st;
    pl->pool = pool;
    pl->fwd = *fwd;
    pl->min_lock_ttl_ms = route_table_min_lock_ttl(t);
    pl->trace_sample = cfg->trace_sample;
    /* The --wait subscriber only when a route waits (an ACL may forbid it). */
    if (st && wait_ms > 0) {
        err = waitlist_new(pool, wait_ms, on_wait_retry, on_wait_expired, pl, &pl->waits);
        if (err == 0)
            err = store_set_notify(st, waitlist_notify, pl->waits);
    }
    if (st && err == 0)
        err = leases_new(st, pool, pl->min_lock_ttl_ms, &pl->leases);
    if (st && err == 0)
        err = reconciler_new(st, fwd->submit, fwd->ctx, pl->proto,
                             cfg->upstream_timeout_ms + cfg->upstream_late_timeout_ms, &pl->rc);
    if (err < 0) {
        pipeline_free(pl);
        return err;
    }
    *ret = pl;
    return 0;
}

void pipeline_stop(struct pipeline *pl)
{
    waitlist_stop(pl->waits);
    leases_stop(pl->leases); /* waits for a heartbeat in progress */
    reconciler_stop(pl->rc); /* the probes waiting for their time are dropped */
}

void pipeline_set_tracer(struct pipeline *pl, struct tracer *t) { pl->tracer = t; }

void pipeline_quiesce(struct pipeline *pl) { waitlist_quiesce(pl->waits); }

unsigned pipeline_late(struct pipeline *pl)
{
    return pl ? atomic_load_explicit(&pl->late, memory_order_acquire) : 0;
}

void pipeline_free(struct pipeline *pl)
{
    if (!pl)
        return;
    leases_free(pl->leases);
    waitlist_free(pl->waits);
    reconciler_free(pl->rc);
    route_table_unref(pl->routes);
    pthread_mutex_destroy(&pl->routes_mu);
    free(pl);
}

int pipeline_set_routes(struct pipeline *pl, struct route_table *t, char *why, size_t whylen)
{
    struct route_table *old;
    int r = route_table_restart_notes(t, pl->waits || !pl->st, pl->min_lock_ttl_ms, why, whylen);

    pthread_mutex_lock(&pl->routes_mu);
    old = pl->routes;
    pl->routes = route_table_ref(t);
    pthread_mutex_unlock(&pl->routes_mu);
    route_table_unref(old); /* the requests that began under it keep their own references */
    return r;
}
