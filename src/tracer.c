/* SPDX-License-Identifier: MIT */
/* The exporter thread: swaps the buffer the request path fills with its own, and posts what it took
 * in batches. */
#include "idemproxy/tracer.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idemproxy/log.h"
#include "idemproxy/metrics.h"

struct tracer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Two buffers of <cap> spans: the request path appends to <fill> (under
     * <mu>, for the copy alone); the thread swaps it with its own, empty,
     * and sends what it took outside the lock. */
    struct trace_span *fill, *drain;
    size_t cap, count;
    bool stopping;
    pthread_t thread;
    /* The thread's own: */
    char *endpoint;
    char *version;
    CURL *easy;
    struct curl_slist *headers;
    char errbuf[CURL_ERROR_SIZE];
};

static struct log_burst export_failures = LOG_BURST_INIT("span exports that failed");

void tracer_submit(struct tracer *t, const struct trace_span *s)
{
    bool wake;

    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    if (t->count == t->cap || t->stopping) {
        pthread_mutex_unlock(&t->mu);
        metrics_trace_dropped(1);
        return;
    }
    t->fill[t->count] = *s;
    wake = ++t->count == TRACER_BATCH;
    pthread_mutex_unlock(&t->mu);
    if (wake)
        pthread_cond_signal(&t->cv);
}

/* Posts the <n> spans at <spans>. Returns whether the collector took them. */
static bool post(struct tracer *t, const struct trace_span *spans, size_t n)
{
    size_t len = 0;
    char *body = trace_encode(spans, n, t->version, &len);
    long status = 0;
    CURLcode cc;

    if (!body)
        return false;
    t->errbuf[0] = '\0';
    curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    cc = curl_easy_perform(t->easy);
    if (cc == CURLE_OK)
        curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
    free(body);
    if (cc == CURLE_OK && status >= 200 && status < 300)
        return true;
    if (cc == CURLE_OK)
        snprintf(t->errbuf, sizeof(t->errbuf), "the collector answered %ld", status);
    else if (!t->errbuf[0])
        snprintf(t->errbuf, sizeof(t->errbuf), "%s", curl_easy_strerror(cc));
    if (log_enabled(LOG_LEVEL_WARN) && log_burst_admit(&export_failures, t->errbuf))
        log_warn("traces: an export of %zu spans to %s failed: %s (they are dropped and counted "
                 "in idemproxy_trace_spans_dropped_total)",
                 n, t->endpoint, t->errbuf);
    return false;
}

/* Waits until a batch is full, TRACER_FLUSH_MS passed, or the stop; then
 * takes every span queued: the buffers swap. Called and returns with the
 * lock held. */
static size_t take(struct tracer *t)
{
    struct timespec ts;
    struct trace_span *full;
    size_t n;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += TRACER_FLUSH_MS / 1000;
    ts.tv_nsec += (long)(TRACER_FLUSH_MS % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    while (!t->stopping && t->count < TRACER_BATCH &&
           pthread_cond_timedwait(&t->cv, &t->mu, &ts) == 0)
        ;
    full = t->fill;
    t->fill = t->drain;
    t->drain = full;
    n = t->count;
    t->count = 0;
    return n;
}

/* Sends the <n> spans taken, TRACER_BATCH at a time; after a failure while
 * stopping, the rest is not waited for. Returns whether the last failed. */
static bool send_taken(struct tracer *t, size_t n, bool stopping, bool failed)
{
    for (size_t at = 0; at < n; at += TRACER_BATCH) {
        size_t k = n - at < TRACER_BATCH ? n - at : TRACER_BATCH;

        if ((stopping && failed) || !post(t, t->drain + at, k)) {
            metrics_trace_dropped((unsigned)k);
            failed = true;
        } else {
            failed = false;
        }
    }
    return failed;
}

static void *run(void *arg)
{
    struct tracer *t = arg;
    bool failed = false; /* the last export failed */

    pthread_mutex_lock(&t->mu);
    while (!t->stopping || t->count) {
        size_t n = take(t);
        bool stopping = t->stopping;

        pthread_mutex_unlock(&t->mu);
        failed = send_taken(t, n, stopping, failed);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void tracer_free(struct tracer *t)
{
    curl_slist_free_all(t->headers);
    if (t->easy)
        curl_easy_cleanup(t->easy);
    free(t->fill);
    free(t->drain);
    free(t->endpoint);
    free(t->version);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static size_t discard(char *p, size_t size, size_t n, void *ctx)
{
    (void)p;
    (void)ctx;
    return size * n;
}

/* The one handle of every export: kept, so its connection is reused. */
static int setup_easy(struct tracer *t)
{
    CURLcode cc = CURLE_OK;

    t->easy = curl_easy_init();
    t->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (!t->easy || !t->headers)
        return -ENOMEM;
#define SET(opt, val)                                                                              \
    if (cc == CURLE_OK)                                                                            \
    cc = curl_easy_setopt(t->easy, opt, val)
    SET(CURLOPT_URL, t->endpoint);
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_PROXY, "");
    SET(CURLOPT_HTTPHEADER, t->headers);
    SET(CURLOPT_TIMEOUT_MS, (long)TRACER_TIMEOUT_MS);
    SET(CURLOPT_CONNECTTIMEOUT_MS, (long)TRACER_TIMEOUT_MS);
    SET(CURLOPT_ERRORBUFFER, t->errbuf);
    SET(CURLOPT_WRITEFUNCTION, discard);
#undef SET
    return cc == CURLE_OK ? 0 : -ENOMEM;
}

int tracer_start(const char *endpoint, unsigned queue, const char *version, struct tracer **ret)
{
    struct tracer *t = calloc(1, sizeof(*t));
    int err;

    if (!t)
        return -ENOMEM;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->cap = queue ? queue : 1;
    t->fill = calloc(t->cap, sizeof(*t->fill));
    t->drain = calloc(t->cap, sizeof(*t->drain));
    t->endpoint = strdup(endpoint);
    t->version = strdup(version);
    err = t->fill && t->drain && t->endpoint && t->version ? setup_easy(t) : -ENOMEM;
    if (err == 0)
        err = -pthread_create(&t->thread, NULL, run, t);
    if (err < 0) {
        tracer_free(t);
        return err;
    }
    *ret = t;
    return 0;
}

void tracer_stop(struct tracer *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stopping = true;
    pthread_mutex_unlock(&t->mu);
    pthread_cond_signal(&t->cv);
    pthread_join(t->thread, NULL);
    tracer_free(t);
}
