/* SPDX-License-Identifier: MIT */
/* The per-request idempotency state machine, in the order a request lives:
 * admission decides what it is from its head (pipeline_begin) and its body
 * (pipeline_body: admission.h), then (pipeline_end) the store's lock is asked
 * for, a duplicate may be held (--wait), the request is forwarded, and the
 * upstream's answer is stored and handed back. pipeline_begin() and
 * pipeline_body() run on the front end's event loop; from pipeline_end() on,
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
#include "idemproxy/metrics.h"
#include "idemproxy/problem.h"
#include "idemproxy/record.h"
#include "idemproxy/request.h"
#include "idemproxy/route.h"
#include "idemproxy/store.h"
#include "idemproxy/waitlist.h"
#include "idemproxy/worker.h"

struct pipeline {
    struct store *st;
    struct worker_pool *pool;
    struct waitlist *waits; /* owned: --wait's held duplicates (waitlist.h), NULL without */
    struct leases *leases;  /* owned: held locks and their heartbeat (lease.h) */
    struct pipeline_forwarder fwd;
    pthread_mutex_t routes_mu;  /* guards <routes> while a request takes its reference */
    struct route_table *routes; /* owned reference: what new requests are matched against */
    uint64_t min_lock_ttl_ms;   /* the heartbeat was set up for locks this short */
    const char *key_prefix;     /* --key-prefix, borrowed from the configuration */
    bool enabled;               /* IDEMPOTENCY_ENABLED */
    atomic_uint late;           /* exchanges going on after their client got its 504 */
};

/* A request as the pipeline knows it: the request the front end handed over,
 * what admission decided of it, and the run's own state. The front end holds
 * a handle on it and sees none of it. */
struct pipeline_req {
    struct request *rq;         /* owned: what the front end read */
    struct pipeline_answer out; /* the answer, until it is handed over */
    bool decided;               /* the answer was handed over */
    struct pipeline *pl;
    /* The front end's reference, and a late exchange's (SPEC §9): the last
     * one frees it. */
    atomic_int refs;
    bool late;            /* answered 504 at --upstream-timeout; its exchange goes on */
    char *late_method;    /* owned: the method, once late (the front end's copy may go) */
    const char *unknown;  /* the cause, once this request made its key unknown */
    struct admission adm; /* its route, key, fingerprint and body (admission.h) */
    struct store_token tok;
    struct lease *lease;            /* reference while the lock is held */
    struct upstream_request up_req; /* what is forwarded: borrows from this request */
    uint64_t acquire_sent_ms;
    uint64_t start_us;         /* metrics_now_us() when the headers were in */
    uint64_t store_sent_us;    /* the acquire in progress */
    uint64_t upstream_sent_us; /* when it was forwarded */
    uint64_t upstream_us;      /* what the upstream took, once <forwarded> */
    bool forwarded;
    bool running;               /* pipeline_end() ran it: counted in flight */
    struct waitlist_entry wait; /* --wait: a duplicate held until the first request ends */
    pipeline_answer_fn *answer;
    void *answer_ctx;
};

static void acquire(struct pipeline_req *r);
static void forward(struct pipeline_req *r);

/* ---- Answering ---- */

static void set_answer(struct pipeline_req *r, struct record *rec, enum outcome o,
                       const char *replayed)
{
    record_unref(r->out.rec);
    r->out.rec = rec;
    r->out.outcome = o;
    r->out.replayed = replayed;
    r->out.replay_header = r->adm.route->settings.replay_header;
}

/* Sets a problem answer. A record that cannot be built (OOM) leaves no answer:
 * the front end then drops the connection. */
static void set_problem(struct pipeline_req *r, enum problem p, enum outcome o, const char *detail)
{
    set_answer(r, problem_new(p, r->adm.route->errors, detail), o, NULL);
}

/* Counts <r> in the metrics and writes its access line. */
static void account(struct pipeline *pl, struct pipeline_req *r)
{
    const struct route *rt = r->adm.route;
    uint64_t total_us = metrics_now_us() - r->start_us;
    /* the key as sent, or the one derived (which /keys finds) */
    struct span key = r->adm.key.sent.base ? r->adm.key.sent : keysource_sent(&rt->key, r->rq);

    (void)pl;
    metrics_request(rt->metrics_id, r->out.outcome, total_us, r->forwarded, r->upstream_us);
    if (!log_enabled(LOG_LEVEL_INFO))
        return;
    log_access(&(struct log_access){
        .route = rt->name,
        .method = r->rq->method,
        .target = r->rq->target,
        .key = key,
        .status = r->out.rec ? r->out.rec->status : 0,
        .outcome = outcome_label(r->out.outcome),
        .has_upstream = r->forwarded,
        .upstream_us = r->upstream_us,
        .total_us = total_us,
        .bytes = r->out.rec ? r->out.rec->body.len : 0,
        .unknown = r->unknown,
    });
}

