/* SPDX-License-Identifier: MIT */
/* Held locks: one periodic job extends every lease that is due, so a request
 * costs the pool nothing unless it runs longer than a third of --lock-ttl;
 * the finishing chain (complete or release, retried with backoff) runs on
 * the store's callbacks and the worker pool. A lease is refcounted: its
 * holder, the heartbeat list, a heartbeat extend in progress and the
 * finishing chain each hold a reference. */
#include "idemproxy/lease.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "idemproxy/list.h"
#include "idemproxy/log.h"
#include "idemproxy/metrics.h"
#include "idemproxy/record.h"
#include "idemproxy/worker.h"

#define FINISH_BACKOFF_MIN_MS 50
#define FINISH_BACKOFF_MAX_MS 1000
#define BEAT_CHECK_MIN_MS 10 /* the heartbeat job's period: a quarter beat, within these */
#define BEAT_CHECK_MAX_MS 1000

struct leases {
    struct store *st;         /* borrowed */
    struct worker_pool *pool; /* borrowed */
    uint64_t lock_ttl_ms;     /* a lease's TTL when lease_start() is given none */
    atomic_bool stopping;
    pthread_mutex_t mu;         /* guards the list and the heartbeat fields of leases */
    struct list list;           /* every active struct lease, each with a reference */
    struct worker_every *beats; /* owned: the heartbeat job */
};

struct lease {
    atomic_int refs;
    struct leases *ls;
    char *key; /* owned */
    struct store_token tok;
    uint64_t lock_ttl_ms;            /* each extend takes the lock this long */
    uint64_t beat_every_ms;          /* it is extended this long after its last extend */
    atomic_bool active;              /* the heartbeat goes on while true */
    atomic_bool lost;                /* lock_lost was counted: once per lease */
    atomic_bool finishing;           /* complete or release has been sent */
    _Atomic uint64_t valid_until_ms; /* the lock cannot have lapsed before this */
    uint64_t tick_sent_ms;           /* the heartbeat's extend in progress */
    uint64_t tick_sent_us;
    /* Under ls->mu: */
    struct list_node beat;  /* in ls->list while listed */
    bool extending;         /* an extend is in progress */
    uint64_t next_beat_ms;  /* the next extend is due then */
    struct lease *due_next; /* the heartbeat job's own list */
    /* The confirming extend only: */
    lease_confirm_fn *confirm_done;
    void *confirm_ctx;
    uint64_t confirm_sent_ms, confirm_sent_us;
    /* The finishing chain only: */
    uint64_t attempt_sent_us;
    struct record *rec;     /* owned reference to complete with; NULL: release, or unknown */
    struct store_link link; /* complete: the resource link (in <link_buf>) and tombstone */
    char *link_buf;         /* owned; NULL: no resource */
    bool linked;            /* complete: with <link> */
    bool unknown;           /* mark the key unknown (doc/guarantees.md, Unknown outcomes) instead */
    enum store_cause cause;
    struct store_about about; /* unknown: its parts, in <about_buf> */
    char *about_buf;          /* owned */
    uint64_t ttl_ms;
    uint64_t backoff_ms;
    lease_finish_fn *finish_done; /* told after the first attempt, then NULL */
    void *finish_ctx;
};

static struct lease *lease_ref(struct lease *l)
{
    atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
    return l;
}

static void lease_unref(struct lease *l)
{
    if (!l || atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) != 1)
        return;
    record_unref(l->rec);
    free(l->about_buf);
    free(l->link_buf);
    free(l->key);
    free(l);
}

/* A store that fails every finishing call logs the first, then a count. */
static struct log_burst finish_failures = LOG_BURST_INIT("failed finishing calls, retried");
/* What the finishing chain of <l> does, for the log. */
static const char *finish_name(const struct lease *l)
{
    return l->rec ? "complete" : l->unknown ? "unknown" : "release";
}

/* Ends the heartbeat of <l>, dropping the list's reference; the caller holds
 * one of its own. */
