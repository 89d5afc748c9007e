/* SPDX-License-Identifier: MIT */
/* The process's metrics: relaxed atomics that any thread updates without a
 * lock, read by the admin thread when /metrics is asked. What every request
 * counts is counted in a shard of the thread's own (allocated on its first
 * count, kept for the process's life), summed when scraped: no counter is
 * written by two threads at once, so no cache line moves between cores per
 * request. A scrape may see a request counted in one family and not yet in another;
 * within a histogram, _count is computed from the buckets read, so it always
 * equals the +Inf bucket. Route names are interned under a mutex and
 * published by a release store of their count, so a reader that loads the
 * count with acquire sees every name below it whole, without the lock. */
#include "idemproxy/metrics.h"

#include <assert.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "idemproxy/buf.h"
#include "idemproxy/scope.h"
#include "idemproxy/store.h"
#include "idemproxy_version.h"

static const uint64_t bucket_bounds_us[] = METRICS_BUCKET_BOUNDS_US;
_Static_assert(ARRAY_SIZE(bucket_bounds_us) + 1 == METRICS_NBUCKETS, "one +Inf bucket");

static const char *const store_op_names[] = {
    [METRICS_STORE_ACQUIRE] = "acquire", [METRICS_STORE_COMPLETE] = "complete",
    [METRICS_STORE_RELEASE] = "release", [METRICS_STORE_EXTEND] = "extend",
    [METRICS_STORE_UNKNOWN] = "unknown",
};

/* The longest idemproxy_requests_total sample line: the name and labels with a
 * route name of METRICS_ROUTE_NAME_MAX bytes, an outcome of 15 ("outcome_unknown"),
 * a 20-digit count and the newline; and the longest idemproxy_unknown_outcomes_total
 * one, a cause of 16 ("upstream_timeout"). All other families take well under 64 KiB. */
#define REQUESTS_LINE_MAX                                                                          \
    (sizeof("idemproxy_requests_total{route=\"\",outcome=\"\"} \n") - 1 + METRICS_ROUTE_NAME_MAX + \
     15 + 20)
#define UNKNOWN_LINE_MAX                                                                           \
    (sizeof("idemproxy_unknown_outcomes_total{route=\"\",cause=\"\"} \n") - 1 +                    \
     METRICS_ROUTE_NAME_MAX + 16 + 20)
/* A route's two histograms: each bucket line, with "le" of 8 and a 20-digit
 * count, and the _sum and _count lines; and its responses by class. */
#define SCOPE_LINE_MAX                                                                             \
    (sizeof("idemproxy_scope_failures_total{route=\"\",reason=\"\"} \n") - 1 +                     \
     METRICS_ROUTE_NAME_MAX + 16 + 20)
#define RECONCILE_LINE_MAX                                                                         \
    (sizeof("idemproxy_reconciles_total{route=\"\",result=\"\"} \n") - 1 +                         \
     METRICS_ROUTE_NAME_MAX + 6 + 20)
#define HISTOGRAM_LINE_MAX                                                                         \
    (sizeof("idemproxy_upstream_duration_seconds_bucket{route=\"\",le=\"\"} \n") - 1 +             \
     METRICS_ROUTE_NAME_MAX + 8 + 20)
#define RESPONSES_LINE_MAX                                                                         \
    (sizeof("idemproxy_responses_total{route=\"\",class=\"5xx\"} \n") - 1 +                        \
     METRICS_ROUTE_NAME_MAX + 20)
#define STREAMED_LINE_MAX                                                                          \
    (sizeof("idemproxy_streamed_bytes_total{route=\"\",direction=\"down\"} \n") - 1 +              \
     METRICS_ROUTE_NAME_MAX + 20)
#define REQUESTS_TEXT_MAX                                                                          \
    ((uint64_t)METRICS_ROUTES_MAX *                                                                \
     (_OUTCOME_MAX * REQUESTS_LINE_MAX + STORE_CAUSE_MAX * UNKNOWN_LINE_MAX +                      \
      SCOPE_FAILURE_MAX * SCOPE_LINE_MAX + METRICS_RECONCILE_MAX * RECONCILE_LINE_MAX +            \
      2 * (METRICS_NBUCKETS + 2) * HISTOGRAM_LINE_MAX + 4 * RESPONSES_LINE_MAX +                   \
      2 * STREAMED_LINE_MAX))