/* Hands <r> back to the front end with its answer, counted and logged first:
 * the client may read /metrics as soon as it has the answer. The one exit. */
static void finish(struct pipeline_req *r)
{
    struct pipeline_answer a = r->out;

    assert(!r->decided);
    account(r->pl, r);
    if (r->running)
        metrics_inflight_add(-1);
    r->decided = true;
    r->out.rec = NULL; /* the front end's reference now */
    r->answer(r->answer_ctx, &a);
}

/* Answers the refusal <ref> of admission: a malformed request is logged first
 * (what the client sent escaped there). */
static void refuse(struct pipeline_req *r, const struct admission_refusal *ref)
{
    const struct request *in = r->rq;

    if (ref->why)
        log_info("refused %.*s %.*s from %s: %s (%u)",
                 (int)(in->method.len < 64 ? in->method.len : 64),
                 in->method.base ? in->method.base : "",
                 (int)(in->target.len < 1024 ? in->target.len : 1024),
                 in->target.base ? in->target.base : "", in->client_ip, ref->why, ref->status);
    set_problem(r, ref->problem, ref->outcome, ref->detail[0] ? ref->detail : NULL);
    finish(r);
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
    pthread_mutex_lock(&pl->routes_mu);
    t = route_table_ref(pl->routes); /* admission takes it over */
    pthread_mutex_unlock(&pl->routes_mu);
    if (admission_head(&r->adm, t, rq, pl->key_prefix, pl->enabled, &ref))
        refuse(r, &ref);
    return r;
}

void pipeline_body(struct pipeline_req *r, const char *p, size_t n)
{
    struct admission_refusal ref;

    if (!r->decided && admission_body(&r->adm, p, n, &ref))
        refuse(r, &ref); /* and what comes after is discarded */
}

/* ---- 3. The run: the lock first, when the key is enforced ---- */

void pipeline_end(struct pipeline_req *r)
{
    struct admission_refusal ref;

    if (r->decided)
        return;
    r->running = true;
    metrics_inflight_add(1);
    if (admission_end(&r->adm, r->rq, &ref))
        refuse(r, &ref);
    else if (!r->adm.enforced)
        forward(r); /* passthrough: no key, none required, or not enforced */
    else
        acquire(r);
}

/* The 503 of a store that failed with <err>. */
static void set_store_problem(struct pipeline_req *r, int err)
{
    set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                err == -ENOSPC ? "The idempotency store is full of requests in flight; retry later."
                               : "The idempotency store is not answering; retry later.");
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
            },
            on_acquired, r);
    if (err < 0) {
        metrics_store_error();
        set_store_problem(r, err);
        finish(r);
    }
}

static bool wait_hold(struct pipeline_req *r, uint64_t now);
static void on_confirmed(void *ctx, int err);
static void lease_end(struct pipeline_req *r, struct record *rec);

