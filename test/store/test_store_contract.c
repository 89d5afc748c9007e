/* SPDX-License-Identifier: MIT */
/* The store contract: one behaviour suite that every store implementation
 * must pass, run as `test_store_contract <kind>` (kinds: see store_kinds[]).
 * The Redis kind needs IDEMPROXY_TEST_REDIS_URL (scripts/test starts a
 * redis-server and exports it), and that Redis to itself while it runs: it
 * pauses and kills clients and counts keys with DBSIZE. Also here: Redis-only
 * behaviour (script cache loss, one key per idempotency key, connection
 * failures), and the memory store's budget (eviction, background reclaim,
 * accounting). The worker pool and the redis:// URL parser, which need no
 * store, are unit tests (test_worker.c, test_store_redis_url.c). */
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "idemproxy/loop.h"
#include "idemproxy/record.h"
#include "idemproxy/redis_cluster.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/seal.h"
#include "idemproxy/store.h"
#include "idemproxy/store_memory.h"
#include "idemproxy/store_pg.h"
#include "idemproxy/store_redis.h"
#include "idemproxy/store_seal.h"
#include "idemproxy/worker.h"

#define CALL_TIMEOUT_MS 5000
#define POOL_THREADS 4

struct store_kind {
    const char *name;
    /* Makes a fresh, empty-for-our-keys store running on <pool>. */
    int (*make)(struct worker_pool *pool, struct store **ret);
    /* Calls back before the call returns (on the caller's thread), rather
     * than later on a store thread: store.h allows either, one per kind. */
    bool inline_callbacks;
};

static const struct store_kind *kind;
/* `<kind> sealed`: the store behind the sealing filter (store_seal.h), so
 * that the contract holds through it, answers going in sealed */
static bool sealed;
static struct worker_pool *pool;
static const char *redis_url;
/* redis-tls: the CA that verifies the TLS port, and the same server's plain
 * port for the test's own checks (hiredis' blocking API has no TLS) */
static const char *redis_tls_ca, *redis_admin_url;
static bool cluster_kind; /* redis-cluster: the URL names the seeds of a Redis Cluster */
static atomic_int accepted, callbacks; /* every accepted call must call back exactly once */

/* ---- helpers ---- */

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0)
        ;
}

static const char *key_make(char *buf, size_t size, const char *name)
{
    static atomic_uint seq;

    snprintf(buf, size, "test:%ld:%u:%s", (long)getpid(), atomic_fetch_add(&seq, 1), name);
    return buf;
}

static struct store_token token(void)
{
    struct store_token t = { .hex = { 0 } };

    CHECK_EQ_INT(store_token_new(&t), 0);
    return t;
}

static const uint8_t fp_a[FINGERPRINT_LEN] = { 0xaa, 1, 2, 3 };
static const uint8_t fp_b[FINGERPRINT_LEN] = { 0xbb, 1, 2, 3 };

/* One store call in progress: its callback's arguments, kept for the test. */
struct call {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t caller;
    bool done;
    bool same_thread; /* called back on the caller's thread: maybe from inside the call */
    bool on_pool;     /* a call that every kind answers on a store thread (inspect) */
    bool bad_res;     /* err and res disagree with the callback contract */
    int err;
    int status;         /* -1: no result */
    struct record *rec; /* own reference */
    int cause;          /* STORE_UNKNOWN: its cause, and the rest */
    bool became;
    int probe; /* store_probe(): what its step did, the claim's time and count */
    uint64_t probe_ms;
    unsigned probes;
    char about[STORE_ABOUT_MAX]; /* unknown: its words; mismatch: its resource ("": none) */
    char trace[64];              /* acquire: the trace context kept with the key ("": none) */
};

/* What a call gave: <ret> is the call's return, the rest its callback's. */
struct res {
    int ret;
    int err;
    int status;
    struct record *rec; /* owned by the test */
    int cause;          /* STORE_UNKNOWN only, else -1 */
    bool became;
    int probe; /* store_probe() only, else -1 */
    uint64_t probe_ms;
    unsigned probes;
    char about[STORE_ABOUT_MAX];
    char trace[64];
};

static struct call *call_new(void)
{
    struct call *c = calloc(1, sizeof(*c));
    pthread_condattr_t attr;

    if (!c)
        abort();
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&c->mu, NULL);
    c->caller = pthread_self();
    c->status = -1;
    return c;
}

static void call_free(struct call *c)
{
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void call_done(void *ctx, int err, const struct store_result *res)
{
    struct call *c = ctx;

    atomic_fetch_add(&callbacks, 1);
    pthread_mutex_lock(&c->mu);
    c->err = err;
    c->status = res ? (int)res->status : -1;
    c->rec = res ? record_ref(res->rec) : NULL;
    c->cause = res && res->status == STORE_UNKNOWN ? (int)res->cause : -1;
    c->became = res && res->status == STORE_UNKNOWN && res->became;
    c->probe = res ? (int)res->probe : -1;
    c->probe_ms = res ? res->probe_ms : 0;
    c->probes = res ? res->probes : 0;
    if (res && res->status == STORE_UNKNOWN && res->about.len < sizeof(c->about)) {
        memcpy(c->about, res->about.base ? res->about.base : "", res->about.len);
        c->about[res->about.len] = '\0';
    }
    /* A mismatch's resource goes where an unknown key's words go. */
    if (res && res->status == STORE_MISMATCH && res->resource.len < sizeof(c->about)) {
        memcpy(c->about, res->resource.base ? res->resource.base : "", res->resource.len);
        c->about[res->resource.len] = '\0';
    }
    if (res && res->trace.len < sizeof(c->trace)) {
        memcpy(c->trace, res->trace.base ? res->trace.base : "", res->trace.len);
        c->trace[res->trace.len] = '\0';
    } else if (res) {
        snprintf(c->trace, sizeof(c->trace), "(%zu bytes)", res->trace.len);
    }
    /* Only an acquire that found the key gives a trace context back. */
    c->bad_res = (err == 0) != (res != NULL) ||
                 (res && (res->status == STORE_COMPLETED) != (res->rec != NULL)) ||
                 (res && res->trace.len && res->status != STORE_IN_FLIGHT &&
                  res->status != STORE_MISMATCH && res->status != STORE_UNKNOWN &&
                  res->status != STORE_COMPLETED && res->status != STORE_UNREADABLE);
    c->same_thread = pthread_equal(pthread_self(), c->caller);
    c->done = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Set on a test's own threads, where CHECK (not thread-safe) must not run:
 * call_finish() counts its failures there instead. */
static _Thread_local int *off_main_bad;

#define CHECK_CALL(cond)                                                                           \
    do {                                                                                           \
        if (off_main_bad)                                                                          \
            *off_main_bad += !(cond);                                                              \
        else                                                                                       \
            CHECK(cond);                                                                           \
    } while (0)

/* Waits for the callback of the call that returned <ret>. */
static struct res call_finish(struct call *c, int ret)
{
    struct res r = { .ret = ret, .err = 0, .status = -1, .rec = NULL, .cause = -1 };
    uint64_t due = now_ms() + CALL_TIMEOUT_MS;
    struct timespec ts = { .tv_sec = (time_t)(due / 1000),
                           .tv_nsec = (long)(due % 1000) * 1000000L };
    bool done;

    if (ret != 0) {
        call_free(c); /* refused: no callback may come */
        return r;
    }
    atomic_fetch_add(&accepted, 1);
    pthread_mutex_lock(&c->mu);
    while (!c->done && pthread_cond_timedwait(&c->cv, &c->mu, &ts) == 0)
        ;
    done = c->done;
    pthread_mutex_unlock(&c->mu);
    CHECK_CALL(done);
    if (!done) {
        r.err = -ETIME; /* c is leaked: its callback may still come */
        return r;
    }
    CHECK_CALL(c->same_thread == (kind->inline_callbacks && !c->on_pool));
    CHECK_CALL(!c->bad_res);
    r.err = c->err;
    r.status = c->status;
    r.rec = c->rec;
    r.cause = c->cause;
    r.became = c->became;
    r.probe = c->probe;
    r.probe_ms = c->probe_ms;
    r.probes = c->probes;
    memcpy(r.about, c->about, sizeof(r.about));
    memcpy(r.trace, c->trace, sizeof(r.trace));
    call_free(c);
    return r;
}

/* What the unknown records of these tests say of their request. */
static const struct store_about about_payment = {
    .route = SPAN_LIT("payments"),
    .method = SPAN_LIT("POST"),
    .target = SPAN_LIT("/v1/payments?x=1"),
};
#define ABOUT_PAYMENT "payments POST /v1/payments?x=1"

/* An acquire for a lease of <lease_ms>, the record kept <keep_ms>, and a
 * lapsed lock taken over (<take_over>) or made unknown. */
static struct res acquire_as(struct store *st, const char *key, const uint8_t *fp,
                             const struct store_token *tok, uint64_t lease_ms, uint64_t keep_ms,
                             bool take_over)
{
    struct call *c = call_new();
    const struct store_lock lk = {
        .lease_ms = lease_ms, .keep_ms = keep_ms, .take_over = take_over, .about = about_payment
    };

    return call_finish(c, store_acquire(st, span_from_cstr(key), fp, tok, &lk, call_done, c));
}

/* An acquire as today's at-least-once routes make it (on-unknown-outcome
 * retry), the record kept a minute. */
static struct res acquire(struct store *st, const char *key, const uint8_t *fp,
                          const struct store_token *tok, uint64_t lock_ttl_ms)
{
    return acquire_as(st, key, fp, tok, lock_ttl_ms, 60000, true);
}

static struct res mark_unknown(struct store *st, const char *key, const struct store_token *tok,
                               enum store_cause cause, uint64_t keep_ms)
{
    struct call *c = call_new();

    return call_finish(c, store_unknown(st, span_from_cstr(key), tok, cause, &about_payment,
                                        keep_ms, call_done, c));
}

static struct res complete(struct store *st, const char *key, const struct store_token *tok,
                           struct record *rec, uint64_t ttl_ms)
{
    struct call *c = call_new();

    return call_finish(
        c, store_complete(st, span_from_cstr(key), tok, rec, ttl_ms, NULL, call_done, c));
}

/* A complete that links the resource <resource> to <key>, whose prefix is
 * <prefix_len> bytes long. */
static struct res complete_linked(struct store *st, const char *key, const struct store_token *tok,
                                  struct record *rec, uint64_t ttl_ms, const char *resource,
                                  size_t prefix_len)
{
    struct call *c = call_new();
    const struct store_link link = { .resource = span_from_cstr(resource),
                                     .prefix_len = prefix_len };

    return call_finish(
        c, store_complete(st, span_from_cstr(key), tok, rec, ttl_ms, &link, call_done, c));
}

static struct res release(struct store *st, const char *key, const struct store_token *tok)
{
    struct call *c = call_new();

    return call_finish(c, store_release(st, span_from_cstr(key), tok, call_done, c));
}

static struct res purge_call(struct store *st, const char *key)
{
    struct call *c = call_new();

    return call_finish(c, store_purge(st, span_from_cstr(key), 0, call_done, c));
}

static struct res extend(struct store *st, const char *key, const struct store_token *tok,
                         uint64_t lock_ttl_ms)
{
    struct call *c = call_new();

    return call_finish(c, store_extend(st, span_from_cstr(key), tok, lock_ttl_ms, call_done, c));
}

/* Checks that a call was accepted and called back with <err> and <status>
 * (-1 for none), and drops the result's record. */
#define CHECK_RES(expr, want_err, want_status)                                                     \
    do {                                                                                           \
        struct res r_ = (expr);                                                                    \
        CHECK_EQ_INT(r_.ret, 0);                                                                   \
        CHECK_EQ_INT(r_.err, (want_err));                                                          \
        CHECK_EQ_INT(r_.status, (want_status));                                                    \
        record_unref(r_.rec);                                                                      \
    } while (0)

static struct store *store_open(void)
{
    struct store *st = NULL;

    CHECK_EQ_INT(kind->make(pool, &st), 0);
    if (st && sealed) {
        static const char text[] = "k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n";
        struct seal_keys *keys = NULL;
        char why[128];

        CHECK_EQ_INT(seal_keys_parse(SPAN_LIT(text), &keys, why, sizeof(why)), 0);
        if (store_seal_new(st, keys, &st) < 0)
            st = NULL;
    }
    if (!st) {
        fprintf(stderr, "cannot create a %s store\n", kind->name);
        exit(1);
    }
    return st;
}

/* The loops of the Redis store made last (NULL for the memory store): it
 * runs its connections on them, so they are stopped before it is freed (as
 * the program does) and freed after it. */
#define REDIS_LOOPS 2
static struct loop *redis_loops[REDIS_LOOPS];

static void redis_loops_free(void)
{
    for (int i = 0; i < REDIS_LOOPS; i++) {
        loop_free(redis_loops[i]);
        redis_loops[i] = NULL;
    }
}

/* Frees <st> and checks that every accepted call has called back once. */
static void store_close(struct store *st)
{
    for (int i = 0; i < REDIS_LOOPS; i++)
        loop_stop(redis_loops[i]);
    store_free(st);
    redis_loops_free();
    CHECK_EQ_INT(atomic_load(&callbacks), atomic_load(&accepted));
}

static struct record *sample_record(unsigned status, const char *tag)
{
    struct record *rec = record_new(4096);
    char body[300];

    if (!rec)
        abort();
    rec->status = status;
    CHECK_EQ_INT(record_add_header(rec, SPAN_LIT("Content-Type"), SPAN_LIT("application/x")), 0);
    CHECK_EQ_INT(record_add_header(rec, SPAN_LIT("Set-Cookie"), SPAN_LIT("a=1")), 0);
    CHECK_EQ_INT(record_add_header(rec, SPAN_LIT("X-Empty"), SPAN_LIT("")), 0);
    CHECK_EQ_INT(record_add_header(rec, SPAN_LIT("Set-Cookie"), SPAN_LIT("b=2; Path=/")), 0);
    CHECK_EQ_INT(record_add_header(rec, SPAN_LIT("X-Tag"), span_from_cstr(tag)), 0);
    for (size_t i = 0; i < sizeof(body); i++)
        body[i] = (char)(i * 7); /* every byte value, NULs included */
    CHECK_EQ_INT(buf_append(&rec->body, body, sizeof(body)), 0);
    CHECK_EQ_INT(buf_append(&rec->body, tag, strlen(tag)), 0);
    return rec;
}

static bool record_equal(const struct record *a, const struct record *b)
{
    if (!a || !b || a->status != b->status || a->too_large != b->too_large ||
        a->nheaders != b->nheaders || a->body.len != b->body.len)
        return false;
    for (size_t i = 0; i < a->nheaders; i++) {
        if (strcmp(a->headers[i].name, b->headers[i].name) != 0 ||
            strcmp(a->headers[i].value, b->headers[i].value) != 0)
            return false;
    }
    return a->body.len == 0 || memcmp(a->body.data, b->body.data, a->body.len) == 0;
}

/* ---- the contract, for every kind ---- */

static void test_acquire_new_then_in_flight_then_mismatch(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token(), t3 = token();
    char key[128];

    key_make(key, sizeof(key), "states");
    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(acquire(st, key, fp_a, &t2, 10000), 0, STORE_IN_FLIGHT);
    CHECK_RES(acquire(st, key, fp_b, &t3, 10000), 0, STORE_MISMATCH);
    /* The holder's own token does not make a second acquire succeed either. */
    CHECK_RES(acquire(st, key, fp_b, &t1, 10000), 0, STORE_MISMATCH);
    /* Another key is independent. */
    key_make(key, sizeof(key), "states-other");
    CHECK_RES(acquire(st, key, fp_b, &t3, 10000), 0, STORE_ACQUIRED);
    store_close(st);
}

static void test_complete_then_acquire_replays_the_record(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token(), t3 = token();
    struct record *rec = sample_record(201, "first"), *retry = sample_record(200, "retry");
    struct res r;
    char key[128];

    key_make(key, sizeof(key), "replay");
    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, key, &t1, rec, 10000), 0, STORE_OK);

    r = acquire(st, key, fp_a, &t2, 10000);
    CHECK_EQ_INT(r.err, 0);
    CHECK_EQ_INT(r.status, STORE_COMPLETED);
    /* Redis hands back a record read back from it; the memory store may share
     * the stored one (records are read-only once stored). */
    if (strcmp(kind->name, "redis") == 0)
        CHECK(r.rec != rec);
    CHECK(record_equal(r.rec, rec));
    if (r.rec) {
        CHECK_EQ_INT(r.rec->nheaders, 5);
        CHECK_EQ_STR(r.rec->headers[1].name, "Set-Cookie");
        CHECK_EQ_STR(r.rec->headers[3].value, "b=2; Path=/");
        CHECK_EQ_STR(r.rec->headers[2].value, "");
    }
    record_unref(r.rec);

    /* Known with another fingerprint, now that it is completed. */
    CHECK_RES(acquire(st, key, fp_b, &t3, 10000), 0, STORE_MISMATCH);
    /* A retried complete under the same token finds its own result, which
     * stays: the first stored answer is the one every duplicate gets. */
    CHECK_RES(complete(st, key, &t1, rec, 10000), 0, STORE_OK);
    CHECK_RES(complete(st, key, &t1, retry, 10000), 0, STORE_OK);
    r = acquire(st, key, fp_a, &t3, 10000);
    CHECK_EQ_INT(r.status, STORE_COMPLETED);
    CHECK(record_equal(r.rec, rec));
    record_unref(r.rec);
    record_unref(rec);
    record_unref(retry);
    store_close(st);
}

