/* SPDX-License-Identifier: MIT */
/* Leases (lease.h) against a fake store that answers inside the call, as the
 * memory store does, and fails on demand: the finishing chain (complete or
 * release, retried with backoff while the heartbeat keeps the lock), the
 * too-large marker, lock_lost counted once, the heartbeat's extends and their
 * end, confirmation. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "idemproxy/buf.h"
#include "idemproxy/lease.h"
#include "idemproxy/metrics.h"
#include "idemproxy/record.h"
#include "idemproxy/worker.h"

enum { OP_COMPLETE, OP_RELEASE, OP_EXTEND, NOPS };

struct fake {
    struct store base;
    pthread_mutex_t mu;
    int calls[NOPS];
    int fail[NOPS][8]; /* errors the next calls of each op answer with, then 0 */
    int nfail[NOPS];
    char last_tok[STORE_TOKEN_HEX + 1];
    uint64_t last_ttl_ms;
    bool last_too_large;
};

static int answer(struct fake *f, int op, const struct store_token *tok, store_done_fn *done,
                  void *ctx)
{
    int err = 0;

    pthread_mutex_lock(&f->mu);
    f->calls[op]++;
    memcpy(f->last_tok, tok->hex, sizeof(f->last_tok));
    if (f->nfail[op] > 0) {
        err = f->fail[op][0];
        memmove(f->fail[op], f->fail[op] + 1, sizeof(f->fail[op]) - sizeof(int));
        f->nfail[op]--;
    }
    pthread_mutex_unlock(&f->mu);
    done(ctx, err, err ? NULL : &(struct store_result){ .status = STORE_OK });
    return 0;
}

static int fake_complete(struct store *st, struct span key, const struct store_token *tok,
                         struct record *rec, uint64_t ttl_ms, const struct store_link *link,
                         store_done_fn *done, void *ctx)
{
    struct fake *f = (struct fake *)st;

    (void)key, (void)link;
    pthread_mutex_lock(&f->mu);
    f->last_ttl_ms = ttl_ms;
    f->last_too_large = rec->too_large;
    pthread_mutex_unlock(&f->mu);
    return answer(f, OP_COMPLETE, tok, done, ctx);
}

static int fake_release(struct store *st, struct span key, const struct store_token *tok,
                        store_done_fn *done, void *ctx)
{
    (void)key;
    return answer((struct fake *)st, OP_RELEASE, tok, done, ctx);
}

static int fake_extend(struct store *st, struct span key, const struct store_token *tok,
                       uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    (void)key;
    (void)lock_ttl_ms;
    return answer((struct fake *)st, OP_EXTEND, tok, done, ctx);
}

static const struct store_ops fake_ops = {
    .name = "fake",
    .complete = fake_complete,
    .release = fake_release,
    .extend = fake_extend,
};

static int calls(struct fake *f, int op)
{
    int n;

    pthread_mutex_lock(&f->mu);
    n = f->calls[op];
    pthread_mutex_unlock(&f->mu);
    return n;
}

static void fail_next(struct fake *f, int op, int err)
{
    pthread_mutex_lock(&f->mu);
    f->fail[op][f->nfail[op]++] = err;
    pthread_mutex_unlock(&f->mu);
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0)
        ;
}

static bool wait_calls(struct fake *f, int op, int n)
{
    for (int waited = 0; waited < 3000; waited += 5) {
        if (calls(f, op) >= n)
            return true;
        sleep_ms(5);
    }
    return false;
}

static struct fake fake;
static struct worker_pool *pool;

/* Waits until no extend has come for 100 ms (an extend the heartbeat sent
 * just before a lease ended may still land), up to 3 s. Returns the count. */
static int quiet_extends(void)
{
    int n = calls(&fake, OP_EXTEND);

    for (int waited = 0; waited < 3000; waited += 100) {
        sleep_ms(100);
        if (calls(&fake, OP_EXTEND) == n)
            break;
        n = calls(&fake, OP_EXTEND);
    }
    return n;
}

static uint64_t lock_lost_total(void)
{
    struct buf out = BUF_INIT(1 << 20);
    const char *p;
    uint64_t v = 0;

    CHECK_EQ_INT(metrics_format(&out, NULL), 0);
    p = out.data ? strstr(out.data, "\nidemproxy_lock_lost_total ") : NULL;
    if (p)
        v = strtoull(p + strlen("\nidemproxy_lock_lost_total "), NULL, 10);
    buf_done(&out);
    return v;
}

struct told {
    pthread_mutex_t mu;
    int n;
    int err;
};

