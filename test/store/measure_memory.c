/* SPDX-License-Identifier: MIT */
/* Measures what the memory store costs per stored response: stores <n>
 * responses of <body> bytes (with the headers a typical JSON API sends),
 * under realistic store keys, and prints the bytes the store counts against
 * --memory-max-bytes, the heap growth malloc reports, and the RSS growth,
 * each per record. Not a test: README's figures come from it.
 *   build/test/measure_memory [n=100000] [body=1024] */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "idemproxy/record.h"
#include "idemproxy/store_memory.h"
#include "idemproxy/worker.h"

struct wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int err;
    int status;
};

static void on_done(void *ctx, int err, const struct store_result *res)
{
    struct wait *w = ctx;

    pthread_mutex_lock(&w->mu);
    w->err = err;
    w->status = res ? (int)res->status : -1;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Waits for the callback of a call that returned <ret>; returns its error. */
static int wait_for(struct wait *w, int ret)
{
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    w->done = false;
    pthread_mutex_unlock(&w->mu);
    return w->err;
}

static long rss_bytes(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");

    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * sysconf(_SC_PAGESIZE);
}

/* A response as the upstream client captures it: headers in arrival order
 * (Content-Length is not stored), the body in a buffer of exactly its size. */
static struct record *make_record(size_t body_len, unsigned long i)
{
    struct record *rec = record_new(body_len);
    char id[64], *body = malloc(body_len ? body_len : 1);

    if (!rec || !body)
        abort();
    rec->status = 201;
    snprintf(id, sizeof(id), "req_%016lx", i);
    if (record_add_header(rec, SPAN_LIT("Content-Type"), SPAN_LIT("application/json")) < 0 ||
        record_add_header(rec, SPAN_LIT("Date"), SPAN_LIT("Sat, 21 Nov 2026 10:00:00 GMT")) < 0 ||
        record_add_header(rec, SPAN_LIT("X-Request-Id"), span_from_cstr(id)) < 0 ||
        record_add_header(rec, SPAN_LIT("Location"), SPAN_LIT("/payments/pay_000001")) < 0)
        abort();
    memset(body, 'x', body_len);
    if (buf_reserve(&rec->body, body_len) < 0 || buf_append(&rec->body, body, body_len) < 0)
        abort();
    free(body);
    return rec;
}

int main(int argc, char **argv)
{
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 100000;
    size_t body_len = argc > 2 ? strtoul(argv[2], NULL, 10) : 1024;
    struct wait w = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
    struct worker_pool *pool = NULL;
    struct store *st = NULL;
    struct store_memory_stats s;
    struct mallinfo2 before, after;
    long rss_before, rss_after;
    size_t key_len = 0;

    if (n == 0 || worker_pool_new(2, &pool) < 0 ||
        store_memory_new((size_t)8 << 30, 1000, pool, &st) < 0) {
        fprintf(stderr, "usage: %s [records > 0] [body bytes]\n", argv[0]);
        return 2;
    }
    before = mallinfo2();
    rss_before = rss_bytes();
    for (unsigned long i = 0; i < n; i++) {
        /* <prefix><32 hex of scope>:<a UUID-sized client key>, as the proxy builds it */
        char key[128];
        struct store_token tok;
        uint8_t fp[FINGERPRINT_LEN] = { 0 };
        struct record *rec = make_record(body_len, i);
        int err;

        key_len = (size_t)snprintf(
            key, sizeof(key), "idem:5f2b9c0d41e87a36b0c9d2e4f1a3b5c7:%08lx-1f2e-4d3c-8b4a-%012lx",
            i, i * 2654435761ul);
        memcpy(fp, &i, sizeof(i));
        if (store_token_new(&tok) < 0)
            abort();
        err = wait_for(&w,
                       store_acquire(st, (struct span){ key, key_len }, fp, &tok,
                                     &(struct store_lock){ .lease_ms = 30000, .keep_ms = 86400000 },
                                     on_done, &w));
        if (err == 0 && w.status == STORE_ACQUIRED)
            err = wait_for(&w, store_complete(st, (struct span){ key, key_len }, &tok, rec,
                                              86400000, NULL, on_done, &w));
        record_unref(rec); /* the store keeps its own reference */
        if (err < 0 || w.status != STORE_OK) {
            fprintf(stderr, "record %lu: store error %d\n", i, err);
            return 1;
        }
    }
    after = mallinfo2();
    rss_after = rss_bytes();
    store_memory_stats(st, &s);

    printf("%lu records, %zu-byte bodies, %zu-byte store keys, 4 headers\n", n, body_len, key_len);
    printf("| measure | total | per record |\n|---|---:|---:|\n");
    printf("| counted against --memory-max-bytes | %.1f MiB | %.0f B |\n", s.bytes / 1048576.0,
           (double)s.bytes / (double)n);
    printf("| heap in use (mallinfo2) | %.1f MiB | %.0f B |\n",
           (double)(after.uordblks - before.uordblks) / 1048576.0,
           (double)(after.uordblks - before.uordblks) / (double)n);
    printf("| process RSS growth | %.1f MiB | %.0f B |\n",
           (double)(rss_after - rss_before) / 1048576.0,
           (double)(rss_after - rss_before) / (double)n);
    store_free(st);
    worker_pool_free(pool);
    return 0;
}
