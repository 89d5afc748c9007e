/* SPDX-License-Identifier: MIT */
/* A fixed set of threads sharing one queue: ready jobs in FIFO order and
 * delayed jobs in a min-heap by due time. One mutex and one condition variable
 * (on CLOCK_MONOTONIC, the clock of now_ms()) guard both. */
#include "idemproxy/worker.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>

#include "idemproxy/list.h"

struct job {
    worker_fn *fn;
    void *ctx;
    uint64_t due_ms;
    uint64_t seq;          /* equal due times run in submit order */
    struct list_node node; /* in the ready queue */
};

struct worker_thread {
    struct worker_pool *pool;
    unsigned index;
    pthread_t tid;
};

struct worker_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct list ready;    /* owned jobs, first in first out */
    struct job **delayed; /* owned min-heap of owned jobs, by (due_ms, seq) */
    size_t ndelayed, delayed_cap;
    uint64_t seq;
    bool stopping;
    unsigned nthreads;             /* threads started */
    struct worker_thread *threads; /* owned array of nthreads */
};

static _Thread_local int current_index = -1;
static _Thread_local struct worker_pool *current_pool;

static bool job_before(const struct job *a, const struct job *b)
{
    return a->due_ms < b->due_ms || (a->due_ms == b->due_ms && a->seq < b->seq);
}

static void heap_swap(struct job **h, size_t a, size_t b)
{
    struct job *t = h[a];

    h[a] = h[b];
    h[b] = t;
}

