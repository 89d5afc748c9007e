/* SPDX-License-Identifier: MIT */
/* Held duplicates for --wait: lists by hash of the store key, under one lock
 * (not on the path of other requests), and a deadline job that runs only
 * while something is held. Entries leave the lists under the lock and are
 * called back after it is released. */
#include "idemproxy/waitlist.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "idemproxy/worker.h"

#define WAITLIST_BUCKETS 256

struct waitlist {
    struct worker_pool *pool; /* borrowed */
    uint64_t wait_ms;
    waitlist_fn *retry, *expire;
    void *ctx;
    atomic_bool stopping;
    atomic_bool draining; /* SIGTERM: no entry is held any more */
    pthread_mutex_t mu;   /* guards the three below */
    struct waitlist_entry *buckets[WAITLIST_BUCKETS];
    unsigned n;
    bool ticking; /* the deadline job is queued */
};

static unsigned bucket_of(struct span key)
{
    uint32_t h = 2166136261u; /* FNV-1a: only this process's own keys are listed here */

    for (size_t i = 0; i < key.len; i++)
        h = (h ^ (unsigned char)key.base[i]) * 16777619u;
    return h % WAITLIST_BUCKETS;
}

static bool key_is(const struct waitlist_entry *e, struct span key)
{
    return strlen(e->key) == key.len && memcmp(e->key, key.base, key.len) == 0;
}

/* Unlinks <e>; the caller holds the lock. */
static void unlink_entry(struct waitlist *w, struct waitlist_entry *e)
{
    struct waitlist_entry **pp = &w->buckets[bucket_of(span_from_cstr(e->key))];

    while (*pp && *pp != e)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = e->next;
        w->n--;
    }
    e->next = NULL;
}

/* Calls <fn> for each entry of the chain <e>, unlinked. */
static void call_each(struct waitlist *w, waitlist_fn *fn, struct waitlist_entry *e)
{
    while (e) {
        struct waitlist_entry *next = e->next;

        e->next = NULL;
        fn(w->ctx, e);
        e = next;
    }
}

/* Every WAITLIST_TICK_MS while entries are held: one whose wait ran out
 * expires; one not notified for WAITLIST_POLL_MS is retried (a notification
 * can be lost, e.g. with a Redis connection, or a lock expiring). */
static void tick(void *ctx)
{
    struct waitlist *w = ctx;
    struct waitlist_entry *expired = NULL, *polled = NULL;
    uint64_t now = now_ms();
    bool ending = atomic_load(&w->stopping) || atomic_load(&w->draining);

    pthread_mutex_lock(&w->mu);
    for (size_t b = 0; b < WAITLIST_BUCKETS && w->n > 0; b++) {
        struct waitlist_entry **pp = &w->buckets[b];

        while (*pp) {
            struct waitlist_entry *e = *pp;
            bool over = ending || now >= e->until_ms;

            if (!over && now < e->poll_at_ms) {
                pp = &e->next;
                continue;
            }
            *pp = e->next;
            w->n--;
            e->next = over ? expired : polled;
            *(over ? &expired : &polled) = e;
        }
    }
    w->ticking = w->n > 0 && worker_submit_after(w->pool, WAITLIST_TICK_MS, tick, w) == 0;
    pthread_mutex_unlock(&w->mu);
    call_each(w, w->expire, expired);
    call_each(w, w->retry, polled);
}

int waitlist_new(struct worker_pool *pool, uint64_t wait_ms, waitlist_fn *retry,
                 waitlist_fn *expire, void *ctx, struct waitlist **ret)
{
    struct waitlist *w = calloc(1, sizeof(*w));

    if (!w)
        return -ENOMEM;
    w->pool = pool;
    w->wait_ms = wait_ms;
    w->retry = retry;
    w->expire = expire;
    w->ctx = ctx;
    pthread_mutex_init(&w->mu, NULL);
    *ret = w;
    return 0;
}

bool waitlist_hold(struct waitlist *w, struct waitlist_entry *e, uint64_t now)
{
    bool tick_now = false;
    unsigned b;

    if (atomic_load(&w->stopping) || atomic_load(&w->draining))
        return false;
    if (e->until_ms == 0)
        e->until_ms = now + w->wait_ms;
    if (now >= e->until_ms)
        return false;
    e->poll_at_ms = now + WAITLIST_POLL_MS;
    b = bucket_of(span_from_cstr(e->key));
    pthread_mutex_lock(&w->mu);
    e->next = w->buckets[b];
    w->buckets[b] = e;
    w->n++;
    if (!w->ticking)
        tick_now = w->ticking = true;
    pthread_mutex_unlock(&w->mu);
    if (tick_now && worker_submit_after(w->pool, WAITLIST_TICK_MS, tick, w) < 0) {
        pthread_mutex_lock(&w->mu);
        w->ticking = false;
        unlink_entry(w, e);
        pthread_mutex_unlock(&w->mu);
        return false; /* the pool is stopping */
    }
    return true;
}

void waitlist_notify(void *ctx, struct span key)
{
    struct waitlist *w = ctx;
    struct waitlist_entry *woken = NULL, **pp;

    /* Stopping: the pool may be gone, and every held entry was answered. */
    if (atomic_load(&w->stopping))
        return;
    pthread_mutex_lock(&w->mu);
    pp = w->n > 0 ? &w->buckets[bucket_of(key)] : NULL;
    while (pp && *pp) {
        struct waitlist_entry *e = *pp;

        if (key_is(e, key)) {
            *pp = e->next;
            w->n--;
            e->next = woken;
            woken = e;
        } else {
            pp = &e->next;
        }
    }
    pthread_mutex_unlock(&w->mu);
    call_each(w, w->retry, woken);
}

void waitlist_quiesce(struct waitlist *w)
{
    if (w)
        atomic_store(&w->draining, true);
}

void waitlist_stop(struct waitlist *w)
{
    if (w)
        atomic_store(&w->stopping, true);
}

void waitlist_free(struct waitlist *w)
{
    if (!w)
        return;
    pthread_mutex_destroy(&w->mu);
    free(w);
}