static void test_complete_keeps_too_large_marker_and_empty_body(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token();
    struct record *marker = record_new(0), *empty = record_new(0);
    struct res r;
    char key[128];

    if (!marker || !empty)
        abort();
    marker->too_large = true;
    marker->status = 200;
    key_make(key, sizeof(key), "marker");
    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, key, &t1, marker, 10000), 0, STORE_OK);
    r = acquire(st, key, fp_a, &t2, 10000);
    CHECK_EQ_INT(r.status, STORE_COMPLETED);
    CHECK(r.rec && r.rec->too_large);
    CHECK(record_equal(r.rec, marker));
    record_unref(r.rec);

    empty->status = 204;
    key_make(key, sizeof(key), "empty");
    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, key, &t1, empty, 10000), 0, STORE_OK);
    r = acquire(st, key, fp_a, &t2, 10000);
    CHECK_EQ_INT(r.status, STORE_COMPLETED);
    CHECK(r.rec && !r.rec->too_large && r.rec->nheaders == 0 && r.rec->body.len == 0);
    CHECK(record_equal(r.rec, empty));
    record_unref(r.rec);
    record_unref(marker);
    record_unref(empty);
    store_close(st);
}

static void test_stale_token_changes_nothing(void)
{
    struct store *st = store_open();
    struct store_token holder = token(), other = token(), t3 = token();
    struct record *mine = sample_record(200, "holder"), *theirs = sample_record(500, "stale");
    struct res r;
    char key[128];

    key_make(key, sizeof(key), "stale");
    CHECK_RES(acquire(st, key, fp_a, &holder, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, key, &other, theirs, 10000), -ESTALE, -1);
    CHECK_RES(release(st, key, &other), -ESTALE, -1);
    CHECK_RES(extend(st, key, &other, 10000), -ESTALE, -1);
    /* Still locked by the holder. */
    CHECK_RES(acquire(st, key, fp_a, &t3, 10000), 0, STORE_IN_FLIGHT);

    CHECK_RES(complete(st, key, &holder, mine, 10000), 0, STORE_OK);
    CHECK_RES(complete(st, key, &other, theirs, 10000), -ESTALE, -1);
    CHECK_RES(release(st, key, &other), -ESTALE, -1);
    /* A completed key is not a lock any more: not even its holder releases or extends it. */
    CHECK_RES(release(st, key, &holder), -ESTALE, -1);
    CHECK_RES(extend(st, key, &holder, 10000), -ESTALE, -1);
    r = acquire(st, key, fp_a, &t3, 10000);
    CHECK_EQ_INT(r.status, STORE_COMPLETED);
    CHECK(record_equal(r.rec, mine));
    record_unref(r.rec);

    /* A key that does not exist: complete and extend are stale, release is done. */
    key_make(key, sizeof(key), "stale-absent");
    CHECK_RES(complete(st, key, &holder, mine, 10000), -ESTALE, -1);
    CHECK_RES(extend(st, key, &holder, 10000), -ESTALE, -1);
    CHECK_RES(release(st, key, &holder), 0, STORE_OK);
    CHECK_RES(acquire(st, key, fp_b, &t3, 10000), 0, STORE_ACQUIRED); /* nothing was created */
    record_unref(mine);
    record_unref(theirs);
    store_close(st);
}

static void test_release_frees_the_key(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token();
    char key[128];

    key_make(key, sizeof(key), "release");
    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(release(st, key, &t1), 0, STORE_OK);
    CHECK_RES(release(st, key, &t1), 0, STORE_OK); /* a retry: already gone */
    /* Forgotten entirely: even another fingerprint acquires it. */
    CHECK_RES(acquire(st, key, fp_b, &t2, 10000), 0, STORE_ACQUIRED);
    store_close(st);
}

static void test_lock_expires_after_its_ttl(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token();
    struct record *rec = sample_record(200, "late");
    struct res r;
    char key[128];

    key_make(key, sizeof(key), "lock-ttl");
    CHECK_RES(acquire(st, key, fp_a, &t1, 200), 0, STORE_ACQUIRED);
    CHECK_RES(acquire(st, key, fp_a, &t2, 200), 0, STORE_IN_FLIGHT);
    sleep_ms(400);
    CHECK_RES(acquire(st, key, fp_a, &t2, 10000), 0, STORE_ACQUIRED);
    /* The first holder lost its lock: nothing it does counts. */
    CHECK_RES(complete(st, key, &t1, rec, 10000), -ESTALE, -1);
    CHECK_RES(extend(st, key, &t1, 10000), -ESTALE, -1);
    CHECK_RES(release(st, key, &t1), -ESTALE, -1);
    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_IN_FLIGHT);
    CHECK_RES(complete(st, key, &t2, rec, 10000), 0, STORE_OK);
    r = acquire(st, key, fp_a, &t1, 10000);
    CHECK_EQ_INT(r.status, STORE_COMPLETED);
    CHECK(record_equal(r.rec, rec));
    record_unref(r.rec);
    record_unref(rec);
    store_close(st);
}

/* Checks an acquire that found (or made) the key unknown. */
#define CHECK_UNKNOWN(expr, want_cause, want_became)                                               \
    do {                                                                                           \
        struct res r_ = (expr);                                                                    \
        CHECK_EQ_INT(r_.err, 0);                                                                   \
        CHECK_EQ_INT(r_.status, STORE_UNKNOWN);                                                    \
        CHECK_EQ_INT(r_.cause, (want_cause));                                                      \
        CHECK_EQ_INT(r_.became, (want_became));                                                    \
        CHECK_EQ_STR(r_.about, ABOUT_PAYMENT);                                                     \
    } while (0)

static void test_lapsed_lock_becomes_unknown_and_its_holder_may_come_back(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token(), t3 = token();
    struct record *rec = sample_record(201, "came-back");
    struct res r;
    char key[128];

    key_make(key, sizeof(key), "holder-lost");
    CHECK_RES(acquire_as(st, key, fp_a, &t1, 200, 60000, false), 0, STORE_ACQUIRED);
    CHECK_RES(acquire_as(st, key, fp_a, &t2, 200, 60000, false), 0, STORE_IN_FLIGHT);
    sleep_ms(400); /* the lease ran out; the record stays */
    CHECK_UNKNOWN(acquire_as(st, key, fp_a, &t2, 200, 60000, false), STORE_CAUSE_HOLDER_LOST, true);
    CHECK_UNKNOWN(acquire_as(st, key, fp_a, &t3, 200, 60000, false), STORE_CAUSE_HOLDER_LOST,
                  false);
    CHECK_RES(acquire_as(st, key, fp_b, &t3, 200, 60000, false), 0, STORE_MISMATCH);
    /* Its lock is gone: no heartbeat renews it, no one else completes it. */
    CHECK_RES(extend(st, key, &t1, 10000), -ESTALE, -1);
    CHECK_RES(complete(st, key, &t2, rec, 10000), -ESTALE, -1);
    CHECK_RES(mark_unknown(st, key, &t2, STORE_CAUSE_UPSTREAM_RESET, 10000), -ESTALE, -1);
    /* The holder comes back with its answer: duplicates get it. */
    CHECK_RES(complete(st, key, &t1, rec, 10000), 0, STORE_OK);
    r = acquire_as(st, key, fp_a, &t3, 200, 60000, false);
    CHECK_EQ_INT(r.status, STORE_COMPLETED);
    CHECK(record_equal(r.rec, rec));
    record_unref(r.rec);
    record_unref(rec);
    store_close(st);
}

static void test_holder_marks_unknown_and_retry_takes_it_over(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token(), t3 = token();
    struct record *rec = sample_record(200, "x");
    char key[128];

    key_make(key, sizeof(key), "marked");
    CHECK_RES(acquire_as(st, key, fp_a, &t1, 10000, 60000, false), 0, STORE_ACQUIRED);
    CHECK_RES(mark_unknown(st, key, &t2, STORE_CAUSE_UPSTREAM_TIMEOUT, 60000), -ESTALE, -1);
    CHECK_RES(mark_unknown(st, key, &t1, STORE_CAUSE_UPSTREAM_TIMEOUT, 60000), 0, STORE_OK);
    CHECK_RES(mark_unknown(st, key, &t1, STORE_CAUSE_UPSTREAM_TIMEOUT, 60000), 0, STORE_OK);
    CHECK_UNKNOWN(acquire_as(st, key, fp_a, &t2, 10000, 60000, false), STORE_CAUSE_UPSTREAM_TIMEOUT,
                  false);
    CHECK_RES(acquire_as(st, key, fp_b, &t2, 10000, 60000, false), 0, STORE_MISMATCH);
    CHECK_RES(extend(st, key, &t1, 10000), -ESTALE, -1);
    /* A route that retries takes it over: at least once. */
    CHECK_RES(acquire_as(st, key, fp_a, &t3, 10000, 60000, true), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, key, &t1, rec, 10000), -ESTALE, -1);
    record_unref(rec);
    CHECK_RES(release(st, key, &t3), 0, STORE_OK);

    /* The holder that learns the outcome after all releases it. */
    CHECK_RES(acquire_as(st, key, fp_a, &t1, 10000, 60000, false), 0, STORE_ACQUIRED);
    CHECK_RES(mark_unknown(st, key, &t1, STORE_CAUSE_UPSTREAM_RESET, 60000), 0, STORE_OK);
    CHECK_UNKNOWN(acquire_as(st, key, fp_a, &t2, 10000, 60000, false), STORE_CAUSE_UPSTREAM_RESET,
                  false);
    CHECK_RES(release(st, key, &t2), -ESTALE, -1);
    CHECK_RES(release(st, key, &t1), 0, STORE_OK);
    CHECK_RES(acquire_as(st, key, fp_b, &t2, 10000, 60000, false), 0, STORE_ACQUIRED);
    store_close(st);
}

static void test_unknown_record_is_kept_its_ttl_from_its_last_change(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token();
    char key[128];

    key_make(key, sizeof(key), "unknown-ttl");
    /* Kept lease + keep while locked: found unknown past the lease. */
    CHECK_RES(acquire_as(st, key, fp_a, &t1, 200, 700, false), 0, STORE_ACQUIRED);
    sleep_ms(500);
    CHECK_UNKNOWN(acquire_as(st, key, fp_a, &t2, 200, 700, false), STORE_CAUSE_HOLDER_LOST, true);
    sleep_ms(500); /* 1000 ms: past lease + keep, yet within keep of the change */
    CHECK_UNKNOWN(acquire_as(st, key, fp_a, &t2, 200, 700, false), STORE_CAUSE_HOLDER_LOST, false);
    sleep_ms(400); /* past keep from the change */
    CHECK_RES(acquire_as(st, key, fp_a, &t2, 200, 700, false), 0, STORE_ACQUIRED);
    store_close(st);
}

static void test_extend_keeps_the_lock_past_its_ttl(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token();
    char key[128];

    key_make(key, sizeof(key), "extend");
    CHECK_RES(acquire(st, key, fp_a, &t1, 400), 0, STORE_ACQUIRED);
    sleep_ms(150);
    CHECK_RES(extend(st, key, &t1, 1000), 0, STORE_OK); /* now due at about 1150 ms */
    sleep_ms(400);                                      /* 550 ms: past the first TTL */
    CHECK_RES(acquire(st, key, fp_a, &t2, 10000), 0, STORE_IN_FLIGHT);
    sleep_ms(800); /* 1350 ms: past the extended TTL */
    CHECK_RES(acquire(st, key, fp_a, &t2, 10000), 0, STORE_ACQUIRED);
    store_close(st);
}