/* Counts and logs that <r> made its key's outcome unknown for <cause>. */
static void became_unknown(struct pipeline_req *r, enum store_cause cause)
{
    const struct request *in = r->rq;

    r->unknown = store_cause_name(cause);
    metrics_unknown_outcome(r->adm.route->metrics_id, cause);
    log_warn("key %s: outcome unknown (%s): %.*s %.*s of route %s may have run upstream and its "
             "answer was lost; duplicates get 502 idempotency_outcome_unknown until an operator "
             "resolves it (/keys)",
             r->adm.store_key, r->unknown, (int)(in->method.len < 64 ? in->method.len : 64),
             in->method.base, (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base,
             r->adm.route->name);
}

/* The answer to a request whose key's outcome is unknown (SPEC §9). */
static void answer_unknown(struct pipeline_req *r, const struct store_result *res)
{
    if (res->became)
        became_unknown(r, res->cause);
    set_problem(r, PROBLEM_OUTCOME_UNKNOWN, OUTCOME_UNKNOWN,
                "The original request with this Idempotency-Key may have been processed, but its "
                "answer was lost; do not retry with this key. Check whether it took effect; an "
                "operator can then resolve the key.");
}

static void on_acquired(void *ctx, int err, const struct store_result *res)
{
    struct pipeline_req *r = ctx;
    struct pipeline *pl = r->pl;
    const struct route_settings *rs = &r->adm.route->settings;
    uint64_t now = now_ms();

    metrics_store_call(METRICS_STORE_ACQUIRE, metrics_now_us() - r->store_sent_us);
    if (err == 0 && res->status == STORE_ACQUIRED) {
        r->lease =
            lease_start(pl->leases, r->adm.store_key, &r->tok, r->acquire_sent_ms, rs->lock_ttl_ms);
        if (!r->lease) {
            set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR, "Out of memory.");
            finish(r); /* the lock expires within --lock-ttl */
            return;
        }
        /* A holder that stalled past half its lock TTL confirms the lock first. */
        if (now - r->acquire_sent_ms > rs->lock_ttl_ms / 2) {
            lease_confirm(r->lease, on_confirmed, r);
            return;
        }
        forward(r);
        return;
    }
    if (err == 0 && res->status == STORE_IN_FLIGHT && wait_hold(r, now)) {
        return; /* held: the first request's end, or the deadline, resumes it */
    } else if (err == 0 && res->status == STORE_IN_FLIGHT) {
        set_problem(r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
                    "A request with this Idempotency-Key is still being processed; retry later.");
    } else if (err == 0 && res->status == STORE_MISMATCH) {
        set_problem(r, PROBLEM_KEY_MISMATCH, OUTCOME_MISMATCH,
                    "This Idempotency-Key was used with a different method, target or body.");
    } else if (err == 0 && res->status == STORE_UNKNOWN) {
        answer_unknown(r, res);
    } else if (err == 0 && res->status == STORE_COMPLETED && res->rec->too_large) {
        set_problem(r, PROBLEM_RESPONSE_TOO_LARGE, OUTCOME_REPLAYED,
                    "The request was executed, but its response was larger than --max-response, "
                    "so it cannot be replayed; it was not executed again.");
    } else if (err == 0 && res->status == STORE_COMPLETED) {
        set_answer(r, record_ref(res->rec), OUTCOME_REPLAYED, "true");
    } else {
        metrics_store_error();
        log_warn("store acquire of key %s failed: %s", r->adm.store_key,
                 err < 0 ? store_strerror(err) : "unexpected answer");
        if (r->adm.routes->on_store_error == CONFIG_ON_STORE_ERROR_PASSTHROUGH) {
            r->out.outcome = OUTCOME_STORE_ERROR;
            forward(r); /* unprotected, as configured */
            return;
        }
        set_store_problem(r, err);
    }
    finish(r);
}

/* The lock of a holder that stalled is confirmed (or lost) before it runs. */
static void on_confirmed(void *ctx, int err)
{
    struct pipeline_req *r = ctx;

    if (err == 0) {
        forward(r);
        return;
    }
    if (err == -ESTALE)
        set_problem(r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
                    "This request stalled and its lock passed to another request.");
    else
        set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                    "The idempotency store could not confirm the lock.");
    /* Not forwarded: given back, or its lapsed lease would look like a lost
     * holder's. Stale, the key may have been found unknown with this token
     * (SPEC §9): nothing ran, so that is given back too; another holder's
     * lock is left alone (the release is fenced). */
    lease_end(r, NULL);
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
    set_problem(r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
                "A request with this Idempotency-Key is still being processed (waited "
                "--wait); retry later.");
    finish(r);
}

/* ---- 5. Forwarding ---- */

static void on_upstream(void *ctx, int err, struct record *rec);
static void on_overdue(void *ctx);

static void forward(struct pipeline_req *r)
{
    const struct request *in = r->rq;
    int err;

    r->up_req = (struct upstream_request){
        .method = in->method,
        .target = r->adm.fwd_target,
        .host = r->adm.fwd_host,
        .headers = in->headers,
        .nheaders = in->nheaders,
        .body = buf_span(&r->adm.body),
        .client_ip = in->client_ip,
        .proto = "http",
        .overdue = r->lease ? on_overdue : NULL, /* a keyed request's answer may come late */
    };
    r->upstream_sent_us = metrics_now_us();
    err = r->pl->fwd.submit(r->pl->fwd.ctx, in->loop, &r->up_req, on_upstream, r);
    if (err < 0)
        on_upstream(r, err, NULL);
}

/* ---- 6. The upstream's answer: stored, or the lock released ---- */

static void preq_unref(struct pipeline_req *r);

/* The finishing chain's first attempt has reported back: <r> is answered,
 * or, when its client got a 504 already, its late exchange is over. */
