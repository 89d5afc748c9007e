/* SPDX-License-Identifier: MIT */
/* The worker pool (worker.h): jobs in order on its threads, delayed jobs in
 * due order and never early, pending delayed jobs run at free. */
#include <pthread.h>
#include <time.h>

#include "check.h"
#include "idemproxy/worker.h"

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0)
        ;
}

struct trace {
    pthread_mutex_t mu;
    int order[16];
    uint64_t at[16];
    int index[16];
    int n;
};

struct traced_job {
    struct trace *tr;
    int id;
    struct worker_pool *p; /* set: try to submit from the job, expecting -ECANCELED */
    int submit_ret;
};

static void traced_run(void *arg)
{
    struct traced_job *j = arg;
    struct trace *tr = j->tr;

    if (j->p)
        j->submit_ret = worker_submit(j->p, traced_run, j);
    pthread_mutex_lock(&tr->mu);
    tr->order[tr->n] = j->id;
    tr->at[tr->n] = now_ms();
    tr->index[tr->n] = worker_current_index();
    tr->n++;
    pthread_mutex_unlock(&tr->mu);
}

static void test_worker_runs_fifo_on_its_threads(void)
{
    struct worker_pool *p = (struct worker_pool *)&p, *keep = p;
    struct trace tr = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct traced_job jobs[8];

    CHECK_EQ_INT(worker_pool_new(0, &p), -EINVAL);
    CHECK(p == keep); /* untouched on failure */
    CHECK_EQ_INT(worker_pool_new(1, &p), 0);
    CHECK_EQ_INT(worker_pool_size(p), 1);
    CHECK_EQ_INT(worker_current_index(), -1);
    for (int i = 0; i < 8; i++) {
        jobs[i] = (struct traced_job){ .tr = &tr, .id = i };
        CHECK_EQ_INT(worker_submit(p, traced_run, &jobs[i]), 0);
    }
    worker_pool_free(p);
    CHECK_EQ_INT(tr.n, 8);
    for (int i = 0; i < tr.n; i++) {
        CHECK_EQ_INT(tr.order[i], i);
        CHECK_EQ_INT(tr.index[i], 0);
    }
}

static void test_worker_runs_delayed_jobs_in_due_order_not_early(void)
{
    static const unsigned delays[] = { 180, 60, 0, 240, 120 };
    struct worker_pool *p = NULL;
    struct trace tr = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct traced_job jobs[ARRAY_SIZE(delays)];
    uint64_t start;
    int waited;

    CHECK_EQ_INT(worker_pool_new(3, &p), 0);
    if (!p)
        return;
    CHECK_EQ_INT(worker_pool_size(p), 3);
    start = now_ms();
    for (size_t i = 0; i < ARRAY_SIZE(delays); i++) {
        jobs[i] = (struct traced_job){ .tr = &tr, .id = (int)delays[i] };
        CHECK_EQ_INT(worker_submit_after(p, delays[i], traced_run, &jobs[i]), 0);
    }
    for (waited = 0; waited < 2000; waited += 10) {
        pthread_mutex_lock(&tr.mu);
        int n = tr.n;
        pthread_mutex_unlock(&tr.mu);
        if (n == (int)ARRAY_SIZE(delays))
            break;
        sleep_ms(10);
    }
    CHECK_EQ_INT(tr.n, ARRAY_SIZE(delays));
    for (int i = 0; i < tr.n; i++) {
        CHECK(i == 0 || tr.order[i] > tr.order[i - 1]);
        CHECK(tr.at[i] >= start + (uint64_t)tr.order[i]); /* never early */
        CHECK(tr.at[i] < start + (uint64_t)tr.order[i] + 500);
        CHECK(tr.index[i] >= 0 && tr.index[i] < 3);
    }
    worker_pool_free(p);
}

