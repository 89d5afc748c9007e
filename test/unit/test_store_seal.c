/* SPDX-License-Identifier: MIT */
/* The sealing store filter (store_seal.h) over the memory store: what goes
 * in is sealed, what comes out is in clear, and an answer that does not
 * open is refused (acquire) or said (inspect), never passed up. */
#define _GNU_SOURCE /* memmem */
#include "idemproxy/store_seal.h"

#include <pthread.h>
#include <string.h>

#include "check.h"
#include "idemproxy/record.h"
#include "idemproxy/seal.h"
#include "idemproxy/store.h"
#include "idemproxy/store_memory.h"
#include "idemproxy/worker.h"

#define K1 "k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n"
#define K2 "k2:AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=\n"
#define KEY "idem:0123456789abcdef0123456789abcdef:order-1"

static const uint8_t fp[FINGERPRINT_LEN] = { 7 };
static struct worker_pool *pool;

/* What the last acquire gave: its status, its answer and why. */
struct got {
    int status;
    struct record *rec; /* own reference */
    char why[160];
};

static void on_done(void *ctx, int err, const struct store_result *res)
{
    struct got *g = ctx;

    g->status = err < 0 ? err : (int)res->status;
    if (err == 0 && res->rec)
        g->rec = record_ref(res->rec);
    if (err == 0 && res->status == STORE_UNREADABLE)
        snprintf(g->why, sizeof(g->why), "%s", res->unreadable);
}

static struct seal_keys *keys(const char *text)
{
    struct seal_keys *k = NULL;
    char why[128];

    CHECK_EQ_INT(seal_keys_parse(span_from_cstr(text), &k, why, sizeof(why)), 0);
    return k;
}

/* A memory store, and the filter over it with <k> (taken over). */
static struct store *sealed_over(struct store **ret_plain, struct seal_keys *k)
{
    struct store *st = NULL;

    CHECK_EQ_INT(store_memory_new(1u << 20, 1000, pool, ret_plain), 0);
    CHECK_EQ_INT(store_seal_new(*ret_plain, k, &st), 0);
    return st;
}

/* Acquires KEY in <st> under the new token <t>: what it gave. */
static struct got acquire_as(struct store *st, struct store_token *t)
{
    struct got g = { .status = -1 };

    CHECK_EQ_INT(store_token_new(t), 0);
    CHECK_EQ_INT(store_acquire(st, SPAN_LIT(KEY), fp, t,
                               &(struct store_lock){ .lease_ms = 10000, .keep_ms = 60000 }, on_done,
                               &g),
                 0); /* the memory store answers before the call returns */
    return g;
}

static struct got acquire(struct store *st)
{
    struct store_token t;

    return acquire_as(st, &t);
}

/* Locks KEY in <st> and completes it with <rec> (borrowed). */
static void store_record(struct store *st, struct record *rec)
{
    struct store_token t;
    struct got g = acquire_as(st, &t);

    CHECK_EQ_INT(g.status, STORE_ACQUIRED);
    CHECK_EQ_INT(store_complete(st, SPAN_LIT(KEY), &t, rec, 60000, NULL, on_done, &g), 0);
    CHECK_EQ_INT(g.status, STORE_OK);
}

/* Locks KEY in <st> and completes it with a 201 "hello" answer. */
static void store_answer(struct store *st)
{
    struct record *rec = record_new(64);

    CHECK(rec != NULL);
    if (!rec)
        return;
    rec->status = 201;
    CHECK_EQ_INT(record_add_header(rec, SPAN_LIT("Content-Type"), SPAN_LIT("text/plain")), 0);
    CHECK_EQ_INT(buf_append(&rec->body, "hello", 5), 0);
    store_record(st, rec);
    record_unref(rec);
}

struct listing {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int err;
    struct store_info_list list;
};