static void on_told(void *ctx)
{
    struct told *t = ctx;

    pthread_mutex_lock(&t->mu);
    t->n++;
    pthread_mutex_unlock(&t->mu);
}

static void on_confirm(void *ctx, int err)
{
    struct told *t = ctx;

    pthread_mutex_lock(&t->mu);
    t->n++;
    t->err = err;
    pthread_mutex_unlock(&t->mu);
}

/* Each test has a pool of its own: leases_free() may come only once the
 * pool has run its jobs (a finishing chain may still be on one). */
static struct leases *setup(uint64_t lock_ttl_ms)
{
    struct leases *ls = NULL;

    memset(&fake.calls, 0, sizeof(fake.calls));
    memset(&fake.nfail, 0, sizeof(fake.nfail));
    CHECK_EQ_INT(worker_pool_new(2, &pool), 0);
    CHECK_EQ_INT(leases_new(&fake.base, pool, lock_ttl_ms, &ls), 0);
    return ls;
}

static void teardown(struct leases *ls)
{
    leases_stop(ls);
    worker_pool_free(pool);
    pool = NULL;
    leases_free(ls);
}

static const struct store_token tok = { .hex = "0123456789abcdef0123456789abcdef" };

static void test_lease_completes_with_its_token_and_tells_once(void)
{
    struct leases *ls = setup(30000);
    struct told t = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct lease *l = lease_start(ls, "idem:s:k", &tok, now_ms(), 0);
    struct record *rec = record_new(16);

    CHECK(l != NULL && rec != NULL);
    rec->status = 201;
    lease_finish(l, rec, 5000, NULL, on_told, &t);
    CHECK_EQ_INT(t.n, 1);
    CHECK_EQ_INT(calls(&fake, OP_COMPLETE), 1);
    CHECK_EQ_INT(calls(&fake, OP_RELEASE), 0);
    CHECK_EQ_STR(fake.last_tok, tok.hex);
    CHECK_EQ_INT(fake.last_ttl_ms, 5000);
    l = lease_start(ls, "idem:s:k2", &tok, now_ms(), 0);
    lease_finish(l, NULL, 5000, NULL, on_told, &t); /* NULL: release */
    CHECK_EQ_INT(t.n, 2);
    CHECK_EQ_INT(calls(&fake, OP_RELEASE), 1);
    teardown(ls);
}

/* A store failure is retried in the background with the token; the holder
 * is told after the first attempt, once. */
static void test_lease_finish_retried_until_the_store_answers(void)
{
    struct leases *ls = setup(30000);
    struct told t = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct lease *l = lease_start(ls, "idem:s:k", &tok, now_ms(), 0);
    struct record *rec = record_new(16);

    fail_next(&fake, OP_COMPLETE, -ECONNRESET);
    fail_next(&fake, OP_COMPLETE, -ETIMEDOUT);
    lease_finish(l, rec, 1000, NULL, on_told, &t);
    CHECK_EQ_INT(t.n, 1); /* told after the first attempt, not after the retries */
    CHECK(wait_calls(&fake, OP_COMPLETE, 3));
    sleep_ms(200);
    CHECK_EQ_INT(calls(&fake, OP_COMPLETE), 3); /* the third landed: no more */
    CHECK_EQ_INT(t.n, 1);
    teardown(ls);
}

static void test_lease_stale_complete_counts_lock_lost_once_no_retry(void)
{
    struct leases *ls = setup(30000);
    struct told t = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct lease *l = lease_start(ls, "idem:s:k", &tok, now_ms(), 0);
    uint64_t before = lock_lost_total();

    fail_next(&fake, OP_COMPLETE, -ESTALE);
    lease_finish(l, record_new(16), 1000, NULL, on_told, &t);
    CHECK_EQ_INT(t.n, 1);
    CHECK_EQ_INT(lock_lost_total(), before + 1);
    sleep_ms(100);
    CHECK_EQ_INT(calls(&fake, OP_COMPLETE), 1);
    teardown(ls);
}

/* A record the store can never hold becomes the too-large marker: the
 * request is still never run twice. */
static void test_lease_too_big_for_the_store_keeps_the_marker(void)
{
    struct leases *ls = setup(30000);
    struct told t = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct lease *l = lease_start(ls, "idem:s:k", &tok, now_ms(), 0);
    struct record *rec = record_new(16);

    rec->status = 200;
    fail_next(&fake, OP_COMPLETE, -E2BIG);
    lease_finish(l, rec, 1000, NULL, on_told, &t);
    CHECK_EQ_INT(t.n, 1);
    CHECK_EQ_INT(calls(&fake, OP_COMPLETE), 2);
    CHECK(fake.last_too_large);
    teardown(ls);
}