static void test_worker_free_runs_pending_delayed_jobs(void)
{
    struct worker_pool *p = NULL;
    struct trace tr = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct traced_job late, later, now;
    uint64_t start;

    /* One thread, so the order is the pool's alone: with two, a delayed job
     * could finish before the ready one (seen under ThreadSanitizer). */
    CHECK_EQ_INT(worker_pool_new(1, &p), 0);
    if (!p)
        return;
    later = (struct traced_job){ .tr = &tr, .id = 2, .submit_ret = 1 };
    late = (struct traced_job){ .tr = &tr, .id = 1, .p = p, .submit_ret = 1 };
    now = (struct traced_job){ .tr = &tr, .id = 0 };
    CHECK_EQ_INT(worker_submit_after(p, 20000, traced_run, &later), 0);
    CHECK_EQ_INT(worker_submit_after(p, 10000, traced_run, &late), 0);
    CHECK_EQ_INT(worker_submit(p, traced_run, &now), 0);
    start = now_ms();
    worker_pool_free(p);
    CHECK(now_ms() - start < 1000); /* run at once, not waited for */
    CHECK_EQ_INT(tr.n, 3);
    CHECK_EQ_INT(tr.order[0], 0);
    /* The two delayed ones in due order, and a job run at shutdown cannot
     * queue more. */
    CHECK_EQ_INT(tr.order[1], 1);
    CHECK_EQ_INT(tr.order[2], 2);
    CHECK_EQ_INT(late.submit_ret, -ECANCELED);
}

struct ticks {
    pthread_mutex_t mu;
    int n;
    bool in_run; /* a run is in progress */
};

static void tick(void *arg)
{
    struct ticks *t = arg;

    pthread_mutex_lock(&t->mu);
    t->in_run = true;
    pthread_mutex_unlock(&t->mu);
    sleep_ms(5);
    pthread_mutex_lock(&t->mu);
    t->n++;
    t->in_run = false;
    pthread_mutex_unlock(&t->mu);
}

static int ticks_n(struct ticks *t)
{
    int n;

    pthread_mutex_lock(&t->mu);
    n = t->n;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* worker_every_*: repeats until stopped, never runs after stop, waits for a
 * run in progress; stopping while a run is queued leaves the job to free
 * itself (LeakSanitizer would say otherwise). */
static void test_worker_every_repeats_until_stopped(void)
{
    struct ticks t = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct worker_every *e = NULL;
    struct worker_pool *p = NULL;
    int n;

    CHECK_EQ_INT(worker_pool_new(2, &p), 0);
    if (!p)
        return;
    CHECK_EQ_INT(worker_every_start(p, 0, 10, tick, &t, &e), 0);
    for (int waited = 0; ticks_n(&t) < 5 && waited < 2000; waited += 10)
        sleep_ms(10);
    CHECK(ticks_n(&t) >= 5);
    worker_every_stop(e);
    pthread_mutex_lock(&t.mu);
    CHECK(!t.in_run); /* stop waited for the run in progress */
    n = t.n;
    pthread_mutex_unlock(&t.mu);
    sleep_ms(50);
    CHECK_EQ_INT(ticks_n(&t), n); /* and none ran after it */

    /* stopped while its first run is queued far ahead: freed by that run */
    CHECK_EQ_INT(worker_every_start(p, 60000, 10, tick, &t, &e), 0);
    worker_every_stop(e);
    worker_pool_free(p); /* runs the queued run at once: it frees the job, no tick */
    CHECK_EQ_INT(ticks_n(&t), n);
    worker_every_stop(NULL);
}

static void test_worker_every_refused_by_a_stopping_pool(void)
{
    struct worker_pool *p = NULL;
    struct worker_every *e = (struct worker_every *)&p;
    struct ticks t = { .mu = PTHREAD_MUTEX_INITIALIZER };

    CHECK_EQ_INT(worker_pool_new(1, &p), 0);
    if (!p)
        return;
    CHECK_EQ_INT(worker_every_start(p, 60000, 10, tick, &t, &e), 0);
    worker_pool_free(p); /* its queued run runs at once, then cannot queue another */
    CHECK_EQ_INT(ticks_n(&t), 1);
    worker_every_stop(e); /* not queued: freed here */
}

TEST_MAIN(test_worker_runs_fifo_on_its_threads,
          test_worker_runs_delayed_jobs_in_due_order_not_early,
          test_worker_free_runs_pending_delayed_jobs, test_worker_every_repeats_until_stopped,
          test_worker_every_refused_by_a_stopping_pool)