static void lease_deactivate(struct lease *l)
{
    struct leases *ls = l->ls;
    bool listed;

    atomic_store(&l->active, false);
    pthread_mutex_lock(&ls->mu);
    listed = list_is_linked(&l->beat);
    list_remove(&l->beat);
    pthread_mutex_unlock(&ls->mu);
    if (listed)
        lease_unref(l);
}

static void lock_lost(struct lease *l, const char *when)
{
    if (atomic_exchange(&l->lost, true))
        return;
    metrics_lock_lost();
    log_warn("lock_lost: key %s: no longer this request's (%s): its lease ran out and another "
             "request took the key or found its outcome unknown; nothing was overwritten",
             l->key, when);
}

/* ---- the heartbeat ---- */

/* The heartbeat's extend of <l> has reported back: the next one is due a
 * beat later. Drops the extend's reference. */
static void beat_done(struct lease *l)
{
    struct leases *ls = l->ls;

    pthread_mutex_lock(&ls->mu);
    l->extending = false;
    l->next_beat_ms = now_ms() + l->beat_every_ms;
    pthread_mutex_unlock(&ls->mu);
    lease_unref(l);
}

static void on_extended(void *ctx, int err, const struct store_result *res)
{
    struct lease *l = ctx;

    (void)res;
    metrics_store_call(METRICS_STORE_EXTEND, metrics_now_us() - l->tick_sent_us);
    if (err == 0) {
        atomic_store(&l->valid_until_ms, l->tick_sent_ms + l->lock_ttl_ms);
    } else if (err == -ESTALE) {
        lease_deactivate(l);
        /* Once finishing, our own complete or release may have landed first:
         * that is no loss. Its own answer says whether the lock was lost. */
        if (!atomic_load(&l->finishing))
            lock_lost(l, "heartbeat");
    } else {
        metrics_store_error();
    }
    beat_done(l);
}

/* Sends the heartbeat's extend of <l>, under a reference of its own. */
static void beat(struct lease *l)
{
    struct leases *ls = l->ls;

    l->tick_sent_ms = now_ms();
    l->tick_sent_us = metrics_now_us();
    if (store_extend(ls->st, span_from_cstr(l->key), &l->tok, l->lock_ttl_ms, on_extended, l) < 0)
        beat_done(l);
}

/* The periodic heartbeat job: extends every active lease that is due. */
static void heartbeat(void *ctx)
{
    struct leases *ls = ctx;
    struct lease *due = NULL, *l;
    struct list_node *n, *tmp;
    uint64_t now = now_ms();

    if (atomic_load(&ls->stopping))
        return;
    pthread_mutex_lock(&ls->mu);
    list_for_each_safe(&ls->list, n, tmp)
    {
        l = list_entry(n, struct lease, beat);
        if (!l->extending && now >= l->next_beat_ms && atomic_load(&l->active)) {
            l->extending = true;
            l->due_next = due;
            due = lease_ref(l);
        }
    }
    pthread_mutex_unlock(&ls->mu);
    while ((l = due)) {
        due = l->due_next;
        beat(l);
    }
}

int leases_new(struct store *st, struct worker_pool *pool, uint64_t lock_ttl_ms,
               struct leases **ret)
{
    struct leases *ls = calloc(1, sizeof(*ls));
    uint64_t check_ms;
    int err;

    if (!ls)
        return -ENOMEM;
    ls->st = st;
    ls->pool = pool;
    ls->lock_ttl_ms = lock_ttl_ms;
    check_ms = lock_ttl_ms / 12; /* a quarter of the shortest beat */
    if (check_ms < BEAT_CHECK_MIN_MS)
        check_ms = BEAT_CHECK_MIN_MS;
    if (check_ms > BEAT_CHECK_MAX_MS)
        check_ms = BEAT_CHECK_MAX_MS;
    pthread_mutex_init(&ls->mu, NULL);
    list_init(&ls->list);
    err = worker_every_start(pool, check_ms, check_ms, heartbeat, ls, &ls->beats);
    if (err < 0) {
        leases_free(ls);
        return err;
    }
    *ret = ls;
    return 0;
}

void leases_stop(struct leases *ls)
{
    if (!ls)
        return;
    atomic_store(&ls->stopping, true);
    worker_every_stop(ls->beats); /* waits for a heartbeat in progress */
    ls->beats = NULL;
}