static void on_listed(void *ctx, int err, struct store_info_list *list)
{
    struct listing *l = ctx;

    pthread_mutex_lock(&l->mu);
    l->err = err;
    l->list = *list;
    *list = (struct store_info_list){ 0 };
    l->done = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static struct store_info_list inspect(struct store *st, bool with_body)
{
    struct listing l = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

    CHECK_EQ_INT(
        store_inspect(st, SPAN_LIT("idem:"), SPAN_LIT("order-1"), with_body, on_listed, &l), 0);
    pthread_mutex_lock(&l.mu);
    while (!l.done)
        pthread_cond_wait(&l.cv, &l.mu);
    pthread_mutex_unlock(&l.mu);
    CHECK_EQ_INT(l.err, 0);
    CHECK_EQ_INT(l.list.n, 1);
    return l.list;
}

static void test_store_seal_seals_in_and_opens_out(void)
{
    struct store *plain, *st = sealed_over(&plain, keys(K1));
    struct store_info_list l;
    struct got g;

    store_answer(st);
    g = acquire(plain); /* the store itself holds ciphertext only */
    CHECK_EQ_INT(g.status, STORE_COMPLETED);
    CHECK(g.rec && g.rec->sealed && g.rec->status == 0 && g.rec->nheaders == 0 &&
          !memmem(g.rec->body.data, g.rec->body.len, "hello", 5));
    record_unref(g.rec);
    g = acquire(st);
    CHECK_EQ_INT(g.status, STORE_COMPLETED);
    CHECK(g.rec && !g.rec->sealed && g.rec->status == 201 && g.rec->body.len == 5 &&
          !memcmp(g.rec->body.data, "hello", 5));
    CHECK_EQ_STR(g.rec ? record_header_get(g.rec, "Content-Type") : NULL, "text/plain");
    record_unref(g.rec);
    l = inspect(st, false); /* the status, the key id, and no body unless asked */
    CHECK(l.items[0].rec && l.items[0].rec->status == 201 && l.items[0].rec->body.len == 0);
    CHECK_EQ_STR(l.items[0].sealed_by, "k1");
    CHECK(l.items[0].unreadable == NULL);
    store_info_list_done(&l);
    l = inspect(st, true);
    CHECK(l.items[0].rec && l.items[0].rec->body.len == 5);
    store_info_list_done(&l);
    store_free(st);
}

static void test_store_seal_refuses_what_does_not_open(void)
{
    struct store *plain, *st = sealed_over(&plain, keys(K1)), *other, *bare;
    struct store_info_list l;
    struct got g;

    /* In clear while answers are sealed. */
    store_answer(plain);
    g = acquire(st);
    CHECK_EQ_INT(g.status, STORE_UNREADABLE);
    CHECK(g.rec == NULL && strstr(g.why, "clear") != NULL);
    l = inspect(st, false);
    CHECK(l.items[0].rec == NULL && l.items[0].unreadable && l.items[0].sealed_by == NULL);
    store_info_list_done(&l);
    store_free(st);

    /* Sealed under a key the filter lacks, and with no key at all: the
     * sealed record, as the store holds it, put in stores of their own. */
    st = sealed_over(&plain, keys(K1));
    store_answer(st);
    g = acquire(plain);
    CHECK(g.rec && g.rec->sealed);
    other = sealed_over(&bare, keys(K2));
    store_record(bare, g.rec);
    record_unref(g.rec);
    g = acquire(other);
    CHECK_EQ_INT(g.status, STORE_UNREADABLE);
    CHECK(g.rec == NULL && strstr(g.why, "(key id k1)") != NULL);
    l = inspect(other, true);
    CHECK(l.items[0].rec == NULL && l.items[0].unreadable);
    CHECK_EQ_STR(l.items[0].sealed_by, "k1");
    store_info_list_done(&l);
    store_free(other);
    g = acquire(plain);
    other = sealed_over(&bare, NULL);
    store_record(bare, g.rec);
    record_unref(g.rec);
    g = acquire(other);
    CHECK_EQ_INT(g.status, STORE_UNREADABLE);
    CHECK(g.rec == NULL && strstr(g.why, "(key id k1)") != NULL);
    store_free(other);
    store_free(st);
}

static void test_store_seal_without_keys_passes_clear_answers(void)
{
    struct store *plain, *st = sealed_over(&plain, NULL);
    struct got g;

    store_answer(st);
    g = acquire(plain);
    CHECK(g.rec && !g.rec->sealed && g.rec->status == 201);
    record_unref(g.rec);
    g = acquire(st);
    CHECK_EQ_INT(g.status, STORE_COMPLETED);
    CHECK(g.rec && g.rec->status == 201 && g.rec->body.len == 5);
    record_unref(g.rec);
    store_free(st);
}

int main(void)
{
    static const char *const names[] = { "test_store_seal_seals_in_and_opens_out",
                                         "test_store_seal_refuses_what_does_not_open",
                                         "test_store_seal_without_keys_passes_clear_answers" };
    static check_test_fn *const fns[] = { test_store_seal_seals_in_and_opens_out,
                                          test_store_seal_refuses_what_does_not_open,
                                          test_store_seal_without_keys_passes_clear_answers };
    int ret;

    if (worker_pool_new(2, &pool) < 0)
        return 1;
    ret = check_run(names, fns, ARRAY_SIZE(fns));
    worker_pool_free(pool);
    return ret;
}