/* With a 60 ms lock TTL, the heartbeat extends every 20 ms while the lease
 * is held, and stops once it is finished or abandoned. */
static void test_lease_heartbeat_extends_until_finished(void)
{
    struct leases *ls = setup(60);
    struct told t = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct lease *l = lease_start(ls, "idem:s:k", &tok, now_ms(), 0);
    uint64_t valid0 = lease_valid_until_ms(l);
    int n;

    CHECK(wait_calls(&fake, OP_EXTEND, 4));
    CHECK(lease_valid_until_ms(l) > valid0); /* each extend moves it */
    lease_finish(l, NULL, 1000, NULL, on_told, &t);
    n = quiet_extends();
    sleep_ms(200);
    CHECK_EQ_INT(calls(&fake, OP_EXTEND), n); /* none after the one in flight, if any */

    l = lease_start(ls, "idem:s:k2", &tok, now_ms(), 0);
    CHECK(wait_calls(&fake, OP_EXTEND, n + 2));
    lease_abandon(l);
    n = quiet_extends();
    sleep_ms(200);
    CHECK_EQ_INT(calls(&fake, OP_EXTEND), n);
    teardown(ls);
}

/* A heartbeat that finds the lock taken ends the heartbeat and counts it. */
static void test_lease_heartbeat_finding_the_lock_taken_counts_lock_lost(void)
{
    struct leases *ls = setup(60);
    struct lease *l = lease_start(ls, "idem:s:k", &tok, now_ms(), 0);
    uint64_t before = lock_lost_total();
    int n;

    fail_next(&fake, OP_EXTEND, -ESTALE);
    CHECK(wait_calls(&fake, OP_EXTEND, 1));
    n = quiet_extends();
    CHECK_EQ_INT(lock_lost_total(), before + 1);
    sleep_ms(200);
    CHECK_EQ_INT(calls(&fake, OP_EXTEND), n); /* no more extends */
    lease_abandon(l);
    teardown(ls);
}

static void test_lease_confirm(void)
{
    struct leases *ls = setup(30000);
    struct told t = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct lease *l = lease_start(ls, "idem:s:k", &tok, now_ms() - 20000, 0);
    uint64_t before = lock_lost_total(), valid0 = lease_valid_until_ms(l);

    lease_confirm(l, on_confirm, &t);
    CHECK_EQ_INT(t.n, 1);
    CHECK_EQ_INT(t.err, 0);
    CHECK(lease_valid_until_ms(l) >= valid0 + 19000);
    lease_abandon(l);

    l = lease_start(ls, "idem:s:k", &tok, now_ms(), 0);
    fail_next(&fake, OP_EXTEND, -ESTALE);
    lease_confirm(l, on_confirm, &t);
    CHECK_EQ_INT(t.n, 2);
    CHECK_EQ_INT(t.err, -ESTALE);
    CHECK_EQ_INT(lock_lost_total(), before + 1);
    lease_abandon(l);

    l = lease_start(ls, "idem:s:k", &tok, now_ms(), 0);
    fail_next(&fake, OP_EXTEND, -ECONNREFUSED);
    lease_confirm(l, on_confirm, &t);
    CHECK_EQ_INT(t.n, 3);
    CHECK_EQ_INT(t.err, -ECONNREFUSED);
    CHECK_EQ_INT(lock_lost_total(), before + 1); /* a store error is no loss */
    lease_abandon(l);
    teardown(ls);
}

/* TEST_MAIN, with the fake store set up first. */
int main(void)
{
    check_test_fn *const tests[] = {
        test_lease_completes_with_its_token_and_tells_once,
        test_lease_finish_retried_until_the_store_answers,
        test_lease_stale_complete_counts_lock_lost_once_no_retry,
        test_lease_too_big_for_the_store_keeps_the_marker,
        test_lease_heartbeat_extends_until_finished,
        test_lease_heartbeat_finding_the_lock_taken_counts_lock_lost,
        test_lease_confirm,
    };
    static const char *const names[] = {
        "test_lease_completes_with_its_token_and_tells_once",
        "test_lease_finish_retried_until_the_store_answers",
        "test_lease_stale_complete_counts_lock_lost_once_no_retry",
        "test_lease_too_big_for_the_store_keeps_the_marker",
        "test_lease_heartbeat_extends_until_finished",
        "test_lease_heartbeat_finding_the_lock_taken_counts_lock_lost",
        "test_lease_confirm",
    };
    int ret;

    fake.base.ops = &fake_ops;
    pthread_mutex_init(&fake.mu, NULL);
    ret = check_run(names, tests, ARRAY_SIZE(tests));
    return ret;
}
