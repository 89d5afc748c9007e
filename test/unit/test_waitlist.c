/* SPDX-License-Identifier: MIT */
/* The --wait list (waitlist.h): a notification retries exactly the entries
 * held for its key; an entry is retried every WAITLIST_POLL_MS without one;
 * its wait runs out once, counted from its first hold; quiescing expires all
 * held entries; a stopped list holds nothing and ignores notifications. */
#include <pthread.h>
#include <time.h>

#include "check.h"
#include "idemproxy/waitlist.h"
#include "idemproxy/worker.h"

struct seen {
    pthread_mutex_t mu;
    int retried[8], expired[8];
    struct waitlist *rehold; /* set: a retried entry is held again, as the pipeline does when
                                its key is still in flight */
};

static struct waitlist_entry entries[8];

static int index_of(struct waitlist_entry *e) { return (int)(e - entries); }

static void on_expire(void *ctx, struct waitlist_entry *e);

static void on_retry(void *ctx, struct waitlist_entry *e)
{
    struct seen *s = ctx;

    pthread_mutex_lock(&s->mu);
    s->retried[index_of(e)]++;
    pthread_mutex_unlock(&s->mu);
    if (s->rehold && !waitlist_hold(s->rehold, e, now_ms()))
        on_expire(ctx, e); /* its wait is over: the caller answers 409 */
}

static void on_expire(void *ctx, struct waitlist_entry *e)
{
    struct seen *s = ctx;

    pthread_mutex_lock(&s->mu);
    s->expired[index_of(e)]++;
    pthread_mutex_unlock(&s->mu);
}

static int get(struct seen *s, int *counter)
{
    int n;

    pthread_mutex_lock(&s->mu);
    n = *counter;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0)
        ;
}

static bool wait_until(struct seen *s, int *counter, int n, unsigned max_ms)
{
    for (unsigned waited = 0; waited < max_ms; waited += 5) {
        if (get(s, counter) >= n)
            return true;
        sleep_ms(5);
    }
    return false;
}

static void hold(struct waitlist *w, int i, const char *key, bool want)
{
    entries[i] = (struct waitlist_entry){ .key = key };
    CHECK(waitlist_hold(w, &entries[i], now_ms()) == want);
}

static void test_waitlist_notify_retries_only_its_key(void)
{
    struct seen s = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct worker_pool *p = NULL;
    struct waitlist *w = NULL;

    CHECK_EQ_INT(worker_pool_new(1, &p), 0);
    CHECK_EQ_INT(waitlist_new(p, 5000, on_retry, on_expire, &s, &w), 0);
    hold(w, 0, "idem:s:a", true);
    hold(w, 1, "idem:s:a", true);
    hold(w, 2, "idem:s:b", true);
    hold(w, 3, "idem:s:ab", true);
    waitlist_notify(w, SPAN_LIT("idem:s:a"));
    CHECK_EQ_INT(s.retried[0], 1); /* called back inside the notification */
    CHECK_EQ_INT(s.retried[1], 1);
    CHECK_EQ_INT(get(&s, &s.retried[2]), 0);
    CHECK_EQ_INT(get(&s, &s.retried[3]), 0);
    waitlist_notify(w, SPAN_LIT("idem:s:a")); /* nobody left for it */
    CHECK_EQ_INT(s.retried[0], 1);
    waitlist_notify(w, SPAN_LIT("idem:s:b"));
    CHECK_EQ_INT(get(&s, &s.retried[2]), 1);
    waitlist_stop(w); /* ignores notifications, holds nothing */
    waitlist_notify(w, SPAN_LIT("idem:s:ab"));
    CHECK_EQ_INT(get(&s, &s.retried[3]), 0);
    hold(w, 4, "idem:s:c", false);
    worker_pool_free(p); /* the deadline job runs at once: the rest expire */
    CHECK_EQ_INT(s.expired[3], 1);
    CHECK_EQ_INT(s.expired[0] + s.expired[1] + s.expired[2] + s.expired[4], 0);
    waitlist_free(w);
}

static void test_waitlist_polls_then_expires_once(void)
{
    struct seen s = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct worker_pool *p = NULL;
    struct waitlist *w = NULL;
    uint64_t start;

    CHECK_EQ_INT(worker_pool_new(1, &p), 0);
    CHECK_EQ_INT(waitlist_new(p, 1200, on_retry, on_expire, &s, &w), 0);
    s.rehold = w;
    start = now_ms();
    hold(w, 0, "idem:s:a", true);
    /* not notified: retried every WAITLIST_POLL_MS (and held again), until
     * its wait, counted from its first hold, is over */
    CHECK(wait_until(&s, &s.retried[0], 1, 2000));
    CHECK(now_ms() - start >= WAITLIST_POLL_MS);
    CHECK(wait_until(&s, &s.expired[0], 1, 3000));
    CHECK(now_ms() - start >= 1200 && now_ms() - start < 2500);
    CHECK(get(&s, &s.retried[0]) >= 2);
    CHECK(!waitlist_hold(w, &entries[0], now_ms())); /* over */
    sleep_ms(2 * WAITLIST_TICK_MS);
    CHECK_EQ_INT(get(&s, &s.expired[0]), 1);
    waitlist_stop(w);
    worker_pool_free(p);
    waitlist_free(w);
}

static void test_waitlist_quiesce_expires_everything_held(void)
{
    struct seen s = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct worker_pool *p = NULL;
    struct waitlist *w = NULL;

    CHECK_EQ_INT(worker_pool_new(1, &p), 0);
    CHECK_EQ_INT(waitlist_new(p, 60000, on_retry, on_expire, &s, &w), 0);
    hold(w, 0, "idem:s:a", true);
    hold(w, 1, "idem:s:b", true);
    waitlist_quiesce(w);
    hold(w, 2, "idem:s:c", false);
    CHECK(wait_until(&s, &s.expired[1], 1, 1000));
    CHECK(wait_until(&s, &s.expired[0], 1, 1000));
    CHECK_EQ_INT(get(&s, &s.retried[0]) + get(&s, &s.retried[1]), 0);
    waitlist_stop(w);
    worker_pool_free(p);
    waitlist_free(w);
}

TEST_MAIN(test_waitlist_notify_retries_only_its_key, test_waitlist_polls_then_expires_once,
          test_waitlist_quiesce_expires_everything_held)