static void test_completed_record_expires_after_its_ttl(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token();
    struct record *rec = sample_record(200, "ttl");
    char key[128];

    key_make(key, sizeof(key), "done-ttl");
    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, key, &t1, rec, 300), 0, STORE_OK);
    CHECK_RES(acquire(st, key, fp_b, &t2, 10000), 0, STORE_MISMATCH);
    sleep_ms(500);
    CHECK_RES(acquire(st, key, fp_b, &t2, 10000), 0, STORE_ACQUIRED);
    record_unref(rec);
    store_close(st);
}

/* doc/configuration.md, Tombstones: a store key <prefix><scope>:<key> as
 * the proxy makes it, so that Redis can make its tombstone's key. */
#define TOMB_PREFIX_LEN 5 /* "tomb:" */

static void tomb_key(char *buf, size_t size, const char *name)
{
    char k[96];

    key_make(k, sizeof(k), name);
    snprintf(buf, size, "tomb:0123456789abcdef0123456789abcdef:%s", k);
}

static struct res acquire_tomb(struct store *st, const char *key, const uint8_t *fp,
                               const struct store_token *tok, bool tombstones)
{
    struct call *c = call_new();
    const struct store_lock lk = { .lease_ms = 10000,
                                   .keep_ms = 60000,
                                   .take_over = true,
                                   .about = about_payment,
                                   .tombstones = tombstones,
                                   .prefix_len = TOMB_PREFIX_LEN };

    return call_finish(c, store_acquire(st, span_from_cstr(key), fp, tok, &lk, call_done, c));
}

static struct res complete_tomb(struct store *st, const char *key, const struct store_token *tok,
                                struct record *rec, uint64_t ttl_ms, uint64_t tomb_ms)
{
    struct call *c = call_new();
    struct store_link link = { .prefix_len = TOMB_PREFIX_LEN, .tomb_ms = tomb_ms };

    memcpy(link.fp, fp_a, FINGERPRINT_LEN);
    return call_finish(
        c, store_complete(st, span_from_cstr(key), tok, rec, ttl_ms, &link, call_done, c));
}

static struct res purge_tomb(struct store *st, const char *key)
{
    struct call *c = call_new();

    return call_finish(c, store_purge(st, span_from_cstr(key), TOMB_PREFIX_LEN, call_done, c));
}

/* A completed record that expires leaves its tombstone: an acquire with any
 * fingerprint is STORE_EXPIRED and locks nothing, until the tombstone's TTL
 * has run out, or it is purged; a route without tombstones locks over it. */
static void test_expired_record_leaves_a_tombstone(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token();
    struct record *rec = sample_record(200, "tomb");
    char k1[160], k2[160], k3[160], k4[160];

    tomb_key(k1, sizeof(k1), "tomb-1");
    tomb_key(k2, sizeof(k2), "tomb-2");
    tomb_key(k3, sizeof(k3), "tomb-3");
    tomb_key(k4, sizeof(k4), "tomb-4");
    CHECK_RES(acquire_tomb(st, k1, fp_a, &t1, true), 0, STORE_ACQUIRED);
    CHECK_RES(complete_tomb(st, k1, &t1, rec, 300, 60000), 0, STORE_OK);
    CHECK_RES(complete_tomb(st, k1, &t1, rec, 300, 60000), 0, STORE_OK); /* a retry */
    CHECK_RES(acquire_tomb(st, k1, fp_a, &t2, true), 0, STORE_COMPLETED);
    CHECK_RES(acquire_tomb(st, k1, fp_b, &t2, true), 0, STORE_MISMATCH);
    CHECK_RES(acquire_tomb(st, k2, fp_a, &t1, true), 0, STORE_ACQUIRED);
    CHECK_RES(complete_tomb(st, k2, &t1, rec, 300, 700), 0, STORE_OK);
    CHECK_RES(acquire_tomb(st, k3, fp_a, &t1, true), 0, STORE_ACQUIRED);
    CHECK_RES(complete_tomb(st, k3, &t1, rec, 300, 0), 0, STORE_OK); /* none kept */
    CHECK_RES(acquire_tomb(st, k4, fp_a, &t1, true), 0, STORE_ACQUIRED);
    CHECK_RES(complete_tomb(st, k4, &t1, rec, 300, 60000), 0, STORE_OK);
    sleep_ms(500);
    CHECK_RES(acquire_tomb(st, k1, fp_a, &t2, true), 0, STORE_EXPIRED);
    CHECK_RES(acquire_tomb(st, k1, fp_b, &t2, true), 0, STORE_EXPIRED); /* whatever its body */
    CHECK_RES(complete(st, k1, &t1, rec, 300), -ESTALE, -1);            /* no answer comes back */
    CHECK_RES(acquire_tomb(st, k2, fp_b, &t2, true), 0, STORE_EXPIRED);
    CHECK_RES(acquire_tomb(st, k3, fp_b, &t2, true), 0, STORE_ACQUIRED);
    CHECK_RES(acquire_tomb(st, k4, fp_b, &t2, false), 0, STORE_ACQUIRED); /* not looked at */
    CHECK_RES(purge_tomb(st, k1), 0, STORE_OK); /* the tombstone goes, the key runs again */
    CHECK_RES(acquire_tomb(st, k1, fp_b, &t2, true), 0, STORE_ACQUIRED);
    sleep_ms(700);
    CHECK_RES(acquire_tomb(st, k2, fp_b, &t2, true), 0, STORE_ACQUIRED); /* its TTL ran out */
    CHECK_RES(purge_tomb(st, k1), 0, STORE_OK);
    CHECK_RES(purge_tomb(st, k1), -ENOENT, -1);
    CHECK_RES(purge_tomb(st, k2), 0, STORE_OK);
    CHECK_RES(purge_tomb(st, k3), 0, STORE_OK);
    CHECK_RES(purge_tomb(st, k4), 0, STORE_OK);
    record_unref(rec);
    store_close(st);
}

/* Trace contexts (W3C traceparents, STORE_TRACE_LEN bytes) and one a byte short. */
#define TRACE_A "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#define TRACE_B "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
#define TRACE_SHORT "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0"

/* An acquire that locks with the trace context <trace> ("": none) for a
 * lease of <lease_ms>, the record kept a minute; a key of tomb_key()'s has
 * its tombstone looked for (a Redis Cluster: a probe, then the lock). */
static struct res acquire_traced(struct store *st, const char *key, const uint8_t *fp,
                                 const struct store_token *tok, uint64_t lease_ms, bool take_over,
                                 const char *trace)
{
    struct call *c = call_new();
    const struct store_lock lk = { .lease_ms = lease_ms,
                                   .keep_ms = 60000,
                                   .take_over = take_over,
                                   .about = about_payment,
                                   .tombstones = strncmp(key, "tomb:", 5) == 0,
                                   .prefix_len = TOMB_PREFIX_LEN,
                                   .trace = span_from_cstr(trace) };

    return call_finish(c, store_acquire(st, span_from_cstr(key), fp, tok, &lk, call_done, c));
}

/* Checks that an acquire was answered <want_status> with the trace context <want_trace>. */
#define CHECK_TRACE(expr, want_status, want_trace)                                                 \
    do {                                                                                           \
        struct res r_ = (expr);                                                                    \
        CHECK_EQ_INT(r_.ret, 0);                                                                   \
        CHECK_EQ_INT(r_.err, 0);                                                                   \
        CHECK_EQ_INT(r_.status, (want_status));                                                    \
        CHECK_EQ_STR(r_.trace, (want_trace));                                                      \
        record_unref(r_.rec);                                                                      \
    } while (0)

static void test_trace_context_is_kept_with_the_key(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token(), t3 = token();
    struct record *rec = sample_record(201, "traced");
    char k1[160], k2[160], k3[160], k4[160], k5[160];

    _Static_assert(sizeof(TRACE_A) - 1 == STORE_TRACE_LEN, "a traceparent");
    _Static_assert(sizeof(TRACE_SHORT) - 1 == STORE_TRACE_LEN - 1, "a byte short");
    /* Written with the lock; every acquire that finds the key gets it, after
     * complete too; the lock's own token sent again gets none. */
    key_make(k1, sizeof(k1), "trace");
    CHECK_TRACE(acquire_traced(st, k1, fp_a, &t1, 10000, true, TRACE_A), STORE_ACQUIRED, "");
    CHECK_TRACE(acquire_traced(st, k1, fp_a, &t2, 10000, true, TRACE_B), STORE_IN_FLIGHT, TRACE_A);
    CHECK_TRACE(acquire_traced(st, k1, fp_b, &t2, 10000, true, TRACE_B), STORE_MISMATCH, TRACE_A);
    CHECK_TRACE(acquire_traced(st, k1, fp_a, &t1, 10000, true, TRACE_A), STORE_ACQUIRED, "");
    CHECK_RES(complete(st, k1, &t1, rec, 60000), 0, STORE_OK);
    CHECK_TRACE(acquire_traced(st, k1, fp_a, &t2, 10000, true, TRACE_B), STORE_COMPLETED, TRACE_A);
    CHECK_TRACE(acquire_traced(st, k1, fp_b, &t2, 10000, true, ""), STORE_MISMATCH, TRACE_A);

    /* Unknown keeps it; a take-over writes its own. The same with a
     * tombstone looked for. */
    key_make(k2, sizeof(k2), "trace-unknown");
    tomb_key(k3, sizeof(k3), "trace-unknown-tomb");
    for (size_t i = 0; i < 2; i++) {
        const char *k = i == 0 ? k2 : k3;

        CHECK_TRACE(acquire_traced(st, k, fp_a, &t1, 10000, false, TRACE_A), STORE_ACQUIRED, "");
        CHECK_RES(mark_unknown(st, k, &t1, STORE_CAUSE_UPSTREAM_TIMEOUT, 60000), 0, STORE_OK);
        CHECK_TRACE(acquire_traced(st, k, fp_a, &t2, 10000, false, TRACE_B), STORE_UNKNOWN,
                    TRACE_A);
        CHECK_TRACE(acquire_traced(st, k, fp_a, &t2, 10000, true, TRACE_B), STORE_ACQUIRED, "");
        CHECK_TRACE(acquire_traced(st, k, fp_a, &t3, 10000, true, TRACE_A), STORE_IN_FLIGHT,
                    TRACE_B);
    }

    /* Lapsed: made unknown by a second acquire, the key keeps its holder's,
     * not that acquire's; taken over, the new holder's, even none. A
     * context of another length is kept as none, and a take-over of such a
     * lock writes its own. */
    key_make(k2, sizeof(k2), "trace-lost");
    key_make(k4, sizeof(k4), "trace-taken");
    key_make(k5, sizeof(k5), "trace-short");
    CHECK_TRACE(acquire_traced(st, k2, fp_a, &t1, 200, false, TRACE_A), STORE_ACQUIRED, "");
    CHECK_TRACE(acquire_traced(st, k4, fp_a, &t1, 200, true, TRACE_A), STORE_ACQUIRED, "");
    CHECK_TRACE(acquire_traced(st, k5, fp_a, &t1, 200, true, TRACE_SHORT), STORE_ACQUIRED, "");
    CHECK_TRACE(acquire_traced(st, k5, fp_a, &t2, 200, true, TRACE_B), STORE_IN_FLIGHT, "");
    sleep_ms(400);
    CHECK_TRACE(acquire_traced(st, k2, fp_a, &t2, 200, false, TRACE_B), STORE_UNKNOWN, TRACE_A);
    CHECK_TRACE(acquire_traced(st, k2, fp_a, &t3, 200, false, ""), STORE_UNKNOWN, TRACE_A);
    CHECK_TRACE(acquire_traced(st, k4, fp_a, &t2, 10000, true, ""), STORE_ACQUIRED, "");
    CHECK_TRACE(acquire_traced(st, k4, fp_a, &t3, 10000, true, TRACE_B), STORE_IN_FLIGHT, "");
    CHECK_RES(complete(st, k4, &t2, rec, 60000), 0, STORE_OK);
    CHECK_TRACE(acquire_traced(st, k4, fp_a, &t3, 10000, true, TRACE_B), STORE_COMPLETED, "");
    CHECK_TRACE(acquire_traced(st, k5, fp_a, &t2, 10000, true, TRACE_B), STORE_ACQUIRED, "");
    CHECK_TRACE(acquire_traced(st, k5, fp_a, &t3, 10000, true, ""), STORE_IN_FLIGHT, TRACE_B);
    record_unref(rec);
    store_close(st);
}

#define RACERS 24

struct racer {
    struct store *st;
    const char *key;
    struct call *call;
    int ret;
};

/* Starts an acquire from its own thread; the checks are made on the main
 * thread (CHECK is not thread-safe). */
static void *racer_main(void *arg)
{
    struct racer *ra = arg;
    struct store_token t;

    ra->ret = store_token_new(&t);
    if (ra->ret == 0) {
        ra->call = call_new();
        ra->ret = store_acquire(ra->st, span_from_cstr(ra->key), fp_a, &t,
                                &(struct store_lock){ .lease_ms = 10000, .keep_ms = 60000 },
                                call_done, ra->call);
    }
    return NULL;
}

static void test_concurrent_acquires_have_one_winner(void)
{
    struct store *st = store_open();
    struct racer racers[RACERS];
    pthread_t tids[RACERS];
    int acquired = 0, in_flight = 0;
    char key[128];

    key_make(key, sizeof(key), "race");
    for (int i = 0; i < RACERS; i++) {
        racers[i] = (struct racer){ .st = st, .key = key };
        CHECK_EQ_INT(pthread_create(&tids[i], NULL, racer_main, &racers[i]), 0);
    }
    for (int i = 0; i < RACERS; i++) {
        struct res r;

        pthread_join(tids[i], NULL);
        CHECK(racers[i].call != NULL);
        if (!racers[i].call)
            continue;
        r = call_finish(racers[i].call, racers[i].ret);
        CHECK_EQ_INT(r.ret, 0);
        CHECK_EQ_INT(r.err, 0);
        acquired += r.status == STORE_ACQUIRED;
        in_flight += r.status == STORE_IN_FLIGHT;
    }
    CHECK_EQ_INT(acquired, 1);
    CHECK_EQ_INT(in_flight, RACERS - 1);
    store_close(st);
}

static void count_done(void *ctx, int err, const struct store_result *res)
{
    (void)err;
    (void)res;
    sleep_ms(2); /* callbacks still running while store_free() is called */
    atomic_fetch_add((atomic_int *)ctx, 1);
    atomic_fetch_add(&callbacks, 1);
}

