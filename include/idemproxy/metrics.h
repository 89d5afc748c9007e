/* SPDX-License-Identifier: MIT */
/* Process-wide counters, gauges and histograms, and their Prometheus text
 * exposition (format 0.0.4) for the admin listener's /metrics. Any thread may
 * record: every update is one or two relaxed atomic additions, no lock (only
 * interning a route name, at config load, takes one). */
#ifndef IDEMPROXY_METRICS_H
#define IDEMPROXY_METRICS_H

#include <stdatomic.h>

#include "idemproxy/common.h"
#include "idemproxy/outcome.h"

struct buf;
struct store;

/* The upper bounds of the histogram buckets, in microseconds; a last bucket
 * (+Inf) takes everything above. Shared by every histogram. */
#define METRICS_BUCKET_BOUNDS_US                                                                   \
    {                                                                                              \
        500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000,      \
            5000000, 10000000, 30000000                                                            \
    }
#define METRICS_NBUCKETS 16 /* the bounds above, then +Inf */

/* The store calls whose duration is measured (label op). */
enum metrics_store_op {
    METRICS_STORE_ACQUIRE,
    METRICS_STORE_COMPLETE,
    METRICS_STORE_RELEASE,
    METRICS_STORE_EXTEND,
    METRICS_STORE_UNKNOWN,
    _METRICS_STORE_OP_MAX
};

/* A histogram of durations. All-zero is empty. Counts are per bucket, not
 * cumulative: the exposition adds them up. */
struct metrics_histogram {
    _Atomic uint64_t buckets[METRICS_NBUCKETS];
    _Atomic uint64_t sum_us;
};

/* Monotonic microseconds, for the durations recorded here. */
uint64_t metrics_now_us(void);

/* The bucket a duration of <us> microseconds falls in: the first whose bound
 * is >= <us> (Prometheus "le" is inclusive), or METRICS_NBUCKETS - 1 (+Inf). */
size_t metrics_bucket_index(uint64_t us);

/* Adds one observation of <us> microseconds to <h>. */
void metrics_histogram_observe(struct metrics_histogram *h, uint64_t us);

/* Appends the samples of histogram <h> named <name> to <out>: one
 * <name>_bucket line per bound (cumulative counts, the last le="+Inf"), then
 * <name>_sum (seconds) and <name>_count (equal to the +Inf bucket). <labels>
 * (e.g. `op="acquire"`, or NULL) goes first in every label set. Returns 0,
 * -ENOMEM or -E2BIG (the limit of <out>). */
int metrics_histogram_format(struct buf *out, const char *name, const char *labels,
                             const struct metrics_histogram *h);

/* The most route names metrics_route_id() interns, "default" included. */
#define METRICS_ROUTES_MAX 1024

/* The longest route name, in bytes (doc/configuration.md, The file: [a-z0-9_-]{1,64}). */
#define METRICS_ROUTE_NAME_MAX 64

/* A limit for the buffer metrics_format() writes into that always holds the
 * whole exposition: METRICS_ROUTES_MAX routes with names of
 * METRICS_ROUTE_NAME_MAX bytes, their two histograms and 20-digit counts take
 * about 8 MB (a scrape of a few routes, a few tens of KB). */
#define METRICS_TEXT_MAX (16u << 20)

/* Returns the id of the route <name> (a NUL-terminated string), interning it
 * on first use: the same name always gets the same id for the life of the
 * process, across config reloads, and ids count up from 0 in the order names
 * are first seen. "default" (the route of a request that matches none) is
 * always 0, interned from the start. Returns -EINVAL when <name> is NULL or
 * not 1 to METRICS_ROUTE_NAME_MAX bytes of [a-z0-9_-], or -E2BIG for a new
 * name once METRICS_ROUTES_MAX are interned (a known name still gets its id).
 * Any thread may call it; it takes a lock and scans the names, so call it
 * when routes are loaded and keep the id, not once per request. */
int metrics_route_id(const char *name);

/* Counts one client request of route <route_id> (an id metrics_route_id()
 * returned; any other is a bug, caught by assert()) answered with outcome <o>
 * and <status> (its class counted; 0: no answer was sent) after <total_us>;
 * when <has_upstream>, it was forwarded and the upstream took <upstream_us>.
 * Call once per request. */
void metrics_request(unsigned route_id, enum outcome o, unsigned status, uint64_t total_us,
                     bool has_upstream, uint64_t upstream_us);

/* Counts a client connection refused over --max-connections. */
void metrics_connection_refused(void);

/* Counts <n> spans that will never reach the collector (tracer.h). */
void metrics_trace_dropped(unsigned n);

/* Notes the time the process started, for process_start_time_seconds: call
 * once, early in main. */
void metrics_process_started(void);

/* A probe's result (doc/configuration.md, Reconcile). */
enum metrics_reconcile {
    METRICS_RECONCILE_FOUND,
    METRICS_RECONCILE_ABSENT,
    METRICS_RECONCILE_FAILED,
    METRICS_RECONCILE_MAX,
};

/* Counts a probe of an unknown key of route <route_id> that got <result>. */
void metrics_reconcile(unsigned route_id, enum metrics_reconcile result);

/* Counts a key of route <route_id> whose outcome became unknown for <cause>
 * (an enum store_cause: doc/guarantees.md, Unknown outcomes). */
void metrics_unknown_outcome(unsigned route_id, unsigned cause);

/* Counts a keyed request of route <route_id> whose principal was refused
 * for <reason> (an enum scope_failure: doc/configuration.md, Scope), whether
 * it was answered 401 or forwarded unprotected. */
void metrics_scope_failure(unsigned route_id, unsigned reason);

/* Counts <bytes> of a streamed body of route <route_id> (doc/guarantees.md,
 * "Streaming"): <up> from the client to the upstream, else from the
 * upstream to the client. */
void metrics_streamed(unsigned route_id, bool up, uint64_t bytes);

/* Records one store call of kind <op> that took <us>. */
void metrics_store_call(enum metrics_store_op op, uint64_t us);

/* Adds <delta> (+1 when the handling of a client request starts, -1 when it
 * is answered) to the idemproxy_inflight gauge. */
void metrics_inflight_add(int delta);

/* Counts a lock found taken by another request (lock_lost). */
void metrics_lock_lost(void);

/* Counts a SIGHUP reload: applied (<ok>) or refused for its problems. */
void metrics_config_reload(bool ok);

/* Counts a store call that failed (not a lost lock). */
void metrics_store_error(void);

/* Appends the whole exposition to <out>: every family with # HELP and # TYPE
 * (idemproxy_requests_total has one sample per interned route, in id order,
 * and outcome), and the memory-store gauges when <st> (borrowed, may be NULL)
 * is the memory store. Returns 0, -ENOMEM or -E2BIG (the limit of <out>;
 * never with a limit of METRICS_TEXT_MAX). */
int metrics_format(struct buf *out, struct store *st);

/* The Content-Type of metrics_format()'s text. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