static void on_lease_finished(void *ctx)
{
    struct pipeline_req *r = ctx;

    if (!r->late) {
        finish(r);
        return;
    }
    atomic_fetch_sub_explicit(&r->pl->late, 1, memory_order_release);
    preq_unref(r);
}

/* Completes the lock of <r> with <rec> (a reference the lease takes over), or
 * releases it when <rec> is NULL; <r> is answered once the first attempt
 * has reported back (store failures are retried without it: lease.h). */
static void lease_end(struct pipeline_req *r, struct record *rec)
{
    struct lease *l = r->lease;

    r->lease = NULL; /* the request's reference now belongs to the finishing chain */
    lease_finish(l, rec, r->adm.ttl_ms, on_lease_finished, r);
}

/* The request of <r> may have run upstream and its answer is lost, for
 * <cause>: the key becomes unknown (refuse), or is released to run again
 * (retry). */
static void lease_end_unknown(struct pipeline_req *r, enum store_cause cause)
{
    const struct route_settings *rs = &r->adm.route->settings;
    struct lease *l = r->lease;

    if (rs->on_unknown == CONFIG_ON_UNKNOWN_RETRY) {
        lease_end(r, NULL);
        return;
    }
    became_unknown(r, cause);
    r->lease = NULL;
    lease_finish_unknown(l, cause,
                         &(struct store_about){ .route = span_from_cstr(r->adm.route->name),
                                                .method = r->rq->method,
                                                .target = r->adm.fwd_target },
                         r->adm.ttl_ms, on_lease_finished, r);
}

/* --upstream-timeout passed while a keyed request's exchange goes on (for
 * --upstream-late-timeout): its client gets its 504 now, and the exchange,
 * under the same heartbeat-held lock, may still store a late answer. On the
 * loop thread, as on_upstream(). */
static void on_overdue(void *ctx)
{
    struct pipeline_req *r = ctx;
    const struct request *in = r->rq;

    r->forwarded = true;
    r->upstream_us = metrics_now_us() - r->upstream_sent_us;
    log_info("upstream %.*s %.*s: no answer within --upstream-timeout; answered 504, the exchange "
             "goes on for --upstream-late-timeout",
             (int)in->method.len, in->method.base,
             (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base);
    set_problem(r, PROBLEM_UPSTREAM_TIMEOUT, OUTCOME_UPSTREAM_ERROR, NULL);
    /* The method is the front end's memory, which goes with the client. */
    r->late_method = strndup(in->method.base, in->method.len);
    r->rq->method = span_from_cstr(r->late_method ? r->late_method : "");
    r->late = true;
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->pl->late, 1, memory_order_relaxed);
    finish(r);
}

/* The end of a late exchange: its client has its 504 (and may be gone, with
 * the front end's part of <r>): the lock is completed, released or made
 * unknown, and nothing is answered. */
static void late_end(struct pipeline_req *r, int err, struct record *rec)
{
    const struct route_settings *rs = &r->adm.route->settings;

    log_info("key %s: the late exchange ended: %s", r->adm.store_key,
             err == 0            ? "an answer"
             : err == -ETIMEDOUT ? "no answer within --upstream-late-timeout either"
                                 : strerror(-err));
    if (err == -E2BIG) {
        lease_end(r, record_new_too_large(502)); /* it did answer */
    } else if (err < 0 && upstream_err_maybe_sent(err)) {
        lease_end_unknown(r, err == -ECONNRESET ? STORE_CAUSE_UPSTREAM_RESET
                                                : STORE_CAUSE_UPSTREAM_TIMEOUT);
    } else if (err < 0 || !config_is_cacheable(rs, rec->status)) {
        lease_end(r, NULL);
    } else {
        record_ensure_date(rec);
        if (rec->body.len > rs->max_response_bytes)
            lease_end(r, record_new_too_large(rec->status));
        else
            lease_end(r, record_ref(rec));
    }
    record_unref(rec);
}