static void test_free_waits_for_every_callback(void)
{
    struct store *st = store_open();
    atomic_int done = 0;
    int n = 0;
    char key[128];

    for (int i = 0; i < 40; i++) {
        struct store_token t = token();

        key_make(key, sizeof(key), "free");
        if (store_acquire(st, span_from_cstr(key), fp_a, &t,
                          &(struct store_lock){ .lease_ms = 10000, .keep_ms = 60000 }, count_done,
                          &done) == 0)
            n++;
    }
    atomic_fetch_add(&accepted, n);
    CHECK_EQ_INT(n, 40);
    store_close(st);
    CHECK_EQ_INT(atomic_load(&done), n);
}

static void test_ready_after_a_successful_call(void)
{
    struct store *st = store_open();
    struct store_token t = token();
    char key[128];

    key_make(key, sizeof(key), "ready");
    CHECK_RES(acquire(st, key, fp_a, &t, 10000), 0, STORE_ACQUIRED);
    /* A cluster is ready once its slot map is known too: asked for at start. */
    for (int waited = 0; cluster_kind && !store_is_ready(st) && waited < 2000; waited += 20)
        sleep_ms(20);
    CHECK(store_is_ready(st));
    store_close(st);
}

/* ---- notifications and the operator's calls ---- */

struct heard {
    pthread_mutex_t mu;
    char keys[16][128];
    int n;
};

static void on_notify(void *ctx, struct span key)
{
    struct heard *h = ctx;

    pthread_mutex_lock(&h->mu);
    if (h->n < 16 && key.len < sizeof(h->keys[0])) {
        memcpy(h->keys[h->n], key.base, key.len);
        h->keys[h->n][key.len] = '\0';
        h->n++;
    }
    pthread_mutex_unlock(&h->mu);
}

/* Waits up to <ms> for <key> to be heard. */
static bool heard_key(struct heard *h, const char *key, unsigned ms)
{
    for (unsigned waited = 0;; waited += 20) {
        bool found = false;

        pthread_mutex_lock(&h->mu);
        for (int i = 0; i < h->n && !found; i++)
            found = strcmp(h->keys[i], key) == 0;
        pthread_mutex_unlock(&h->mu);
        if (found || waited >= ms)
            return found;
        sleep_ms(20);
    }
}

static void test_complete_and_release_notify_waiters(void)
{
    struct store *st = store_open();
    struct heard h = { .mu = PTHREAD_MUTEX_INITIALIZER };
    struct record *rec = sample_record(200, "notify");
    char key[128];
    bool subscribed = false;

    CHECK_EQ_INT(store_set_notify(st, on_notify, &h), 0);
    /* A release is heard (a Redis subscription starts in the background: the
     * first ones may go unheard). */
    for (int i = 0; i < 50 && !subscribed; i++) {
        struct store_token t = token();

        key_make(key, sizeof(key), "notify-warmup");
        CHECK_RES(acquire(st, key, fp_a, &t, 10000), 0, STORE_ACQUIRED);
        CHECK_RES(release(st, key, &t), 0, STORE_OK);
        subscribed = heard_key(&h, key, 100);
    }
    CHECK(subscribed);
    {
        struct store_token t = token(), other = token();

        key_make(key, sizeof(key), "notify-complete");
        CHECK_RES(acquire(st, key, fp_a, &t, 10000), 0, STORE_ACQUIRED);
        CHECK(!heard_key(&h, key, 50)); /* acquiring is no news */
        CHECK_RES(extend(st, key, &t, 10000), 0, STORE_OK);
        CHECK_RES(complete(st, key, &other, rec, 10000), -ESTALE, -1);
        CHECK(!heard_key(&h, key, 50)); /* nor a refused call */
        CHECK_RES(complete(st, key, &t, rec, 10000), 0, STORE_OK);
        CHECK(heard_key(&h, key, 2000));
    }
    record_unref(rec);
    store_close(st);
}

struct listed {
    struct call *c;
    struct store_info_list list;
};

static void on_list(void *ctx, int err, struct store_info_list *list)
{
    struct listed *l = ctx;

    l->list = *list;
    *list = (struct store_info_list){ 0 };
    call_done(l->c, err, err == 0 ? &(struct store_result){ .status = STORE_OK } : NULL);
}

static struct store_info_list inspect(struct store *st, const char *prefix, const char *key,
                                      bool with_body)
{
    struct listed l = { .c = call_new() };
    struct res r;

    l.c->on_pool = true;
    r = call_finish(l.c, store_inspect(st, span_from_cstr(prefix), span_from_cstr(key), with_body,
                                       on_list, &l));

    CHECK_EQ_INT(r.ret, 0);
    CHECK_EQ_INT(r.err, 0);
    return l.list;
}

static struct store_info_list find_resource(struct store *st, const char *prefix,
                                            const char *resource)
{
    struct listed l = { .c = call_new() };
    struct res r;

    l.c->on_pool = true;
    r = call_finish(l.c, store_find_resource(st, span_from_cstr(prefix), span_from_cstr(resource),
                                             true, on_list, &l));

    CHECK_EQ_INT(r.ret, 0);
    CHECK_EQ_INT(r.err, 0);
    return l.list;
}

/* Every page of store_list_unknown() under <prefix>: the store keys found,
 * space-separated and sorted, into <out>; the number of pages in <pages>. */
static void list_unknown_all(struct store *st, const char *prefix, char *out, size_t outlen,
                             int *pages)
{
    char cursor[STORE_CURSOR_MAX] = "", *found[64];
    size_t n = 0, used = 0;

    *pages = 0;
    out[0] = '\0';
    do {
        struct listed l = { .c = call_new() };
        struct res r;

        l.c->on_pool = true;
        r = call_finish(l.c, store_list_unknown(st, span_from_cstr(prefix), cursor, on_list, &l));
        CHECK_EQ_INT(r.ret, 0);
        CHECK_EQ_INT(r.err, 0);
        for (size_t i = 0; i < l.list.n && n < ARRAY_SIZE(found); i++) {
            CHECK(l.list.items[i].unknown);
            found[n++] = strdup(l.list.items[i].store_key);
        }
        snprintf(cursor, sizeof(cursor), "%s", l.list.cursor);
        store_info_list_done(&l.list);
        ++*pages;
    } while (cursor[0] && *pages < 1000);
    for (size_t i = 0; i < n; i++) { /* sorted: stores list in any order */
        for (size_t j = i + 1; j < n; j++) {
            if (strcmp(found[j], found[i]) < 0) {
                char *t = found[i];

                found[i] = found[j];
                found[j] = t;
            }
        }
        used += (size_t)snprintf(out + used, used < outlen ? outlen - used : 0, "%s%s",
                                 i ? " " : "", found[i]);
        free(found[i]);
    }
}

static struct res resolve(struct store *st, const char *store_key, struct record *rec)
{
    struct call *c = call_new();

    c->on_pool = true;
    return call_finish(c, store_resolve(st, span_from_cstr(store_key), rec, 60000, call_done, c));
}

static struct res probe_step(struct store *st, const char *store_key, enum store_probe_step step,
                             uint64_t sent_ms, struct record *rec)
{
    struct call *c = call_new();
    struct store_probe p = { .step = step,
                             .settle_ms = 300,
                             .every_ms = 400,
                             .attempts = 4,
                             .sent_ms = sent_ms,
                             .rec = rec,
                             .ttl_ms = 60000 };

    c->on_pool = true;
    return call_finish(c, store_probe(st, span_from_cstr(store_key), &p, call_done, c));
}

#define CHECK_PROBE(r, want)                                                                       \
    do {                                                                                           \
        struct res r_ = (r);                                                                       \
        CHECK_EQ_INT(r_.ret, 0);                                                                   \
        CHECK_EQ_INT(r_.err, 0);                                                                   \
        CHECK_EQ_INT(r_.status, STORE_OK);                                                         \
        CHECK_EQ_INT(r_.probe, (want));                                                            \
    } while (0)

/* The one store_info of <store_key>'s own key, inspected. */
static struct store_info_list inspect_one(struct store *st, const char *prefix,
                                          const char *store_key)
{
    const char *key = strchr(store_key + strlen(prefix), ':') + 1;
    struct store_info_list l = inspect(st, prefix, key, false);

    CHECK_EQ_INT(l.n, 1);
    return l;
}

/* Reconcile (doc/configuration.md): the store paces an unknown key's probes
 * (settle, every, attempts) for every proxy, keeps their count and last
 * result in the record, completes a found key, and releases one found
 * absent twice in a row at least STORE_ABSENT_GAP_MS apart. */
static void test_probes_are_paced_counted_and_settle_the_key(void)
{
    struct store *st = store_open();
    struct store_token t[6];
    struct record *rec = sample_record(201, "reconciled");
    char prefix[64], k[6][128], gone[128];
    struct res r, c0, c2, c4, c5;
    struct store_info_list l;

    snprintf(prefix, sizeof(prefix), "test:%ld:probe:", (long)getpid());
    for (int i = 0; i < 6; i++) {
        t[i] = token();
        snprintf(k[i], sizeof(k[i]), "%s%032x:pay-%d", prefix, 7, i);
        CHECK_RES(acquire_as(st, k[i], fp_a, &t[i], 10000, 60000, false), 0, STORE_ACQUIRED);
        if (i != 3) /* k[3] stays locked */
            CHECK_RES(mark_unknown(st, k[i], &t[i], STORE_CAUSE_UPSTREAM_RESET, 60000), 0,
                      STORE_OK);
    }
    /* settle: not before 300 ms after the key became unknown */
    r = probe_step(st, k[0], STORE_PROBE_CLAIM, 0, NULL);
    CHECK_PROBE(r, STORE_PROBE_LATER);
    CHECK(r.probe_ms > 0 && r.probe_ms <= 300);
    CHECK_PROBE(probe_step(st, k[3], STORE_PROBE_CLAIM, 0, NULL), STORE_PROBE_KNOWN);
    snprintf(gone, sizeof(gone), "%s%032x:none", prefix, 7);
    CHECK_RES(probe_step(st, gone, STORE_PROBE_CLAIM, 0, NULL), -ENOENT, -1);
    sleep_ms(350);
    c0 = probe_step(st, k[0], STORE_PROBE_CLAIM, 0, NULL);
    CHECK_PROBE(c0, STORE_PROBE_CLAIMED);
    CHECK_EQ_INT(c0.probes, 1);
    CHECK(c0.probe_ms > 0);
    r = probe_step(st, k[0], STORE_PROBE_CLAIM, 0, NULL); /* every: 400 ms */
    CHECK_PROBE(r, STORE_PROBE_LATER);
    CHECK(r.probe_ms > 0 && r.probe_ms <= 400);
    CHECK_PROBE(probe_step(st, k[0], STORE_PROBE_FAILED, c0.probe_ms, NULL), STORE_PROBE_NOTED);
    l = inspect_one(st, prefix, k[0]);
    CHECK(l.n == 1 && l.items[0].unknown && l.items[0].probes == 1 &&
          l.items[0].last_result == STORE_PROBE_WAS_FAILED);
    store_info_list_done(&l);

    /* found: the key is completed with the answer; later steps change nothing */
    r = probe_step(st, k[1], STORE_PROBE_CLAIM, 0, NULL);
    CHECK_PROBE(r, STORE_PROBE_CLAIMED);
    CHECK_PROBE(probe_step(st, k[1], STORE_PROBE_FOUND, r.probe_ms, rec), STORE_PROBE_NOTED);
    r = acquire_as(st, k[1], fp_a, &t[3], 10000, 60000, false);
    CHECK_EQ_INT(r.status, STORE_COMPLETED);
    CHECK(r.rec && record_equal(r.rec, rec));
    record_unref(r.rec);
    CHECK_PROBE(probe_step(st, k[1], STORE_PROBE_CLAIM, 0, NULL), STORE_PROBE_KNOWN);
    CHECK_PROBE(probe_step(st, k[1], STORE_PROBE_ABSENT, r.probe_ms, NULL), STORE_PROBE_KNOWN);
    CHECK_PROBE(probe_step(st, k[1], STORE_PROBE_FOUND, 0, rec), STORE_PROBE_KNOWN);

    /* absent twice, the second too soon after the first: noted, not released;
     * k[2]: absent, failed, absent: the run was broken */
    c2 = probe_step(st, k[2], STORE_PROBE_CLAIM, 0, NULL);
    CHECK_PROBE(c2, STORE_PROBE_CLAIMED);
    CHECK_PROBE(probe_step(st, k[2], STORE_PROBE_ABSENT, c2.probe_ms, NULL), STORE_PROBE_NOTED);
    CHECK_PROBE(probe_step(st, k[2], STORE_PROBE_FAILED, c2.probe_ms, NULL), STORE_PROBE_NOTED);
    c5 = probe_step(st, k[5], STORE_PROBE_CLAIM, 0, NULL);
    CHECK_PROBE(c5, STORE_PROBE_CLAIMED);
    CHECK_PROBE(probe_step(st, k[5], STORE_PROBE_ABSENT, c5.probe_ms, NULL), STORE_PROBE_NOTED);
    CHECK_PROBE(probe_step(st, k[5], STORE_PROBE_ABSENT, c5.probe_ms + 500, NULL),
                STORE_PROBE_NOTED);
    l = inspect_one(st, prefix, k[5]);
    CHECK(l.n == 1 && l.items[0].unknown && l.items[0].last_result == STORE_PROBE_WAS_ABSENT);
    store_info_list_done(&l);
    c4 = probe_step(st, k[4], STORE_PROBE_CLAIM, 0, NULL);
    CHECK_PROBE(c4, STORE_PROBE_CLAIMED);
    CHECK_PROBE(probe_step(st, k[4], STORE_PROBE_ABSENT, c4.probe_ms, NULL), STORE_PROBE_NOTED);
    sleep_ms(1100);
    /* k[4] is released by hand, runs again and becomes unknown again: its
     * probes start from none, and a probe claimed before is of the earlier
     * period: it changes nothing */
    CHECK_RES(purge_call(st, k[4]), 0, STORE_OK);
    CHECK_RES(acquire_as(st, k[4], fp_a, &t[4], 10000, 60000, false), 0, STORE_ACQUIRED);
    CHECK_RES(mark_unknown(st, k[4], &t[4], STORE_CAUSE_UPSTREAM_RESET, 60000), 0, STORE_OK);
    CHECK_PROBE(probe_step(st, k[4], STORE_PROBE_ABSENT, c4.probe_ms + 1000, NULL),
                STORE_PROBE_KNOWN);
    CHECK_PROBE(probe_step(st, k[4], STORE_PROBE_FAILED, c4.probe_ms, NULL), STORE_PROBE_KNOWN);
    CHECK_PROBE(probe_step(st, k[4], STORE_PROBE_FOUND, c4.probe_ms, rec), STORE_PROBE_KNOWN);
    l = inspect_one(st, prefix, k[4]);
    CHECK(l.n == 1 && l.items[0].unknown && l.items[0].probes == 0 &&
          l.items[0].last_result == STORE_PROBE_NONE);
    store_info_list_done(&l);
    r = probe_step(st, k[2], STORE_PROBE_CLAIM, 0, NULL);
    CHECK_PROBE(r, STORE_PROBE_CLAIMED);
    CHECK_EQ_INT(r.probes, 2);
    CHECK(r.probe_ms >= c2.probe_ms + STORE_ABSENT_GAP_MS);
    CHECK_PROBE(probe_step(st, k[2], STORE_PROBE_ABSENT, r.probe_ms, NULL), STORE_PROBE_NOTED);
    CHECK_EQ_INT(acquire_as(st, k[2], fp_a, &t[3], 10000, 60000, false).status, STORE_UNKNOWN);
    /* k[5]: the second absent of its run, a second after the first: released */
    r = probe_step(st, k[5], STORE_PROBE_CLAIM, 0, NULL);
    CHECK_PROBE(r, STORE_PROBE_CLAIMED);
    CHECK_PROBE(probe_step(st, k[5], STORE_PROBE_ABSENT, r.probe_ms, NULL), STORE_PROBE_RELEASED);
    CHECK_RES(acquire_as(st, k[5], fp_a, &t[3], 10000, 60000, false), 0, STORE_ACQUIRED);

    /* attempts: 4 in all, whatever their results */
    for (int i = 2; i <= 4; i++) {
        sleep_ms(i == 2 ? 0 : 420);
        r = probe_step(st, k[0], STORE_PROBE_CLAIM, 0, NULL);
        CHECK_PROBE(r, STORE_PROBE_CLAIMED);
        CHECK_EQ_INT(r.probes, (unsigned)i);
        CHECK_PROBE(probe_step(st, k[0], STORE_PROBE_FAILED, r.probe_ms, NULL), STORE_PROBE_NOTED);
    }
    sleep_ms(420);
    CHECK_PROBE(probe_step(st, k[0], STORE_PROBE_CLAIM, 0, NULL), STORE_PROBE_SPENT);
    l = inspect_one(st, prefix, k[0]);
    CHECK(l.n == 1 && l.items[0].unknown && l.items[0].probes == 4);
    store_info_list_done(&l);
    for (int i = 0; i < 6; i++)
        purge_call(st, k[i]);
    record_unref(rec);
    store_close(st);
}