_Static_assert(REQUESTS_TEXT_MAX + 65536 <= METRICS_TEXT_MAX,
               "METRICS_TEXT_MAX holds the exposition with every route interned");

/* What every request counts, one shard per thread that counts: a large
 * calloc(), so the kernel makes its pages resident only when first written,
 * and the 1024 routes' counters cost memory for the routes in use only. A
 * route id is an index that needs no allocation, no failure path and no
 * pointer to publish. */
struct shard {
    _Atomic uint64_t requests[METRICS_ROUTES_MAX][_OUTCOME_MAX];
    _Atomic uint64_t unknown[METRICS_ROUTES_MAX][STORE_CAUSE_MAX];
    _Atomic uint64_t scope_failures[METRICS_ROUTES_MAX][SCOPE_FAILURE_MAX];
    _Atomic uint64_t reconciles[METRICS_ROUTES_MAX][METRICS_RECONCILE_MAX];
    _Atomic uint64_t responses[METRICS_ROUTES_MAX][4]; /* 2xx, 3xx, 4xx, 5xx */
    _Atomic uint64_t streamed[METRICS_ROUTES_MAX][2];  /* [0] down, [1] up */
    struct metrics_histogram request_duration[METRICS_ROUTES_MAX];
    struct metrics_histogram upstream_duration[METRICS_ROUTES_MAX];
    struct metrics_histogram store_duration[_METRICS_STORE_OP_MAX];
    _Atomic uint64_t inflight; /* adds and takes away, wrapping: the sum of all is right */
    struct shard *next;        /* in <shards>, set before it is published */
};

/* Every shard, newest first (pushed with a release CAS, never removed: a
 * thread's counts outlive it); the one a thread that could not allocate
 * its own shares. */
static _Atomic(struct shard *) shards;
static struct shard spare;
static _Atomic bool spare_listed;
static _Thread_local struct shard *mine;

/* This thread's shard. */
static struct shard *shard(void)
{
    struct shard *s = mine, *head;

    if (s)
        return s;
    s = calloc(1, sizeof(*s));
    if (!s) {
        s = &spare;
        if (atomic_exchange(&spare_listed, true)) {
            mine = s;
            return s;
        }
    }
    head = atomic_load_explicit(&shards, memory_order_relaxed);
    do
        s->next = head;
    while (!atomic_compare_exchange_weak_explicit(&shards, &head, s, memory_order_release,
                                                  memory_order_relaxed));
    mine = s;
    return s;
}

/* The first shard, for a reader that walks them all. */
static const struct shard *first_shard(void)
{
    return atomic_load_explicit(&shards, memory_order_acquire);
}

/* The process's own counters, rare: written by one thread or another. */
static struct {
    _Atomic uint64_t lock_lost;
    _Atomic uint64_t reloads[2]; /* SIGHUP: [0] error, [1] ok */
    atomic_bool last_reload_failed;
    _Atomic uint64_t store_errors;
    _Atomic uint64_t connections_refused;
    _Atomic uint64_t trace_dropped; /* spans that never reached the collector */
    struct timespec started;        /* process_start_time_seconds: written once, before threads */
} m;

/* The sum over every shard of the counter at <offset> bytes into a shard. */
static uint64_t sum_at(size_t offset)
{
    uint64_t n = 0;

    for (const struct shard *s = first_shard(); s; s = s->next)
        n += atomic_load_explicit((const _Atomic uint64_t *)((const char *)s + offset),
                                  memory_order_relaxed);
    return n;
}

#define SUM(field) sum_at(offsetof(struct shard, field))

/* The histogram at <offset> bytes into a shard, summed over every shard into <h>. */
static void sum_histogram(size_t offset, struct metrics_histogram *h)
{
    for (size_t i = 0; i < METRICS_NBUCKETS; i++)
        atomic_store_explicit(&h->buckets[i],
                              sum_at(offset + offsetof(struct metrics_histogram, buckets[i])),
                              memory_order_relaxed);
    atomic_store_explicit(&h->sum_us, sum_at(offset + offsetof(struct metrics_histogram, sum_us)),
                          memory_order_relaxed);
}

/* Route names: route_names[id] for 0 < id < route_count, written once under
 * route_lock before route_count is raised past it, never changed after.
 * "default" (id 0) is not stored, so the array stays in BSS (a non-zero
 * initialiser would put all of it in the binary's data). */