static void on_upstream(void *ctx, int err, struct record *rec)
{
    struct pipeline_req *r = ctx;
    const struct request *in = r->rq;
    const struct route_settings *rs = &r->adm.route->settings;

    if (r->late) {
        late_end(r, err, rec);
        return;
    }
    r->forwarded = true;
    r->upstream_us = metrics_now_us() - r->upstream_sent_us;
    if (err < 0) {
        enum problem p = err == -ETIMEDOUT || err == -ENOTCONN ? PROBLEM_UPSTREAM_TIMEOUT
                         : err == -E2BIG                       ? PROBLEM_RESPONSE_TOO_LARGE
                                                               : PROBLEM_UPSTREAM_UNAVAILABLE;

        log_warn("upstream %.*s %.*s failed: %s%s", (int)in->method.len, in->method.base,
                 (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base,
                 err == -E2BIG ? "response larger than the proxy can hold" : strerror(-err),
                 upstream_err_maybe_sent(err) ? " (after the request may have reached it)" : "");
        set_problem(r, p, OUTCOME_UPSTREAM_ERROR, NULL);
        if (!r->lease) {
            finish(r);
            return;
        }
        if (err == -E2BIG) {
            /* The upstream did answer: it must never run twice. */
            r->out.replayed = "false";
            lease_end(r, record_new_too_large(502));
            return;
        }
        if (upstream_err_maybe_sent(err)) {
            lease_end_unknown(r, err == -ETIMEDOUT ? STORE_CAUSE_UPSTREAM_TIMEOUT
                                                   : STORE_CAUSE_UPSTREAM_RESET);
            return;
        }
        lease_end(r, NULL); /* nothing reached the upstream: a retry may run */
        return;
    }
    if (!r->lease) {
        set_answer(r, rec, r->out.outcome, NULL); /* passthrough, or store_error */
        finish(r);
        return;
    }
    set_answer(r, rec, OUTCOME_EXECUTED, "false");
    if (!config_is_cacheable(rs, rec->status)) {
        lease_end(r, NULL);
        return;
    }
    record_ensure_date(rec);
    if (rec->body.len > rs->max_response_bytes) {
        lease_end(r, record_new_too_large(rec->status)); /* a NULL marker (OOM) releases instead */
        return;
    }
    lease_end(r, record_ref(rec));
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
    pl->st = st;
    pl->pool = pool;
    pl->fwd = *fwd;
    pl->min_lock_ttl_ms = route_table_min_lock_ttl(t);
    /* The --wait subscriber only when a route waits (an ACL may forbid it). */
    if (st && wait_ms > 0) {
        err = waitlist_new(pool, wait_ms, on_wait_retry, on_wait_expired, pl, &pl->waits);
        if (err == 0)
            err = store_set_notify(st, waitlist_notify, pl->waits);
    }
    if (st && err == 0)
        err = leases_new(st, pool, pl->min_lock_ttl_ms, &pl->leases);
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
}

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
    route_table_unref(pl->routes);
    pthread_mutex_destroy(&pl->routes_mu);
    free(pl);
}

int pipeline_set_routes(struct pipeline *pl, struct route_table *t, char *why, size_t whylen)
{
    struct route_table *old;
    size_t used = 0;

    why[0] = '\0';
    for (size_t i = 0; i <= t->nroutes && used < whylen; i++) {
        const struct route *rt = &t->routes[i];
        const char *sep = used ? "\n" : "";

        if (rt->settings.wait_ms > 0 && !pl->waits && pl->st)
            used += (size_t)snprintf(why + used, whylen - used,
                                     "%sroute %s: wait needs a restart (no route waited at start, "
                                     "so the notifications of --wait are not subscribed to); it "
                                     "answers 409 at once until then",
                                     sep, rt->name);
        else if (rt->settings.lock_ttl_ms < pl->min_lock_ttl_ms)
            used += (size_t)snprintf(why + used, whylen - used,
                                     "%sroute %s: a lock-ttl shorter than at start (%llu ms) needs "
                                     "a restart for the heartbeat to keep up; the lock may lapse "
                                     "under a long request until then",
                                     sep, rt->name, (unsigned long long)pl->min_lock_ttl_ms);
    }
    pthread_mutex_lock(&pl->routes_mu);
    old = pl->routes;
    pl->routes = route_table_ref(t);
    pthread_mutex_unlock(&pl->routes_mu);
    route_table_unref(old); /* the requests that began under it keep their own references */
    return why[0] ? 1 : 0;
}

/* ---- The front end's reference ---- */

void pipeline_req_free(struct pipeline_req *r)
{
    if (r)
        preq_unref(r);
}

/* Drops a reference to <r>: the front end's (pipeline_req_free()) or its late
 * exchange's; the last frees it. A late exchange reads none of the front
 * end's memory (the header spans) once its client was answered. */
static void preq_unref(struct pipeline_req *r)
{
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    request_free(r->rq);
    free(r->late_method);
    admission_done(&r->adm);
    lease_abandon(r->lease); /* freed unfinished: no endless heartbeat */
    record_unref(r->out.rec);
    free(r);
}