/* Resource links (doc/configuration.md): a complete with a link keeps the
 * resource with the record (a mismatch names it) and finds the record from
 * the resource, in every scope, as long as the record lives. */
static void test_resource_links_find_the_record(void)
{
    struct store *st = store_open();
    struct record *rec = sample_record(201, "linked");
    struct store_token t1 = token(), t2 = token(), t3 = token(), t4 = token();
    char prefix[64], k1[200], k2[200], k3[200];
    const char *res = "/v1/pay*ments/pay_?7[x]"; /* glob characters too */
    struct store_info_list l;

    snprintf(prefix, sizeof(prefix), "test:%ld:res:", (long)getpid());
    snprintf(k1, sizeof(k1), "%s%032x:order-1", prefix, 1);
    snprintf(k2, sizeof(k2), "%s%032x:order-2", prefix, 2);
    snprintf(k3, sizeof(k3), "%s%032x:order-3", prefix, 3);
    CHECK_RES(acquire(st, k1, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete_linked(st, k1, &t1, rec, 60000, res, strlen(prefix)), 0, STORE_OK);
    CHECK_RES(acquire(st, k2, fp_a, &t2, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete_linked(st, k2, &t2, rec, 1000, res, strlen(prefix)), 0, STORE_OK);
    CHECK_RES(acquire(st, k3, fp_a, &t3, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, k3, &t3, rec, 60000), 0, STORE_OK);
    /* A retry of a linked complete is done too (and writes the link again). */
    CHECK_RES(complete_linked(st, k1, &t1, rec, 60000, res, strlen(prefix)), 0, STORE_OK);

    l = find_resource(st, prefix, res);
    CHECK_EQ_INT(l.n, 2);
    for (size_t i = 0; i < l.n; i++) {
        const struct store_info *in = &l.items[i];

        CHECK(strcmp(in->store_key, k1) == 0 || strcmp(in->store_key, k2) == 0);
        CHECK(in->completed && in->rec && record_equal(in->rec, rec));
        CHECK(in->resource && strcmp(in->resource, res) == 0);
    }
    store_info_list_done(&l);
    l = find_resource(st, prefix, "/v1/payments/pay_x7x");
    CHECK_EQ_INT(l.n, 0);
    store_info_list_done(&l);
    l = find_resource(st, "test:another:", res);
    CHECK_EQ_INT(l.n, 0);
    store_info_list_done(&l);
    l = inspect(st, prefix, "order-1", false);
    CHECK(l.n == 1 && l.items[0].resource && strcmp(l.items[0].resource, res) == 0);
    store_info_list_done(&l);

    {
        struct res r = acquire(st, k1, fp_b, &t4, 10000);

        CHECK_EQ_INT(r.status, STORE_MISMATCH);
        CHECK_EQ_STR(r.about, res);
        record_unref(r.rec);
        r = acquire(st, k3, fp_b, &t4, 10000);
        CHECK_EQ_INT(r.status, STORE_MISMATCH);
        CHECK_EQ_STR(r.about, ""); /* completed without a link */
        record_unref(r.rec);
    }
    sleep_ms(1300); /* k2's record, and its link, expire */
    l = find_resource(st, prefix, res);
    CHECK_EQ_INT(l.n, 1);
    CHECK(l.n == 1 && strcmp(l.items[0].store_key, k1) == 0);
    store_info_list_done(&l);
    record_unref(rec);
    store_close(st);
}

static void test_list_unknown_and_resolve(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token(), t3 = token(), t4 = token();
    struct record *rec = sample_record(201, "resolved");
    char prefix[64], k1[128], k2[128], k3[128], k4[128], want[512], got[2048];
    struct res r;
    int pages;

    snprintf(prefix, sizeof(prefix), "test:%ld:lu:", (long)getpid());
    snprintf(k1, sizeof(k1), "%s%032x:{a}pay-1", prefix, 1);
    snprintf(k2, sizeof(k2), "%s%032x:{a}pay-2", prefix, 2);
    snprintf(k3, sizeof(k3), "%s%032x:{b}pay-3", prefix, 3);
    snprintf(k4, sizeof(k4), "%s%032x:{c}pay-4", prefix, 4);
    CHECK_RES(acquire_as(st, k1, fp_a, &t1, 10000, 60000, false), 0, STORE_ACQUIRED);
    CHECK_RES(mark_unknown(st, k1, &t1, STORE_CAUSE_UPSTREAM_RESET, 60000), 0, STORE_OK);
    CHECK_RES(acquire_as(st, k2, fp_a, &t2, 10000, 60000, false), 0, STORE_ACQUIRED); /* locked */
    CHECK_RES(acquire_as(st, k3, fp_a, &t3, 10000, 60000, false), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, k3, &t3, rec, 60000), 0, STORE_OK);
    CHECK_RES(acquire_as(st, k4, fp_a, &t4, 100, 60000, false), 0, STORE_ACQUIRED);
    sleep_ms(200);
    CHECK_EQ_INT(acquire_as(st, k4, fp_a, &t1, 100, 60000, false).status, STORE_UNKNOWN);

    list_unknown_all(st, prefix, got, sizeof(got), &pages);
    snprintf(want, sizeof(want), "%s %s", k1, k4);
    CHECK_EQ_STR(got, want);
    CHECK(pages >= 1);

    /* An operator's answer completes an unknown key only. */
    CHECK_RES(resolve(st, k2, rec), -EBUSY, -1);
    CHECK_RES(resolve(st, k3, rec), -EBUSY, -1);
    snprintf(want, sizeof(want), "%s%032x:{a}none", prefix, 9);
    CHECK_RES(resolve(st, want, rec), -ENOENT, -1);
    CHECK_RES(resolve(st, k1, rec), 0, STORE_OK);
    CHECK_RES(resolve(st, k1, rec), -EBUSY, -1);
    r = acquire_as(st, k1, fp_a, &t2, 10000, 60000, false);
    CHECK_EQ_INT(r.status, STORE_COMPLETED);
    CHECK(record_equal(r.rec, rec));
    record_unref(r.rec);
    list_unknown_all(st, prefix, got, sizeof(got), &pages);
    CHECK_EQ_STR(got, k4);
    CHECK_RES(purge_call(st, k1), 0, STORE_OK);
    CHECK_RES(purge_call(st, k2), 0, STORE_OK);
    CHECK_RES(purge_call(st, k3), 0, STORE_OK);
    CHECK_RES(purge_call(st, k4), 0, STORE_OK);
    record_unref(rec);
    store_close(st);
}

static void test_inspect_lists_every_scope_and_purge_frees(void)
{
    struct store *st = store_open();
    struct record *rec = sample_record(201, "inspect");
    struct store_token t1 = token(), t2 = token(), t3 = token();
    char prefix[64], k1[160], k2[160], k3[160], other[160];
    const char *key = "order-7*?[x]";
    struct store_info_list l;

    snprintf(prefix, sizeof(prefix), "test:%ld:insp:", (long)getpid());
    snprintf(k1, sizeof(k1), "%s%032x:%s", prefix, 1, key);
    snprintf(k2, sizeof(k2), "%s%032x:%s", prefix, 2, key);
    snprintf(k3, sizeof(k3), "%s%032x:%s", prefix, 3, "order-7"); /* another key */
    snprintf(other, sizeof(other), "%sXYZ:%s", prefix, key);      /* not a scope */
    CHECK_RES(acquire(st, k1, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, k1, &t1, rec, 60000), 0, STORE_OK);
    CHECK_RES(acquire(st, k2, fp_b, &t2, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(acquire(st, k3, fp_a, &t3, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(acquire(st, other, fp_a, &t3, 10000), 0, STORE_ACQUIRED);

    l = inspect(st, prefix, key, false);
    CHECK_EQ_INT(l.n, 2);
    for (size_t i = 0; i < l.n; i++) {
        const struct store_info *in = &l.items[i];

        if (strcmp(in->store_key, k1) == 0) {
            CHECK(in->completed);
            CHECK(in->rec && in->rec->status == 201 && in->rec->body.len == 0);
            CHECK(in->ttl_ms > 50000 && in->ttl_ms <= 60000);
        } else {
            CHECK_EQ_STR(in->store_key, k2);
            CHECK(!in->completed && !in->unknown && !in->rec);
            CHECK(in->lease_ms > 5000 && in->lease_ms <= 10000);
            CHECK(in->ttl_ms > 65000 && in->ttl_ms <= 70000); /* the lease, then a minute */
        }
        CHECK(in->age_ms < 5000);
        CHECK_EQ_INT(strlen(in->fp_hex), FINGERPRINT_HEX);
    }
    store_info_list_done(&l);
    l = inspect(st, prefix, key, true);
    for (size_t i = 0; i < l.n; i++) {
        if (l.items[i].completed)
            CHECK(record_equal(l.items[i].rec, rec));
    }
    store_info_list_done(&l);

    CHECK_RES(purge_call(st, k1), 0, STORE_OK);
    CHECK_RES(purge_call(st, k1), -ENOENT, -1);
    CHECK_RES(purge_call(st, k2), 0, STORE_OK); /* a lock too */
    l = inspect(st, prefix, key, false);
    CHECK_EQ_INT(l.n, 0);
    store_info_list_done(&l);
    CHECK_RES(acquire(st, k1, fp_b, &t1, 10000), 0, STORE_ACQUIRED); /* runs again */
    record_unref(rec);
    store_close(st);
}

/* ---- memory only ---- */

#define MEM_REAP_MS 100

static int make_memory(struct worker_pool *p, struct store **ret)
{
    return store_memory_new(64u << 20, MEM_REAP_MS, p, ret);
}

static struct store *memory_open(size_t max_bytes)
{
    struct store *st = NULL;

    CHECK_EQ_INT(store_memory_new(max_bytes, MEM_REAP_MS, pool, &st), 0);
    if (!st)
        exit(1);
    return st;
}

static struct store_memory_stats mem_stats(struct store *st)
{
    struct store_memory_stats s;

    store_memory_stats(st, &s);
    return s;
}

/* A 1 KiB record, sized as the upstream makes it: the buffer holds the body exactly. */
static struct record *kib_record(void)
{
    struct record *rec = record_new(1024);
    char body[1024];

    if (!rec)
        abort();
    rec->status = 201;
    CHECK_EQ_INT(record_add_header(rec, SPAN_LIT("Content-Type"), SPAN_LIT("application/json")), 0);
    CHECK_EQ_INT(
        record_add_header(rec, SPAN_LIT("Date"), SPAN_LIT("Sat, 21 Nov 2026 10:00:00 GMT")), 0);
    memset(body, 'x', sizeof(body));
    CHECK_EQ_INT(buf_reserve(&rec->body, sizeof(body)), 0);
    CHECK_EQ_INT(buf_append(&rec->body, body, sizeof(body)), 0);
    return rec;
}

/* Acquires and completes <key> with <rec>. */
static void store_one(struct store *st, const char *key, struct record *rec, uint64_t ttl_ms)
{
    struct store_token t = token();

    CHECK_RES(acquire(st, key, fp_a, &t, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, key, &t, rec, ttl_ms), 0, STORE_OK);
}

static void test_memory_rejects_bad_arguments(void)
{
    struct store *st = NULL;

    CHECK_EQ_INT(store_memory_new(0, MEM_REAP_MS, pool, &st), -EINVAL);
    CHECK_EQ_INT(store_memory_new(1 << 20, 0, pool, &st), -EINVAL);
    CHECK_EQ_INT(store_memory_new(1 << 20, MEM_REAP_MS, NULL, &st), -EINVAL);
    CHECK(st == NULL);
    st = memory_open(1 << 20);
    CHECK(store_is_memory(st));
    CHECK_EQ_INT(mem_stats(st).max_bytes, 1 << 20);
    store_close(st);
}

static void test_memory_counts_keys_headers_and_bodies(void)
{
    struct store *st = memory_open(64u << 20);
    struct record *rec = kib_record();
    struct store_token t = token();
    struct store_memory_stats s;
    size_t per_lock, per_record = record_mem_bytes(rec);
    char key[128];

    key_make(key, sizeof(key), "acct-lock");
    per_lock = store_memory_entry_bytes(strlen(key));
    CHECK_RES(acquire(st, key, fp_a, &t, 10000), 0, STORE_ACQUIRED);
    s = mem_stats(st);
    CHECK_EQ_INT(s.bytes, per_lock);
    CHECK_EQ_INT(s.entries, 1);
    CHECK_EQ_INT(s.locks, 1);
    CHECK_RES(complete(st, key, &t, rec, 10000), 0, STORE_OK);
    s = mem_stats(st);
    CHECK_EQ_INT(s.bytes, per_lock + per_record);
    CHECK_EQ_INT(s.locks, 0);
    /* A 1 KiB body with two headers: the body plus a few hundred bytes. */
    CHECK(per_record > 1024 + 2 * 16 && per_record < 1024 + 600);
    CHECK(per_lock > strlen(key) && per_lock < strlen(key) + 300);

    /* Known keys cost nothing more; a released lock gives its bytes back. */
    CHECK_RES(acquire(st, key, fp_a, &t, 10000), 0, STORE_COMPLETED);
    key_make(key, sizeof(key), "acct-released");
    CHECK_RES(acquire(st, key, fp_a, &t, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(release(st, key, &t), 0, STORE_OK);
    CHECK_EQ_INT(mem_stats(st).bytes, per_lock + per_record);
    CHECK_EQ_INT(mem_stats(st).entries, 1);
    record_unref(rec);
    store_close(st);
}

static void test_memory_counts_trace_contexts(void)
{
    struct store *st = memory_open(64u << 20);
    struct store_token t1 = token(), t2 = token();
    struct record *rec = kib_record();
    size_t per_lock, per_record = record_mem_bytes(rec);
    char key[128], tomb[160];

    /* A lock with a trace context counts it; one without costs nothing for it. */
    key_make(key, sizeof(key), "acct-trace");
    per_lock = store_memory_entry_bytes(strlen(key));
    CHECK_TRACE(acquire_traced(st, key, fp_a, &t1, 10000, true, TRACE_A), STORE_ACQUIRED, "");
    CHECK_EQ_INT(mem_stats(st).bytes, per_lock + STORE_TRACE_LEN);
    CHECK_EQ_INT(mem_stats(st).lock_bytes, per_lock + STORE_TRACE_LEN);
    CHECK_RES(release(st, key, &t1), 0, STORE_OK);
    CHECK_EQ_INT(mem_stats(st).bytes, 0);
    CHECK_EQ_INT(mem_stats(st).lock_bytes, 0);

    /* A take-over that brings one to a lock that had none: counted with the
     * lock, then with the record, and given back with it. */
    CHECK_TRACE(acquire_traced(st, key, fp_a, &t1, 200, true, ""), STORE_ACQUIRED, "");
    CHECK_EQ_INT(mem_stats(st).bytes, per_lock);
    sleep_ms(400);
    CHECK_TRACE(acquire_traced(st, key, fp_a, &t2, 10000, true, TRACE_B), STORE_ACQUIRED, "");
    CHECK_EQ_INT(mem_stats(st).bytes, per_lock + STORE_TRACE_LEN);
    CHECK_EQ_INT(mem_stats(st).lock_bytes, per_lock + STORE_TRACE_LEN);
    CHECK_RES(complete(st, key, &t2, rec, 10000), 0, STORE_OK);
    CHECK_EQ_INT(mem_stats(st).bytes, per_lock + STORE_TRACE_LEN + per_record);
    CHECK_EQ_INT(mem_stats(st).lock_bytes, 0);
    CHECK_TRACE(acquire_traced(st, key, fp_a, &t1, 10000, true, ""), STORE_COMPLETED, TRACE_B);
    CHECK_RES(purge_call(st, key), 0, STORE_OK);
    CHECK_EQ_INT(mem_stats(st).bytes, 0);

    /* A tombstone is the entry: its room stays counted until it goes. */
    tomb_key(tomb, sizeof(tomb), "acct-trace-tomb");
    CHECK_TRACE(acquire_traced(st, tomb, fp_a, &t1, 10000, true, TRACE_A), STORE_ACQUIRED, "");
    CHECK_RES(complete_tomb(st, tomb, &t1, rec, 300, 60000), 0, STORE_OK);
    sleep_ms(500);
    CHECK_TRACE(acquire_traced(st, tomb, fp_a, &t2, 10000, true, TRACE_B), STORE_EXPIRED, "");
    CHECK_EQ_INT(mem_stats(st).bytes, store_memory_entry_bytes(strlen(tomb)) + STORE_TRACE_LEN);
    CHECK_RES(purge_tomb(st, tomb), 0, STORE_OK);
    CHECK_EQ_INT(mem_stats(st).bytes, 0);
    record_unref(rec);
    store_close(st);
}

static void test_memory_evicts_oldest_completed_first(void)
{
    char key[128], keys[40][128];
    struct record *rec = kib_record();
    size_t per = record_mem_bytes(rec) +
                 store_memory_entry_bytes(strlen(key_make(key, sizeof(key), "evict-probe")));
    struct store *st = memory_open(10 * per + per / 2); /* room for ten */
    struct store_token t = token();
    struct store_memory_stats s;

    for (int i = 0; i < 40; i++) {
        key_make(keys[i], sizeof(keys[i]), "evict-probe");
        store_one(st, keys[i], rec, 60000);
        s = mem_stats(st);
        CHECK(s.bytes <= s.max_bytes);
    }
    s = mem_stats(st);
    CHECK_EQ_INT(s.evictions, 30);
    CHECK_EQ_INT(s.entries, 10);
    /* The ten newest are kept, the thirty oldest are gone. */
    for (int i = 30; i < 40; i++)
        CHECK_RES(acquire(st, keys[i], fp_a, &t, 10000), 0, STORE_COMPLETED);
    CHECK_RES(acquire(st, keys[0], fp_b, &t, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(acquire(st, keys[29], fp_b, &t, 10000), 0, STORE_ACQUIRED);
    record_unref(rec);
    store_close(st);
}

#define LOCK_TRIES 40

static void test_memory_never_evicts_a_lock(void)
{
    char key[128], locks[LOCK_TRIES][128];
    struct record *rec = kib_record();
    size_t lock = store_memory_entry_bytes(strlen(key_make(key, sizeof(key), "lock-probe")));
    size_t per_record = record_mem_bytes(rec);
    size_t budget = 4 * (per_record + lock);
    struct store *st = memory_open(budget);
    struct store_token held[LOCK_TRIES], t = token();
    struct store_memory_stats s;
    uint64_t evicted_for_locks = 0;
    int granted = 0;

    /* Completed records first: more than fit, so the oldest are evicted. */
    for (int i = 0; i < 10; i++) {
        key_make(key, sizeof(key), "lock-probe-done");
        store_one(st, key, rec, 60000);
    }
    CHECK(mem_stats(st).evictions > 0);
    for (int i = 0; i < LOCK_TRIES; i++) {
        struct res r;

        held[i] = token();
        key_make(locks[i], sizeof(locks[i]), "lock-probe");
        r = acquire(st, locks[i], fp_a, &held[i], 60000);
        CHECK_EQ_INT(r.ret, 0);
        if (r.err == 0 && r.status == STORE_ACQUIRED) {
            CHECK_EQ_INT(i, granted); /* once refused, refused until something is freed */
            granted++;
            evicted_for_locks = mem_stats(st).evictions;
        } else {
            CHECK_EQ_INT(r.err, -ENOSPC);
        }
    }
    /* A refused lock evicted nothing: it could not have been granted anyway. */
    CHECK_EQ_INT(mem_stats(st).evictions, evicted_for_locks);
    /* Locks get half the budget, and no more; records made way for them. */
    s = mem_stats(st);
    CHECK_EQ_INT(s.locks, granted);
    CHECK(s.lock_bytes <= budget / 2 && s.lock_bytes + 2 * lock > budget / 2);
    CHECK(s.bytes <= s.max_bytes);
    CHECK(granted > 5 && granted < LOCK_TRIES);
    /* A full store still answers for the keys it knows, and still fences. */
    CHECK_RES(acquire(st, locks[0], fp_b, &t, 10000), 0, STORE_MISMATCH);
    CHECK_RES(complete(st, locks[0], &t, rec, 60000), -ESTALE, -1);

    /* Every holder can store its answer, however full: older records make
     * way, and the locks still running are never touched. */
    for (int i = 0; i < granted; i++) {
        CHECK_RES(complete(st, locks[i], &held[i], rec, 60000), 0, STORE_OK);
        CHECK_RES(acquire(st, locks[i], fp_a, &t, 10000), 0, STORE_COMPLETED);
        for (int j = i + 1; j < granted; j++)
            CHECK_RES(acquire(st, locks[j], fp_a, &t, 10000), 0, STORE_IN_FLIGHT);
        CHECK(mem_stats(st).bytes <= budget);
    }
    s = mem_stats(st);
    CHECK_EQ_INT(s.locks, 0);
    CHECK_EQ_INT(s.lock_bytes, 0);
    /* With the locks gone, new keys are served again. */
    key_make(key, sizeof(key), "lock-probe");
    CHECK_RES(acquire(st, key, fp_a, &t, 60000), 0, STORE_ACQUIRED);
    record_unref(rec);
    store_close(st);
}

/* A record must fit in the half of the budget that locks cannot take. */
static void test_memory_record_over_half_the_budget_is_e2big(void)
{
    struct store *st = memory_open(9000);
    struct record *rec = record_new(8192);
    struct store_token t = token();
    char body[5000] = { 0 }, key[128];

    if (!rec)
        abort();
    rec->status = 200;
    CHECK_EQ_INT(buf_append(&rec->body, body, sizeof(body)), 0);
    key_make(key, sizeof(key), "huge");
    CHECK_RES(acquire(st, key, fp_a, &t, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(complete(st, key, &t, rec, 10000), -E2BIG, -1);
    t = token();
    CHECK_RES(acquire(st, key, fp_a, &t, 10000), 0, STORE_IN_FLIGHT); /* still its lock */
    record_unref(rec);
    store_close(st);
}

static void test_memory_reclaims_expired_without_being_asked(void)
{
    struct store *st = memory_open(64u << 20);
    struct record *rec = kib_record();
    struct store_token t;
    struct store_memory_stats s;
    char key[128];

    for (int i = 0; i < 50; i++) {
        key_make(key, sizeof(key), "reap");
        store_one(st, key, rec, 150);
        t = token();
        key_make(key, sizeof(key), "reap-lock");
        CHECK_RES(acquire_as(st, key, fp_a, &t, 100, 50, false), 0, STORE_ACQUIRED);
    }
    CHECK_EQ_INT(mem_stats(st).entries, 100);
    sleep_ms(150 + 3 * MEM_REAP_MS);
    s = mem_stats(st);
    CHECK_EQ_INT(s.entries, 0);
    CHECK_EQ_INT(s.locks, 0);
    CHECK_EQ_INT(s.bytes, 0);
    CHECK_EQ_INT(s.expired, 100);
    CHECK_EQ_INT(s.evictions, 0);
    record_unref(rec);
    store_close(st);
}

#define STRESS_THREADS 8
#define STRESS_OPS 1500
#define STRESS_KEYS 48

struct stresser {
    struct store *st;
    struct record *rec;
    unsigned seed;
    int bad; /* answers outside the contract */
};

/* Each thread runs its own random walk over shared keys on a small budget:
 * acquires, completes, releases, extends, with evictions and expiry. */
static void *stress_main(void *arg)
{
    struct stresser *s = arg;

    off_main_bad = &s->bad;
    for (int i = 0; i < STRESS_OPS; i++) {
        char key[64];
        struct store_token t;
        struct res r;
        unsigned k = (unsigned)rand_r(&s->seed) % STRESS_KEYS;

        snprintf(key, sizeof(key), "stress:%ld:%u", (long)getpid(), k);
        if (store_token_new(&t) < 0)
            abort();
        /* Everything lives 80 ms at most: lease and keep, a record, an unknown one. */
        r = acquire_as(s->st, key, k % 2 ? fp_a : fp_b, &t, 1 + (unsigned)rand_r(&s->seed) % 50,
                       1 + (unsigned)rand_r(&s->seed) % 30, rand_r(&s->seed) % 2);
        record_unref(r.rec);
        if (r.err == -ENOSPC)
            continue;
        if (r.err != 0 || r.status < 0)
            s->bad++;
        if (r.status != STORE_ACQUIRED)
            continue;
        switch (rand_r(&s->seed) % 4) {
        case 0:
            r = complete(s->st, key, &t, s->rec, 1 + (unsigned)rand_r(&s->seed) % 80);
            break;
        case 1:
            r = release(s->st, key, &t);
            break;
        case 2:
            r = mark_unknown(s->st, key, &t, STORE_CAUSE_UPSTREAM_RESET,
                             1 + (unsigned)rand_r(&s->seed) % 80);
            break;
        default:
            r = extend(s->st, key, &t, 20);
            break;
        }
        if (r.err != 0 && r.err != -ESTALE && r.err != -ENOSPC)
            s->bad++;
    }
    return NULL;
}

static void test_memory_stress_keeps_its_accounts(void)
{
    struct record *rec = kib_record();
    struct store *st = memory_open(12 * record_mem_bytes(rec));
    struct stresser ss[STRESS_THREADS];
    pthread_t tids[STRESS_THREADS];
    struct store_memory_stats s;

    for (int i = 0; i < STRESS_THREADS; i++) {
        ss[i] = (struct stresser){ .st = st, .rec = rec, .seed = (unsigned)i * 7919u + 1 };
        CHECK_EQ_INT(pthread_create(&tids[i], NULL, stress_main, &ss[i]), 0);
    }
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_join(tids[i], NULL);
        CHECK_EQ_INT(ss[i].bad, 0);
    }
    s = mem_stats(st);
    CHECK(s.bytes <= s.max_bytes);
    CHECK(s.evictions > 0);
    /* Everything expires within 80 ms: then nothing may be left counted. */
    sleep_ms(100 + 3 * MEM_REAP_MS);
    s = mem_stats(st);
    CHECK_EQ_INT(s.entries, 0);
    CHECK_EQ_INT(s.bytes, 0);
    record_unref(rec);
    store_close(st);
}

/* ---- Redis only ---- */

/* A connection of the test's own to <host>:<port>, with the URL's
 * credentials, on database <db>. */
static redisContext *admin_connect_to(const char *host, unsigned port, unsigned db)
{
    struct redis_url u;
    struct timeval tv = { .tv_sec = 5 };
    redisContext *c;
    redisReply *r;

    if (redis_url_parse(redis_admin_url ? redis_admin_url : redis_url, &u, NULL, 0) < 0) {
        fprintf(stderr, "IDEMPROXY_TEST_REDIS_URL is not a redis:// URL: %s\n", redis_url);
        exit(1);
    }
    c = redisConnectWithTimeout(host ? host : u.hosts[0].host, (int)(host ? port : u.hosts[0].port),
                                tv);
    if (!c || c->err) {
        fprintf(stderr, "cannot connect to %s\n", redis_url);
        exit(1);
    }
    redisSetTimeout(c, tv);
    if (u.password) {
        r = u.user ? redisCommand(c, "AUTH %s %s", u.user, u.password)
                   : redisCommand(c, "AUTH %s", u.password);
        CHECK(r && r->type == REDIS_REPLY_STATUS);
        freeReplyObject(r);
    }
    r = redisCommand(c, "SELECT %u", db); /* a cluster has database 0 alone */
    CHECK(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    redis_url_done(&u);
    return c;
}

/* A connection to the URL's (first) server, on database <db>, to look at
 * what the store wrote. */
static redisContext *admin_connect(unsigned db) { return admin_connect_to(NULL, 0, db); }

/* A connection to the server that holds <key>: the URL's, or on a cluster
 * the master its slot belongs to (where a MOVED points). */
static redisContext *admin_for_key(const char *key)
{
    redisContext *c = admin_connect(0);
    struct redis_redirect rd;
    redisReply *r;

    if (!cluster_kind)
        return c;
    r = redisCommand(c, "TYPE %s", key);
    if (r && r->type == REDIS_REPLY_ERROR &&
        redis_redirect_parse(r->str, r->len, "127.0.0.1", &rd) == 0) {
        redisFree(c);
        c = admin_connect_to(rd.addr.host, rd.addr.port, 0);
    }
    freeReplyObject(r);
    return c;
}

/* Runs <cmd> on every master (one server: the URL's). */
static bool admin_ok_everywhere(const char *cmd);

static long long admin_int(redisContext *c, const char *cmd, const char *key)
{
    redisReply *r = key ? redisCommand(c, "%s %s", cmd, key) : redisCommand(c, cmd);
    long long v = -1;

    CHECK(r && r->type == REDIS_REPLY_INTEGER);
    if (r && r->type == REDIS_REPLY_INTEGER)
        v = r->integer;
    freeReplyObject(r);
    return v;
}

static bool admin_ok(redisContext *c, const char *cmd)
{
    redisReply *r = redisCommand(c, cmd);
    bool ok = r && r->type == REDIS_REPLY_STATUS;

    if (!ok)
        fprintf(stderr, "%s: %s\n", cmd, r && r->str ? r->str : c->errstr);
    freeReplyObject(r);
    return ok;
}

static bool admin_ok_everywhere(const char *cmd)
{
    redisContext *c = admin_connect(0);
    struct redis_slot_range *ranges = NULL;
    redisReply *r;
    bool ok = true;
    int n = 0;

    if (!cluster_kind) {
        ok = admin_ok(c, cmd);
        redisFree(c);
        return ok;
    }
    r = redisCommand(c, "CLUSTER SLOTS");
    n = r ? redis_cluster_slots_parse(r, "127.0.0.1", &ranges) : -EPROTO;
    CHECK(n > 0);
    for (int i = 0; i < n; i++) {
        redisContext *m = admin_connect_to(ranges[i].master.host, ranges[i].master.port, 0);

        ok = admin_ok(m, cmd) && ok;
        redisFree(m);
    }
    free(ranges);
    freeReplyObject(r);
    redisFree(c);
    return ok && n > 0;
}

static unsigned base_db(void)
{
    struct redis_url u;
    unsigned db = 0;

    if (redis_url_parse(redis_url, &u, NULL, 0) == 0)
        db = u.db;
    redis_url_done(&u);
    return db;
}

/* The test URL with its database replaced by <db>. */
static void url_with_db(char *buf, size_t size, unsigned db)
{
    struct redis_url u;
    char pw[768] = "", host[300];

    CHECK_EQ_INT(redis_url_parse(redis_url, &u, NULL, 0), 0);
    if (u.password) {
        const char *parts[] = { u.user ? u.user : "", u.password };
        char *o = pw;

        for (int i = 0; i < 2; i++) {
            for (const unsigned char *p = (const unsigned char *)parts[i]; *p; p++) {
                if (o - pw > 700)
                    abort(); /* no test Redis has such a user or password */
                o += sprintf(o, "%%%02X", *p);
            }
            *o++ = i == 0 ? ':' : '@';
        }
        *o = '\0';
    }
    redis_addr_format(&u.hosts[0], host, sizeof(host));
    snprintf(buf, size, "redis%s://%s%s/%u", u.tls ? "s" : "", pw, host, db);
    redis_url_done(&u);
}

/* A Redis store on loops of its own, created first and started after it. */
static int redis_new(const char *url, struct worker_pool *p, uint64_t timeout_ms,
                     struct store **ret)
{
    int err = 0;

    if (redis_loops[0])
        abort(); /* one Redis store at a time: store_close() frees its loops */
    for (int i = 0; i < REDIS_LOOPS && err == 0; i++)
        err = loop_new(&redis_loops[i]);
    if (err == 0)
        err = store_redis_new(&(struct store_redis_opts){ .url = url,
                                                          .tls.ca_file = redis_tls_ca,
                                                          .timeout_ms = timeout_ms },
                              p, redis_loops, REDIS_LOOPS, ret, NULL, 0);
    for (int i = 0; i < REDIS_LOOPS && err == 0; i++)
        err = loop_start(redis_loops[i]);
    if (err < 0)
        redis_loops_free();
    return err;
}

static int make_redis(struct worker_pool *p, struct store **ret)
{
    return redis_new(redis_url, p, 1000, ret);
}

/* postgresql: a PostgreSQL store on two loops, as the Redis one. */
static const char *pg_url;

static int make_pg(struct worker_pool *p, struct store **ret)
{
    char why[512] = "";
    int err = 0;

    if (redis_loops[0])
        abort(); /* one store on loops at a time: store_close() frees them */
    for (int i = 0; i < REDIS_LOOPS && err == 0; i++)
        err = loop_new(&redis_loops[i]);
    if (err == 0)
        err = store_pg_new(&(struct store_pg_opts){ .url = pg_url, .timeout_ms = 2000 }, p,
                           redis_loops, REDIS_LOOPS, ret, why, sizeof(why));
    if (err < 0 && why[0])
        fprintf(stderr, "store_pg_new: %s\n", why);
    for (int i = 0; i < REDIS_LOOPS && err == 0; i++)
        err = loop_start(redis_loops[i]);
    if (err < 0)
        redis_loops_free();
    return err;
}

static void test_redis_refuses_bad_arguments(void)
{
    struct store *st = NULL, *st0 = store_open();
    struct store_token t = token(), bad_tok = { .hex = "short" };
    struct record *rec = sample_record(200, "x");
    int before = atomic_load(&callbacks);

    /* Refused before they touch the loops (those of st0, running already). */
    CHECK_EQ_INT(
        store_redis_new(&(struct store_redis_opts){ .url = "http://nope", .timeout_ms = 1000 },
                        pool, redis_loops, REDIS_LOOPS, &st, NULL, 0),
        -EINVAL);
    CHECK_EQ_INT(store_redis_new(&(struct store_redis_opts){ .url = redis_url, .timeout_ms = 0 },
                                 pool, redis_loops, REDIS_LOOPS, &st, NULL, 0),
                 -EINVAL);
    CHECK_EQ_INT(store_redis_new(&(struct store_redis_opts){ .url = redis_url, .timeout_ms = 1000 },
                                 pool, redis_loops, 0, &st, NULL, 0),
                 -EINVAL);
    CHECK(st == NULL);
    CHECK_EQ_INT(acquire(st0, "", fp_a, &t, 1000).ret, -EINVAL);
    CHECK_EQ_INT(acquire(st0, "k", fp_a, &t, 0).ret, -EINVAL);
    CHECK_EQ_INT(acquire(st0, "k", fp_a, &bad_tok, 1000).ret, -EINVAL);
    CHECK_EQ_INT(complete(st0, "k", &t, rec, 0).ret, -EINVAL);
    CHECK_EQ_INT(extend(st0, "k", &t, 0).ret, -EINVAL);
    CHECK_EQ_INT(complete(st0, "k", &t, NULL, 1000).ret, -EINVAL);
    CHECK_EQ_INT(atomic_load(&callbacks), before); /* refused calls never call back */
    record_unref(rec);
    store_close(st0);
}

static void test_redis_script_flush_reloads_scripts(void)
{
    struct store *st = store_open();
    struct store_token t1 = token(), t2 = token();
    struct record *rec = sample_record(200, "flush");
    struct res r;
    char key[128];

    key_make(key, sizeof(key), "flush");
    CHECK(admin_ok_everywhere("SCRIPT FLUSH"));
    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK(admin_ok_everywhere("SCRIPT FLUSH"));
    CHECK_RES(extend(st, key, &t1, 10000), 0, STORE_OK);
    CHECK(admin_ok_everywhere("SCRIPT FLUSH"));
    CHECK_RES(complete(st, key, &t1, rec, 10000), 0, STORE_OK);
    CHECK(admin_ok_everywhere("SCRIPT FLUSH"));
    r = acquire(st, key, fp_a, &t2, 10000);
    CHECK_EQ_INT(r.status, STORE_COMPLETED);
    CHECK(record_equal(r.rec, rec));
    record_unref(r.rec);
    key_make(key, sizeof(key), "flush-release");
    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK(admin_ok_everywhere("SCRIPT FLUSH"));
    CHECK_RES(release(st, key, &t1), 0, STORE_OK);
    /* Every pool thread's connection meets the empty cache at least once. */
    CHECK(admin_ok_everywhere("SCRIPT FLUSH"));
    for (int i = 0; i < 4 * POOL_THREADS; i++)
        CHECK_RES(release(st, key, &t1), 0, STORE_OK);
    /* A cluster is ready once every master answered: they are asked at once. */
    for (int waited = 0; cluster_kind && !store_is_ready(st) && waited < 2000; waited += 20)
        sleep_ms(20);
    CHECK(store_is_ready(st));
    record_unref(rec);
    store_close(st);
}

/* Where the one-key test counts keys: a database of its own, so that no
 * other test's keys (which expire) change DBSIZE (it also checks that
 * SELECT works); or, on a cluster (database 0 alone), a slot that holds no
 * key, on its master. */
struct keyspace {
    redisContext *c;
    char tag[64]; /* a cluster: the hash tag of the empty slot */
    long long slot;
};

static long long keyspace_count(struct keyspace *ks)
{
    redisReply *r;
    long long n = -1;

    if (!cluster_kind)
        return admin_int(ks->c, "DBSIZE", NULL);
    r = redisCommand(ks->c, "CLUSTER COUNTKEYSINSLOT %lld", ks->slot);
    CHECK(r && r->type == REDIS_REPLY_INTEGER);
    if (r && r->type == REDIS_REPLY_INTEGER)
        n = r->integer;
    freeReplyObject(r);
    return n;
}

static void keyspace_open(struct keyspace *ks, char *url, size_t url_len)
{
    char probe[128], slot[24];

    *ks = (struct keyspace){ .slot = -1 };
    if (!cluster_kind) {
        unsigned db = base_db() == 15 ? 14 : base_db() + 1;

        ks->c = admin_connect(db);
        url_with_db(url, url_len, db);
        return;
    }
    snprintf(url, url_len, "%s", redis_url);
    for (int i = 0; i < 200 && ks->slot < 0; i++) {
        snprintf(ks->tag, sizeof(ks->tag), "onekey-%ld-%d", (long)getpid(), i);
        snprintf(probe, sizeof(probe), "{%s}", ks->tag);
        redisFree(ks->c);
        ks->c = admin_for_key(probe);
        snprintf(slot, sizeof(slot), "%u", redis_cluster_key_slot(ks->tag, strlen(ks->tag)));
        ks->slot = strtoll(slot, NULL, 10);
        if (keyspace_count(ks) != 0)
            ks->slot = -1;
    }
    CHECK(ks->slot >= 0);
}

static void test_redis_one_key_per_idempotency_key(void)
{
    struct keyspace ks;
    redisContext *admin, *base = admin_connect(base_db());
    struct store_token t1 = token(), t2 = token();
    struct record *rec = sample_record(200, "onekey");
    struct store *st = NULL;
    long long before;
    char url[1200], key[128], key2[128];
    redisReply *r;

    keyspace_open(&ks, url, sizeof(url));
    admin = ks.c;
    CHECK_EQ_INT(redis_new(url, pool, 1000, &st), 0);
    if (!st)
        return;
    snprintf(key, sizeof(key), "test:{%s}:%ld:onekey", ks.tag, (long)getpid());
    snprintf(key2, sizeof(key2), "test:{%s}:%ld:onekey-release", ks.tag, (long)getpid());
    before = keyspace_count(&ks);

    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK_EQ_INT(keyspace_count(&ks), before + 1);
    CHECK_EQ_INT(admin_int(admin, "EXISTS", key), 1);
    if (!cluster_kind)
        CHECK_EQ_INT(admin_int(base, "EXISTS", key), 0); /* in the URL's database only */
    r = redisCommand(admin, "TYPE %s", key);
    CHECK(r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "hash") == 0);
    freeReplyObject(r);
    CHECK_EQ_INT(admin_int(admin, "HLEN", key), 5); /* state, fp, token, ts, keep */
    r = redisCommand(admin, "HMGET %s state token fp", key);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 3);
    if (r && r->elements == 3) {
        CHECK_EQ_STR(r->element[0]->str, "L");
        CHECK_EQ_STR(r->element[1]->str, t1.hex);
        CHECK_EQ_INT(r->element[2]->len, FINGERPRINT_HEX);
    }
    freeReplyObject(r);
    /* The lease, then the record's minute: the lease is read from the TTL. */
    CHECK(admin_int(admin, "PTTL", key) > 65000 && admin_int(admin, "PTTL", key) <= 70000);

    CHECK_RES(acquire(st, key, fp_a, &t2, 10000), 0, STORE_IN_FLIGHT);
    CHECK_RES(acquire(st, key, fp_b, &t2, 10000), 0, STORE_MISMATCH);
    CHECK_RES(complete(st, key, &t1, rec, 60000), 0, STORE_OK);
    CHECK_EQ_INT(keyspace_count(&ks), before + 1);
    CHECK_EQ_INT(admin_int(admin, "HLEN", key), 7); /* + head, body */
    r = redisCommand(admin, "HGET %s body", key);
    CHECK(r && r->type == REDIS_REPLY_STRING && r->len == rec->body.len &&
          memcmp(r->str, rec->body.data, r->len) == 0); /* the raw body, not encoded */
    freeReplyObject(r);
    CHECK(admin_int(admin, "PTTL", key) > 30000);
    CHECK_RES(acquire(st, key, fp_a, &t2, 10000), 0, STORE_COMPLETED);
    CHECK_EQ_INT(keyspace_count(&ks), before + 1);

    CHECK_RES(acquire(st, key2, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK_RES(extend(st, key2, &t1, 10000), 0, STORE_OK);
    CHECK_EQ_INT(keyspace_count(&ks), before + 2);
    CHECK_RES(release(st, key2, &t1), 0, STORE_OK);
    CHECK_EQ_INT(keyspace_count(&ks), before + 1);
    CHECK_EQ_INT(admin_int(admin, "EXISTS", key2), 0);

    /* An unknown record is the same one key: its lock's hash, changed. */
    CHECK_RES(acquire_as(st, key2, fp_a, &t1, 100, 60000, false), 0, STORE_ACQUIRED);
    sleep_ms(200);
    CHECK_EQ_INT(acquire_as(st, key2, fp_a, &t2, 100, 60000, false).status, STORE_UNKNOWN);
    CHECK_EQ_INT(keyspace_count(&ks), before + 2);
    r = redisCommand(admin, "HMGET %s state cause about token", key2);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 4);
    if (r && r->elements == 4) {
        CHECK_EQ_STR(r->element[0]->str, "U");
        CHECK_EQ_STR(r->element[1]->str, "holder_lost");
        CHECK_EQ_STR(r->element[2]->str, ABOUT_PAYMENT);
        CHECK_EQ_STR(r->element[3]->str, t1.hex); /* its holder may still complete it */
    }
    freeReplyObject(r);
    CHECK(admin_int(admin, "PTTL", key2) > 55000 && admin_int(admin, "PTTL", key2) <= 60000);
    CHECK_EQ_INT(admin_int(admin, "DEL", key2), 1);

    CHECK_EQ_INT(admin_int(admin, "DEL", key), 1); /* leave the database as found */
    record_unref(rec);
    store_close(st);
    redisFree(admin);
    redisFree(base);
}

static void test_redis_bad_stored_data_is_eproto(void)
{
    struct store *st = store_open();
    redisContext *admin;
    struct store_token t = token();
    char fp_hex[FINGERPRINT_HEX + 1], key[128];
    redisReply *r;

    fingerprint_hex(fp_a, fp_hex);
    key_make(key, sizeof(key), "corrupt");
    admin = admin_for_key(key);
    r = redisCommand(admin, "HSET %s state C fp %s token %s head garbage body x", key, fp_hex,
                     t.hex);
    freeReplyObject(r);
    CHECK_RES(acquire(st, key, fp_a, &t, 10000), -EPROTO, -1);
    CHECK_RES(acquire(st, key, fp_b, &t, 10000), 0, STORE_MISMATCH); /* still a usable key */

    key_make(key, sizeof(key), "wrongtype");
    redisFree(admin);
    admin = admin_for_key(key);
    r = redisCommand(admin, "SET %s plain", key);
    freeReplyObject(r);
    CHECK_RES(acquire(st, key, fp_a, &t, 10000), -EPROTO, -1);
    CHECK_RES(release(st, key, &t), -EPROTO, -1);
    redisFree(admin);
    store_close(st);
}

/* A TCP socket bound on 127.0.0.1 but not listening: connecting to <ret_port>
 * is refused until the test calls listen() on it. */
static int bound_socket(unsigned *ret_port)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);

    CHECK(fd >= 0);
    CHECK_EQ_INT(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    CHECK_EQ_INT(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *ret_port = ntohs(a.sin_port);
    return fd;
}

static void test_redis_down_fails_fast_with_backoff(void)
{
    struct worker_pool *one = NULL;
    struct store *st = NULL;
    struct store_token t = token();
    unsigned port;
    int fd = bound_socket(&port), conn;
    char url[64];
    uint64_t start;

    snprintf(url, sizeof(url), "redis://127.0.0.1:%u", port);
    CHECK_EQ_INT(worker_pool_new(1, &one), 0);
    /* Starts without Redis. */
    CHECK_EQ_INT(redis_new(url, one, 200, &st), 0);
    if (!st)
        return;
    CHECK(!store_is_ready(st));
    sleep_ms(60); /* past the backoff of the first PING's failed connect */
    CHECK_RES(acquire(st, "k", fp_a, &t, 1000), -ECONNREFUSED, -1); /* tries, fails: 100 ms */
    /* Something listens now, but inside the backoff nothing even tries. */
    CHECK_EQ_INT(listen(fd, 16), 0);
    start = now_ms();
    for (int i = 0; i < 10; i++)
        CHECK_RES(release(st, "k", &t), -ECONNREFUSED, -1);
    CHECK(now_ms() - start < 50);
    conn = accept(fd, NULL, NULL);
    CHECK(conn < 0 && errno == EAGAIN); /* no connection attempt was made */
    CHECK(!store_is_ready(st));
    sleep_ms(150);
    /* After the backoff it connects; this listener never answers: a timeout. */
    CHECK_RES(release(st, "k", &t), -ETIMEDOUT, -1);
    conn = accept(fd, NULL, NULL);
    CHECK(conn >= 0);
    if (conn >= 0)
        close(conn);
    CHECK(!store_is_ready(st));
    store_close(st);
    worker_pool_free(one);
    close(fd);
}

static void test_redis_timeout_frees_the_connection(void)
{
    struct worker_pool *one = NULL;
    struct store *st = NULL;
    redisContext *admin;
    struct store_token t1 = token(), t2 = token();
    char key[128];
    uint64_t start, took;
    int waited;

    /* One thread: the calls after the pause must use the connection that timed out. */
    CHECK_EQ_INT(worker_pool_new(1, &one), 0);
    CHECK_EQ_INT(redis_new(redis_url, one, 200, &st), 0);
    if (!st)
        return;
    key_make(key, sizeof(key), "timeout");
    admin = admin_for_key(key); /* a cluster: the master the ops go to */
    CHECK_RES(acquire(st, key, fp_a, &t1, 10000), 0, STORE_ACQUIRED);
    CHECK(admin_ok(admin, "CLIENT PAUSE 700 ALL"));
    start = now_ms();
    CHECK_RES(acquire(st, key, fp_a, &t2, 10000), -ETIMEDOUT, -1);
    took = now_ms() - start;
    CHECK(took >= 150 && took < 1000);
    CHECK(!store_is_ready(st));
    sleep_ms(900); /* the pause is over; the late reply sits in the old socket */
    /* A reused connection would read that stale reply ({"in_flight"}) here. */
    CHECK_RES(release(st, key, &t1), 0, STORE_OK);
    CHECK_RES(acquire(st, key, fp_a, &t2, 10000), 0, STORE_ACQUIRED);
    CHECK(store_is_ready(st));

    /* A killed connection (as after a Redis restart) is replaced by the next call. */
    CHECK(admin_int(admin, "CLIENT KILL TYPE normal SKIPME yes", NULL) >= 1);
    {
        struct res r = release(st, key, &t2);

        CHECK(r.err == -ECONNRESET || r.err == 0); /* the periodic PING may take the hit */
        record_unref(r.rec);
    }
    CHECK_RES(release(st, key, &t2), 0, STORE_OK); /* done now, or a retry of what was done */
    CHECK_RES(acquire(st, key, fp_b, &t1, 10000), 0, STORE_ACQUIRED);
    /* Readiness follows the periodic PING without traffic. */
    for (waited = 0; !store_is_ready(st) && waited < 3000; waited += 50)
        sleep_ms(50);
    CHECK(store_is_ready(st));
    redisFree(admin);
    store_close(st);
    worker_pool_free(one);
}

static void test_redis_ready_without_traffic(void)
{
    struct store *st = store_open();
    int waited;

    for (waited = 0; !store_is_ready(st) && waited < 3000; waited += 20)
        sleep_ms(20);
    CHECK(store_is_ready(st));
    store_close(st);
}

/* ---- main ---- */

struct test {
    const char *name;
    check_test_fn *fn;
};

#define TEST(fn)                                                                                   \
    {                                                                                              \
#fn, fn                                                                                    \
    }

static const struct test contract_tests[] = {
    TEST(test_acquire_new_then_in_flight_then_mismatch),
    TEST(test_complete_then_acquire_replays_the_record),
    TEST(test_complete_keeps_too_large_marker_and_empty_body),
    TEST(test_stale_token_changes_nothing),
    TEST(test_release_frees_the_key),
    TEST(test_lock_expires_after_its_ttl),
    TEST(test_extend_keeps_the_lock_past_its_ttl),
    TEST(test_lapsed_lock_becomes_unknown_and_its_holder_may_come_back),
    TEST(test_holder_marks_unknown_and_retry_takes_it_over),
    TEST(test_unknown_record_is_kept_its_ttl_from_its_last_change),
    TEST(test_completed_record_expires_after_its_ttl),
    TEST(test_expired_record_leaves_a_tombstone),
    TEST(test_trace_context_is_kept_with_the_key),
    TEST(test_concurrent_acquires_have_one_winner),
    TEST(test_free_waits_for_every_callback),
    TEST(test_ready_after_a_successful_call),
    TEST(test_complete_and_release_notify_waiters),
    TEST(test_inspect_lists_every_scope_and_purge_frees),
    TEST(test_list_unknown_and_resolve),
    TEST(test_probes_are_paced_counted_and_settle_the_key),
    TEST(test_resource_links_find_the_record),
};

static const struct test memory_tests[] = {
    TEST(test_memory_rejects_bad_arguments),
    TEST(test_memory_counts_keys_headers_and_bodies),
    TEST(test_memory_counts_trace_contexts),
    TEST(test_memory_evicts_oldest_completed_first),
    TEST(test_memory_never_evicts_a_lock),
    TEST(test_memory_record_over_half_the_budget_is_e2big),
    TEST(test_memory_reclaims_expired_without_being_asked),
    TEST(test_memory_stress_keeps_its_accounts),
};

static const struct test redis_tests[] = {
    TEST(test_redis_refuses_bad_arguments),        TEST(test_redis_script_flush_reloads_scripts),
    TEST(test_redis_one_key_per_idempotency_key),  TEST(test_redis_bad_stored_data_is_eproto),
    TEST(test_redis_down_fails_fast_with_backoff), TEST(test_redis_timeout_frees_the_connection),
    TEST(test_redis_ready_without_traffic),
};

/* A new kind adds a factory here and, if it has any, its own tests below. */
static const struct store_kind store_kinds[] = {
    { "redis", make_redis, false },
    { "redis-tls", make_redis, false },     /* the same suite over rediss:// */
    { "redis-cluster", make_redis, false }, /* the same suite on a Redis Cluster */
    { "memory", make_memory, true },
    { "postgresql", make_pg, false }, /* the same suite on PostgreSQL (doc/stores.md) */
};

int main(int argc, char **argv)
{
    const char
        *names[ARRAY_SIZE(contract_tests) + ARRAY_SIZE(memory_tests) + ARRAY_SIZE(redis_tests)];
    check_test_fn *fns[ARRAY_SIZE(names)];
    size_t n = 0;
    int ret;

    sealed = argc == 3 && strcmp(argv[2], "sealed") == 0;
    for (size_t i = 0; (argc == 2 || sealed) && i < ARRAY_SIZE(store_kinds); i++) {
        if (strcmp(argv[1], store_kinds[i].name) == 0)
            kind = &store_kinds[i];
    }
    if (!kind) {
        fprintf(stderr, "usage: %s redis|redis-tls|redis-cluster|memory|postgresql [sealed]\n",
                argv[0]);
        return 2;
    }
    if (strcmp(kind->name, "postgresql") == 0) {
        pg_url = getenv("IDEMPROXY_TEST_PG_URL");
        if (!pg_url || !*pg_url) {
            fprintf(stderr,
                    "%s: IDEMPROXY_TEST_PG_URL is not set: the postgresql store suite needs a "
                    "PostgreSQL server (scripts/test starts one and sets it)\n",
                    argv[0]);
            return 1;
        }
    }
    if (strcmp(kind->name, "redis") == 0) {
        redis_url = getenv("IDEMPROXY_TEST_REDIS_URL");
        if (!redis_url || !*redis_url) {
            fprintf(stderr,
                    "%s: IDEMPROXY_TEST_REDIS_URL is not set: the redis store suite "
                    "needs a running Redis (scripts/test starts one and sets it)\n",
                    argv[0]);
            return 1;
        }
    }
    if (strcmp(kind->name, "redis-cluster") == 0) {
        redis_url = getenv("IDEMPROXY_TEST_REDIS_CLUSTER_URL");
        cluster_kind = true;
        if (!redis_url || !*redis_url) {
            fprintf(stderr,
                    "%s: IDEMPROXY_TEST_REDIS_CLUSTER_URL is not set: the redis-cluster store "
                    "suite needs a Redis Cluster (scripts/test starts one and sets it)\n",
                    argv[0]);
            return 1;
        }
    }
    if (strcmp(kind->name, "redis-tls") == 0) {
        redis_url = getenv("IDEMPROXY_TEST_REDISS_URL");
        redis_tls_ca = getenv("IDEMPROXY_TEST_REDISS_CA");
        redis_admin_url = getenv("IDEMPROXY_TEST_REDISS_PLAIN_URL");
        if (!redis_url || !*redis_url || !redis_tls_ca || !redis_admin_url) {
            fprintf(stderr,
                    "%s: IDEMPROXY_TEST_REDISS_URL, _CA and _PLAIN_URL are not set: the "
                    "redis-tls store suite needs a TLS Redis (scripts/test starts one)\n",
                    argv[0]);
            return 1;
        }
    }
    /* A write to a connection Redis has closed must fail, not kill us (the
     * program does the same in main). */
    signal(SIGPIPE, SIG_IGN);
    if (worker_pool_new(POOL_THREADS, &pool) < 0) {
        fprintf(stderr, "cannot start the worker pool\n");
        return 1;
    }
    for (size_t i = 0; i < ARRAY_SIZE(contract_tests); i++) {
        names[n] = contract_tests[i].name;
        fns[n++] = contract_tests[i].fn;
    }
    /* A kind's own tests look at what it holds: not through the filter. */
    for (size_t i = 0; !sealed && strcmp(kind->name, "memory") == 0 && i < ARRAY_SIZE(memory_tests);
         i++) {
        names[n] = memory_tests[i].name;
        fns[n++] = memory_tests[i].fn;
    }
    for (size_t i = 0; !sealed && redis_url && i < ARRAY_SIZE(redis_tests); i++) {
        names[n] = redis_tests[i].name;
        fns[n++] = redis_tests[i].fn;
    }
    ret = check_run(names, fns, n);
    worker_pool_free(pool);
    return ret;
}