static pthread_mutex_t route_lock = PTHREAD_MUTEX_INITIALIZER;
static char route_names[METRICS_ROUTES_MAX][METRICS_ROUTE_NAME_MAX + 1];
static _Atomic unsigned route_count = 1;

static const char *route_name(unsigned id) { return id == 0 ? "default" : route_names[id]; }

static bool is_route_name(const char *name)
{
    size_t len = 0;

    if (!name)
        return false;
    for (; name[len]; len++) {
        char c = name[len];

        if (len == METRICS_ROUTE_NAME_MAX)
            return false;
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return len > 0;
}

int metrics_route_id(const char *name)
{
    unsigned n;
    int id = -E2BIG;

    if (!is_route_name(name))
        return -EINVAL;
    pthread_mutex_lock(&route_lock);
    n = atomic_load_explicit(&route_count, memory_order_relaxed); /* only written under the lock */
    for (unsigned i = 0; i < n; i++) {
        if (strcmp(route_name(i), name) == 0) {
            id = (int)i;
            goto out;
        }
    }
    if (n < METRICS_ROUTES_MAX) {
        memcpy(route_names[n], name, strlen(name) + 1);
        atomic_store_explicit(&route_count, n + 1, memory_order_release);
        id = (int)n;
    }
out:
    pthread_mutex_unlock(&route_lock);
    return id;
}

uint64_t metrics_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

size_t metrics_bucket_index(uint64_t us)
{
    size_t i = 0;

    while (i < ARRAY_SIZE(bucket_bounds_us) && us > bucket_bounds_us[i])
        i++;
    return i;
}

void metrics_histogram_observe(struct metrics_histogram *h, uint64_t us)
{
    atomic_fetch_add_explicit(&h->buckets[metrics_bucket_index(us)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, us, memory_order_relaxed);
}

void metrics_request(unsigned route_id, enum outcome o, unsigned status, uint64_t total_us,
                     bool has_upstream, uint64_t upstream_us)
{
    /* Relaxed is enough: the id reached this thread after its count was stored. */
    assert(route_id < atomic_load_explicit(&route_count, memory_order_relaxed));
    struct shard *sh = shard();

    if ((unsigned)o < _OUTCOME_MAX)
        atomic_fetch_add_explicit(&sh->requests[route_id][o], 1, memory_order_relaxed);
    if (status >= 200 && status <= 599)
        atomic_fetch_add_explicit(&sh->responses[route_id][status / 100 - 2], 1,
                                  memory_order_relaxed);
    metrics_histogram_observe(&sh->request_duration[route_id], total_us);
    if (has_upstream)
        metrics_histogram_observe(&sh->upstream_duration[route_id], upstream_us);
}

void metrics_trace_dropped(unsigned n)
{
    atomic_fetch_add_explicit(&m.trace_dropped, n, memory_order_relaxed);
}

void metrics_connection_refused(void)
{
    atomic_fetch_add_explicit(&m.connections_refused, 1, memory_order_relaxed);
}

void metrics_process_started(void) { clock_gettime(CLOCK_REALTIME, &m.started); }

void metrics_store_call(enum metrics_store_op op, uint64_t us)
{
    if ((unsigned)op < _METRICS_STORE_OP_MAX)
        metrics_histogram_observe(&shard()->store_duration[op], us);
}

void metrics_inflight_add(int delta)
{
    atomic_fetch_add_explicit(&shard()->inflight, (uint64_t)(int64_t)delta, memory_order_relaxed);
}

void metrics_scope_failure(unsigned route_id, unsigned reason)
{
    assert(route_id < METRICS_ROUTES_MAX && reason < SCOPE_FAILURE_MAX);
    atomic_fetch_add_explicit(&shard()->scope_failures[route_id][reason], 1, memory_order_relaxed);
}

void metrics_reconcile(unsigned route_id, enum metrics_reconcile result)
{
    assert(route_id < METRICS_ROUTES_MAX && result < METRICS_RECONCILE_MAX);
    atomic_fetch_add_explicit(&shard()->reconciles[route_id][result], 1, memory_order_relaxed);
}

void metrics_unknown_outcome(unsigned route_id, unsigned cause)
{
    assert(route_id < METRICS_ROUTES_MAX && cause < STORE_CAUSE_MAX);
    atomic_fetch_add_explicit(&shard()->unknown[route_id][cause], 1, memory_order_relaxed);
}

void metrics_streamed(unsigned route_id, bool up, uint64_t bytes)
{
    assert(route_id < METRICS_ROUTES_MAX);
    atomic_fetch_add_explicit(&shard()->streamed[route_id][up], bytes, memory_order_relaxed);
}

void metrics_lock_lost(void) { atomic_fetch_add_explicit(&m.lock_lost, 1, memory_order_relaxed); }

void metrics_config_reload(bool ok)
{
    atomic_fetch_add_explicit(&m.reloads[ok], 1, memory_order_relaxed);
    atomic_store_explicit(&m.last_reload_failed, !ok, memory_order_relaxed);
}

void metrics_store_error(void)
{
    atomic_fetch_add_explicit(&m.store_errors, 1, memory_order_relaxed);
}

static int appendf(struct buf *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int appendf(struct buf *out, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(line))
        return -E2BIG; /* our own names and numbers: never that long */
    return buf_append(out, line, (size_t)n);
}

/* <us> microseconds as seconds, exactly: "0.0025", "30". */
static void format_seconds(char *out, size_t outlen, uint64_t us)
{
    uint64_t frac = us % 1000000u;
    int digits = 6;

    if (frac == 0) {
        snprintf(out, outlen, "%llu", (unsigned long long)(us / 1000000u));
        return;
    }
    while (frac % 10 == 0) {
        frac /= 10;
        digits--;
    }
    snprintf(out, outlen, "%llu.%0*llu", (unsigned long long)(us / 1000000u), digits,
             (unsigned long long)frac);
}

int metrics_histogram_format(struct buf *out, const char *name, const char *labels,
                             const struct metrics_histogram *h)
{
    const char *sep = labels ? "," : "";
    uint64_t cum = 0;
    char le[32];
    int err = 0;

    labels = labels ? labels : "";
    for (size_t i = 0; i < METRICS_NBUCKETS && err == 0; i++) {
        cum += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        if (i < ARRAY_SIZE(bucket_bounds_us))
            format_seconds(le, sizeof(le), bucket_bounds_us[i]);
        else
            snprintf(le, sizeof(le), "+Inf");
        err = appendf(out, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, labels, sep, le,
                      (unsigned long long)cum);
    }
    if (err == 0) {
        format_seconds(le, sizeof(le), atomic_load_explicit(&h->sum_us, memory_order_relaxed));
        err = appendf(out, "%s_sum%s%s%s %s\n", name, *labels ? "{" : "", labels,
                      *labels ? "}" : "", le);
    }
    if (err == 0)
        err = appendf(out, "%s_count%s%s%s %llu\n", name, *labels ? "{" : "", labels,
                      *labels ? "}" : "", (unsigned long long)cum);
    return err;
}

static int family(struct buf *out, const char *name, const char *type, const char *help)
{
    return appendf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static int simple(struct buf *out, const char *name, const char *type, const char *help,
                  unsigned long long value)
{
    int err = family(out, name, type, help);

    return err ? err : appendf(out, "%s %llu\n", name, value);
}

/* A store's own value (store_metric_fn). */
static int emit_store(void *ctx, const char *name, const char *labels, const char *type,
                      const char *help, uint64_t value)
{
    int err = help ? family(ctx, name, type, help) : 0;

    if (err == 0)
        err = appendf(ctx, "%s%s%s%s %llu\n", name, labels ? "{" : "", labels ? labels : "",
                      labels ? "}" : "", (unsigned long long)value);
    return err;
}

/* The request and upstream duration histograms, by route, and the store's,
 * by operation. */
static int format_durations(struct buf *out, unsigned nroutes)
{
    const struct {
        const char *name, *help;
        size_t offset; /* of the [METRICS_ROUTES_MAX] in a shard */
    } by_route[] = {
        { "idemproxy_request_duration_seconds",
          "Time from a request's headers to its answer, by route.",
          offsetof(struct shard, request_duration) },
        { "idemproxy_upstream_duration_seconds",
          "Time the upstream took to answer a forwarded request, by route.",
          offsetof(struct shard, upstream_duration) },
    };
    char labels[METRICS_ROUTE_NAME_MAX + 16];
    struct metrics_histogram h;
    int err = 0;

    for (size_t f = 0; f < ARRAY_SIZE(by_route) && err == 0; f++) {
        err = family(out, by_route[f].name, "histogram", by_route[f].help);
        for (unsigned r = 0; r < nroutes && err == 0; r++) {
            snprintf(labels, sizeof(labels), "route=\"%s\"", route_name(r));
            sum_histogram(by_route[f].offset + r * sizeof(h), &h);
            err = metrics_histogram_format(out, by_route[f].name, labels, &h);
        }
    }
    if (err == 0)
        err = family(out, "idemproxy_store_duration_seconds", "histogram",
                     "Time one store call took, by operation.");
    for (size_t i = 0; i < _METRICS_STORE_OP_MAX && err == 0; i++) {
        snprintf(labels, sizeof(labels), "op=\"%s\"", store_op_names[i]);
        sum_histogram(offsetof(struct shard, store_duration) + i * sizeof(h), &h);
        err = metrics_histogram_format(out, "idemproxy_store_duration_seconds", labels, &h);
    }
    return err;
}

/* Answers sent by route and status class, and the connections refused. */
static int format_responses(struct buf *out, unsigned nroutes)
{
    int err = family(out, "idemproxy_responses_total", "counter",
                     "Answers sent, by route and status class (the upstream's own and the "
                     "proxy's problems alike).");

    for (unsigned r = 0; r < nroutes && err == 0; r++) {
        for (unsigned c = 0; c < 4 && err == 0; c++)
            err = appendf(out, "idemproxy_responses_total{route=\"%s\",class=\"%uxx\"} %llu\n",
                          route_name(r), c + 2, (unsigned long long)SUM(responses[r][c]));
    }
    if (err == 0)
        err = simple(
            out, "idemproxy_connections_refused_total", "counter",
            "Client connections closed at once: --max-connections were open.",
            (unsigned long long)atomic_load_explicit(&m.connections_refused, memory_order_relaxed));
    if (err == 0)
        err = simple(
            out, "idemproxy_trace_spans_dropped_total", "counter",
            "Spans that never reached the collector (--otlp-endpoint): the queue was full "
            "(--trace-queue), or the collector refused or did not answer their export.",
            (unsigned long long)atomic_load_explicit(&m.trace_dropped, memory_order_relaxed));
    return err;
}

/* idemproxy_streamed_bytes_total, a sample per route and direction. */
static int format_streamed(struct buf *out, unsigned nroutes)
{
    int err = family(out, "idemproxy_streamed_bytes_total", "counter",
                     "Body bytes that streamed through the proxy, by route and direction (up: "
                     "to the upstream, down: to the client).");

    for (unsigned r = 0; r < nroutes && err == 0; r++) {
        for (unsigned d = 0; d < 2 && err == 0; d++)
            err =
                appendf(out, "idemproxy_streamed_bytes_total{route=\"%s\",direction=\"%s\"} %llu\n",
                        route_name(r), d ? "up" : "down", (unsigned long long)SUM(streamed[r][d]));
    }
    return err;
}

static int format_reconciles(struct buf *out, unsigned nroutes)
{
    static const char *const names[METRICS_RECONCILE_MAX] = {
        [METRICS_RECONCILE_FOUND] = "found",
        [METRICS_RECONCILE_ABSENT] = "absent",
        [METRICS_RECONCILE_FAILED] = "failed",
    };
    int err = family(out, "idemproxy_reconciles_total", "counter",
                     "Probes of unknown keys' outcomes (doc/configuration.md, Reconcile), by "
                     "route and result.");

    for (unsigned r = 0; r < nroutes && err == 0; r++) {
        for (unsigned x = 0; x < METRICS_RECONCILE_MAX && err == 0; x++)
            err = appendf(out, "idemproxy_reconciles_total{route=\"%s\",result=\"%s\"} %llu\n",
                          route_name(r), names[x], (unsigned long long)SUM(reconciles[r][x]));
    }
    return err;
}

static int format_scope_failures(struct buf *out, unsigned nroutes)
{
    int err = family(out, "idemproxy_scope_failures_total", "counter",
                     "Keyed requests whose principal was refused (doc/configuration.md, Scope), "
                     "answered 401 or forwarded unprotected, by route and reason.");

    for (unsigned r = 0; r < nroutes && err == 0; r++) {
        for (unsigned f = 0; f < SCOPE_FAILURE_MAX && err == 0; f++)
            err = appendf(out, "idemproxy_scope_failures_total{route=\"%s\",reason=\"%s\"} %llu\n",
                          route_name(r), scope_failure_label((enum scope_failure)f),
                          (unsigned long long)SUM(scope_failures[r][f]));
    }
    return err;
}

int metrics_format(struct buf *out, struct store *st)
{
    unsigned nroutes = atomic_load_explicit(&route_count, memory_order_acquire);
    int64_t inflight;
    int err;

    err = family(out, "idemproxy_requests_total", "counter",
                 "Client requests answered, by route (default when none matched) and outcome "
                 "(README.md, What it does with each request).");
    for (unsigned r = 0; r < nroutes && err == 0; r++) {
        for (size_t o = 0; o < _OUTCOME_MAX && err == 0; o++)
            err = appendf(out, "idemproxy_requests_total{route=\"%s\",outcome=\"%s\"} %llu\n",
                          route_name(r), outcome_label((enum outcome)o),
                          (unsigned long long)SUM(requests[r][o]));
    }
    if (err == 0)
        err = family(out, "idemproxy_unknown_outcomes_total", "counter",
                     "Keys whose request may have run upstream without an answer being stored "
                     "(doc/guarantees.md, Unknown outcomes), by route and cause.");
    for (unsigned r = 0; r < nroutes && err == 0; r++) {
        for (unsigned c = 0; c < STORE_CAUSE_MAX && err == 0; c++)
            err = appendf(out, "idemproxy_unknown_outcomes_total{route=\"%s\",cause=\"%s\"} %llu\n",
                          route_name(r), store_cause_name((enum store_cause)c),
                          (unsigned long long)SUM(unknown[r][c]));
    }
    if (err == 0)
        err = format_scope_failures(out, nroutes);
    if (err == 0)
        err = format_reconciles(out, nroutes);
    if (err == 0)
        err = format_streamed(out, nroutes);
    if (err == 0)
        err = format_responses(out, nroutes);
    if (err == 0)
        err = format_durations(out, nroutes);
    inflight = (int64_t)SUM(inflight); /* each shard's may be negative: their sum is not */
    if (err == 0)
        err = simple(out, "idemproxy_inflight", "gauge", "Client requests being handled.",
                     inflight > 0 ? (unsigned long long)inflight : 0);
    if (err == 0)
        err = simple(out, "idemproxy_lock_lost_total", "counter",
                     "Locks found taken by another request before the answer was stored.",
                     (unsigned long long)atomic_load_explicit(&m.lock_lost, memory_order_relaxed));
    if (err == 0)
        err = family(out, "idemproxy_config_reloads_total", "counter",
                     "Configuration reloads on SIGHUP, by result (ok: applied; error: the file "
                     "had problems, nothing changed).");
    for (int ok = 1; ok >= 0 && err == 0; ok--)
        err = appendf(
            out, "idemproxy_config_reloads_total{result=\"%s\"} %llu\n", ok ? "ok" : "error",
            (unsigned long long)atomic_load_explicit(&m.reloads[ok], memory_order_relaxed));
    if (err == 0)
        err = simple(out, "idemproxy_config_last_reload_successful", "gauge",
                     "0 while the last SIGHUP reload failed (the proxy runs on the configuration "
                     "it had before); 1 once one applied, and from start.",
                     !atomic_load_explicit(&m.last_reload_failed, memory_order_relaxed));
    if (err == 0)
        err =
            simple(out, "idemproxy_store_errors_total", "counter",
                   "Store calls that failed (unreachable, timed out, full).",
                   (unsigned long long)atomic_load_explicit(&m.store_errors, memory_order_relaxed));
    if (err == 0 && st)
        err = store_metrics(st, emit_store, out);
    if (err == 0)
        err = family(out, "process_start_time_seconds", "gauge",
                     "When the process started, in seconds since the Unix epoch.");
    if (err == 0)
        err = appendf(out, "process_start_time_seconds %lld.%03ld\n", (long long)m.started.tv_sec,
                      m.started.tv_nsec / 1000000);
    if (err == 0)
        err = family(out, "idemproxy_build_info", "gauge", "The running version, always 1.");
    if (err == 0)
        err = appendf(out, "idemproxy_build_info{version=\"%s\"} 1\n", IDEMPROXY_VERSION);
    return err;
}