void leases_free(struct leases *ls)
{
    if (!ls)
        return;
    leases_stop(ls);
    pthread_mutex_destroy(&ls->mu);
    free(ls);
}

/* ---- a lease's life ---- */

struct lease *lease_start(struct leases *ls, const char *key, const struct store_token *tok,
                          uint64_t acquired_at_ms, uint64_t lock_ttl_ms)
{
    struct lease *l = calloc(1, sizeof(*l));

    if (!l)
        return NULL;
    l->key = strdup(key);
    if (!l->key) {
        free(l);
        return NULL;
    }
    atomic_init(&l->refs, 2); /* the holder's and the heartbeat list's */
    l->ls = ls;
    l->tok = *tok;
    l->lock_ttl_ms = lock_ttl_ms ? lock_ttl_ms : ls->lock_ttl_ms;
    l->beat_every_ms = l->lock_ttl_ms / 3 ? l->lock_ttl_ms / 3 : 1;
    atomic_init(&l->active, true);
    atomic_init(&l->finishing, false);
    atomic_init(&l->valid_until_ms, acquired_at_ms + l->lock_ttl_ms);
    l->next_beat_ms = acquired_at_ms + l->beat_every_ms;
    pthread_mutex_lock(&ls->mu);
    list_append(&ls->list, &l->beat);
    pthread_mutex_unlock(&ls->mu);
    return l;
}

uint64_t lease_valid_until_ms(const struct lease *l) { return atomic_load(&l->valid_until_ms); }

static void on_confirmed(void *ctx, int err, const struct store_result *res)
{
    struct lease *l = ctx;

    (void)res;
    metrics_store_call(METRICS_STORE_EXTEND, metrics_now_us() - l->confirm_sent_us);
    if (err == 0) {
        atomic_store(&l->valid_until_ms, l->confirm_sent_ms + l->lock_ttl_ms);
    } else if (err == -ESTALE) {
        lease_deactivate(l);
        lock_lost(l, "before forwarding");
    } else {
        metrics_store_error();
        lease_deactivate(l); /* not forwarded: the lock expires within its TTL */
    }
    l->confirm_done(l->confirm_ctx, err);
}

void lease_confirm(struct lease *l, lease_confirm_fn *done, void *ctx)
{
    l->confirm_done = done;
    l->confirm_ctx = ctx;
    l->confirm_sent_ms = now_ms();
    l->confirm_sent_us = metrics_now_us();
    if (store_extend(l->ls->st, span_from_cstr(l->key), &l->tok, l->lock_ttl_ms, on_confirmed, l) <
        0)
        on_confirmed(l, -ECONNRESET, NULL);
}

static void attempt(void *ctx);

/* Tells the holder, once: its answer need not wait for retries. */
static void finish_told(struct lease *l)
{
    lease_finish_fn *done = l->finish_done;

    l->finish_done = NULL;
    if (done)
        done(l->finish_ctx);
}