static int heap_push(struct worker_pool *p, struct job *j)
{
    size_t i;

    if (p->ndelayed == p->delayed_cap) {
        size_t cap = p->delayed_cap ? p->delayed_cap * 2 : 16;
        struct job **h = realloc(p->delayed, cap * sizeof(*h));

        if (!h)
            return -ENOMEM;
        p->delayed = h;
        p->delayed_cap = cap;
    }
    i = p->ndelayed++;
    p->delayed[i] = j;
    while (i > 0 && job_before(p->delayed[i], p->delayed[(i - 1) / 2])) {
        heap_swap(p->delayed, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    return 0;
}

static struct job *heap_pop(struct worker_pool *p)
{
    struct job *top = p->delayed[0];
    size_t i = 0;

    p->delayed[0] = p->delayed[--p->ndelayed];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, min = i;

        if (l < p->ndelayed && job_before(p->delayed[l], p->delayed[min]))
            min = l;
        if (r < p->ndelayed && job_before(p->delayed[r], p->delayed[min]))
            min = r;
        if (min == i)
            break;
        heap_swap(p->delayed, i, min);
        i = min;
    }
    return top;
}

static void ready_push(struct worker_pool *p, struct job *j) { list_append(&p->ready, &j->node); }

/* Moves the delayed jobs that are due (all of them once stopping) to the ready
 * queue, then takes the first ready job. Called with <p>->mu held. */
static struct job *next_job_locked(struct worker_pool *p)
{
    struct list_node *n;

    if (p->ndelayed) {
        uint64_t now = now_ms();

        while (p->ndelayed && (p->stopping || p->delayed[0]->due_ms <= now))
            ready_push(p, heap_pop(p));
    }
    n = list_first(&p->ready);
    if (!n)
        return NULL;
    list_remove(n);
    if (!list_is_empty(&p->ready))
        pthread_cond_signal(&p->cv); /* more ready work than this thread can take */
    return list_entry(n, struct job, node);
}

static void *worker_main(void *arg)
{
    struct worker_thread *t = arg;
    struct worker_pool *p = t->pool;

    current_index = (int)t->index;
    current_pool = p;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        struct job *j = next_job_locked(p);

        if (j) {
            pthread_mutex_unlock(&p->mu);
            j->fn(j->ctx);
            free(j);
            pthread_mutex_lock(&p->mu);
            continue;
        }
        if (p->stopping)
            break; /* next_job_locked() drained the delayed jobs too */
        if (p->ndelayed) {
            uint64_t due = p->delayed[0]->due_ms;
            struct timespec ts = { .tv_sec = (time_t)(due / 1000),
                                   .tv_nsec = (long)(due % 1000) * 1000000L };

            (void)pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        } else {
            pthread_cond_wait(&p->cv, &p->mu);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Stops and joins the started threads, frees whatever is still queued
 * without running it (only reached when start-up failed), and <p>. */
static void pool_destroy(struct worker_pool *p)
{
    struct list_node *n;

    pthread_mutex_lock(&p->mu);
    p->stopping = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i].tid, NULL);
    while ((n = list_first(&p->ready))) {
        list_remove(n);
        free(list_entry(n, struct job, node));
    }
    for (size_t i = 0; i < p->ndelayed; i++)
        free(p->delayed[i]);
    free(p->delayed);
    free(p->threads);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int worker_pool_new(unsigned nthreads, struct worker_pool **ret)
{
    struct worker_pool *p;
    pthread_condattr_t attr;
    int r;

    if (nthreads == 0 || nthreads > 1024)
        return -EINVAL;
    p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    list_init(&p->ready);
    p->threads = calloc(nthreads, sizeof(*p->threads));
    if (!p->threads) {
        free(p);
        return -ENOMEM;
    }
    if (pthread_condattr_init(&attr) != 0) {
        free(p->threads);
        free(p);
        return -ENOMEM;
    }
    r = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (r == 0)
        r = pthread_cond_init(&p->cv, &attr);
    pthread_condattr_destroy(&attr);
    if (r != 0) {
        free(p->threads);
        free(p);
        return r == ENOMEM ? -ENOMEM : -EAGAIN;
    }
    pthread_mutex_init(&p->mu, NULL);
    for (unsigned i = 0; i < nthreads; i++) {
        p->threads[i] = (struct worker_thread){ .pool = p, .index = i };
        if (pthread_create(&p->threads[i].tid, NULL, worker_main, &p->threads[i]) != 0)
            goto fail;
        p->nthreads++;
    }
    *ret = p;
    return 0;

fail:
    pool_destroy(p);
    return -EAGAIN;
}

static int submit(struct worker_pool *p, bool delayed, uint64_t delay_ms, worker_fn *fn, void *ctx)
{
    struct job *j = malloc(sizeof(*j));
    uint64_t now;
    int r = 0;

    if (!j)
        return -ENOMEM;
    now = now_ms();
    *j = (struct job){ .fn = fn,
                       .ctx = ctx,
                       .due_ms = delay_ms > UINT64_MAX - now ? UINT64_MAX : now + delay_ms };
    pthread_mutex_lock(&p->mu);
    if (p->stopping) {
        r = -ECANCELED;
        goto out;
    }
    j->seq = p->seq++;
    if (delayed) {
        r = heap_push(p, j);
        /* Only a new earliest deadline changes what a sleeping thread waits for. */
        if (r == 0 && p->delayed[0] == j)
            pthread_cond_signal(&p->cv);
    } else {
        ready_push(p, j);
        pthread_cond_signal(&p->cv);
    }
out:
    pthread_mutex_unlock(&p->mu);
    if (r < 0)
        free(j);
    return r;
}

int worker_submit(struct worker_pool *p, worker_fn *fn, void *ctx)
{
    return submit(p, false, 0, fn, ctx);
}

int worker_submit_after(struct worker_pool *p, uint64_t delay_ms, worker_fn *fn, void *ctx)
{
    return submit(p, true, delay_ms, fn, ctx);
}

int worker_current_index(void) { return current_index; }

unsigned worker_pool_size(const struct worker_pool *p) { return p->nthreads; }

void worker_pool_free(struct worker_pool *p)
{
    if (!p)
        return;
    assert(current_pool != p); /* a pool thread cannot join itself */
    pool_destroy(p);
}

/* ---- periodic jobs ---- */

/* Owned by its queued run while one is queued (so a run never touches what
 * its owner freed), by its owner otherwise. */
struct worker_every {
    pthread_mutex_t mu; /* held while <fn> runs: worker_every_stop() waits for it */
    struct worker_pool *pool;
    worker_fn *fn;
    void *ctx;
    uint64_t interval_ms;
    bool stopped;
    bool queued;
};

static void every_destroy(struct worker_every *e)
{
    pthread_mutex_destroy(&e->mu);
    free(e);
}

static void every_run(void *arg)
{
    struct worker_every *e = arg;

    pthread_mutex_lock(&e->mu);
    if (e->stopped) {
        pthread_mutex_unlock(&e->mu);
        every_destroy(e); /* stopped while queued: left to this run */
        return;
    }
    e->fn(e->ctx);
    e->queued = worker_submit_after(e->pool, e->interval_ms, every_run, e) == 0;
    pthread_mutex_unlock(&e->mu);
}

int worker_every_start(struct worker_pool *p, uint64_t first_ms, uint64_t interval_ms,
                       worker_fn *fn, void *ctx, struct worker_every **ret)
{
    struct worker_every *e = calloc(1, sizeof(*e));
    int err;

    if (!e)
        return -ENOMEM;
    e->pool = p;
    e->fn = fn;
    e->ctx = ctx;
    e->interval_ms = interval_ms;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_lock(&e->mu);
    err = worker_submit_after(p, first_ms, every_run, e);
    e->queued = err == 0;
    pthread_mutex_unlock(&e->mu);
    if (err < 0) {
        every_destroy(e);
        return err;
    }
    *ret = e;
    return 0;
}

void worker_every_stop(struct worker_every *e)
{
    bool queued;

    if (!e)
        return;
    pthread_mutex_lock(&e->mu); /* waits for a run in progress */
    e->stopped = true;
    queued = e->queued;
    pthread_mutex_unlock(&e->mu);
    if (!queued)
        every_destroy(e);
}