static void on_finished(void *ctx, int err, const struct store_result *res)
{
    struct lease *l = ctx;
    struct leases *ls = l->ls;

    (void)res;
    metrics_store_call(l->rec       ? METRICS_STORE_COMPLETE
                       : l->unknown ? METRICS_STORE_UNKNOWN
                                    : METRICS_STORE_RELEASE,
                       metrics_now_us() - l->attempt_sent_us);
    if (err == -E2BIG && l->rec && !l->rec->too_large) {
        /* The store can never hold this response (the memory store takes
         * none over half its budget): keep the marker instead, so it is still
         * never run twice. */
        struct record *marker = record_new_too_large(l->rec->status);

        if (marker) {
            log_warn("key %s: the response (%zu bytes) is larger than the store can hold; "
                     "duplicates get 502 response_too_large",
                     l->key, l->rec->body.len);
            record_unref(l->rec);
            l->rec = marker;
            attempt(l);
            return;
        }
    }
    if (err == -ESTALE)
        lock_lost(l, finish_name(l));
    if (err < 0 && err != -ESTALE) {
        metrics_store_error();
        if (!atomic_load(&ls->stopping) && now_ms() < atomic_load(&l->valid_until_ms)) {
            uint64_t delay = l->backoff_ms;

            /* Retrying is safe: the call carries the token. The heartbeat keeps
             * the lock alive meanwhile; the client need not wait for it. */
            char kind[160];

            snprintf(kind, sizeof(kind), "store %s: %s", finish_name(l), store_strerror(err));
            if (log_enabled(LOG_LEVEL_WARN) && log_burst_admit(&finish_failures, kind))
                log_warn("store %s of key %s failed (%s); retrying in %llu ms", finish_name(l),
                         l->key, store_strerror(err), (unsigned long long)delay);
            finish_told(l);
            /* The next backoff is set before the retry is queued: it may run, and
             * call back on another thread, before worker_submit_after() returns. */
            l->backoff_ms = delay * 2 > FINISH_BACKOFF_MAX_MS ? FINISH_BACKOFF_MAX_MS : delay * 2;
            if (worker_submit_after(ls->pool, delay, attempt, l) == 0)
                return;
        }
        log_error("store %s of key %s failed (%s); giving up: the lock's lease runs out within "
                  "--lock-ttl",
                  finish_name(l), l->key, store_strerror(err));
    }
    lease_deactivate(l);
    record_unref(l->rec);
    l->rec = NULL;
    finish_told(l);
    lease_unref(l);
}

static void attempt(void *ctx)
{
    struct lease *l = ctx;
    struct leases *ls = l->ls;
    int err;

    l->attempt_sent_us = metrics_now_us();
    if (l->rec)
        err = store_complete(ls->st, span_from_cstr(l->key), &l->tok, l->rec, l->ttl_ms,
                             l->linked ? &l->link : NULL, on_finished, l);
    else if (l->unknown)
        err = store_unknown(ls->st, span_from_cstr(l->key), &l->tok, l->cause, &l->about, l->ttl_ms,
                            on_finished, l);
    else
        err = store_release(ls->st, span_from_cstr(l->key), &l->tok, on_finished, l);
    if (err < 0)
        on_finished(l, err, NULL);
}

void lease_finish(struct lease *l, struct record *rec, uint64_t ttl_ms,
                  const struct store_link *link, lease_finish_fn *done, void *ctx)
{
    atomic_store(&l->finishing, true);
    if (rec && link) {
        l->linked = true;
        l->link = *link;
        l->link.resource = (struct span){ NULL, 0 };
        if (link->resource.len && (l->link_buf = malloc(link->resource.len))) {
            memcpy(l->link_buf, link->resource.base, link->resource.len);
            l->link.resource = (struct span){ l->link_buf, link->resource.len };
        } /* else (out of memory): no resource link, the answer is what matters */
    }
    l->rec = rec;
    l->ttl_ms = ttl_ms;
    l->backoff_ms = FINISH_BACKOFF_MIN_MS;
    l->finish_done = done;
    l->finish_ctx = ctx;
    attempt(l);
}

void lease_finish_unknown(struct lease *l, enum store_cause cause, const struct store_about *about,
                          uint64_t keep_ms, lease_finish_fn *done, void *ctx)
{
    size_t n = about->route.len + about->method.len + about->target.len;

    l->unknown = true;
    l->cause = cause;
    l->about_buf = malloc(n ? n : 1);
    if (l->about_buf) {
        char *p = l->about_buf;
        const struct span *from[] = { &about->route, &about->method, &about->target };
        struct span *to[] = { &l->about.route, &l->about.method, &l->about.target };

        for (size_t i = 0; i < ARRAY_SIZE(from); i++) {
            if (from[i]->len)
                memcpy(p, from[i]->base, from[i]->len);
            *to[i] = (struct span){ p, from[i]->len };
            p += from[i]->len;
        }
    } /* else: no words, the state is what matters */
    lease_finish(l, NULL, keep_ms, NULL, done, ctx);
}

void lease_abandon(struct lease *l)
{
    if (!l)
        return;
    lease_deactivate(l);
    lease_unref(l);
}
