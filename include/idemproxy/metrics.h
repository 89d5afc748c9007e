/* SPDX-License-Identifier: MIT */
/* Process-wide counters, gauges and histograms, and their Prometheus text
 * exposition (format 0.0.4) for the admin listener's /metrics. Any thread may
 * record: every update is one or two relaxed atomic additions, no lock. */
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

/* Counts one client request answered with outcome <o> after <total_us>; when
 * <has_upstream>, it was forwarded and the upstream took <upstream_us>. Call
 * once per request. */
void metrics_request(enum outcome o, uint64_t total_us, bool has_upstream, uint64_t upstream_us);

/* Records one store call of kind <op> that took <us>. */
void metrics_store_call(enum metrics_store_op op, uint64_t us);

/* Adds <delta> (+1 when the handling of a client request starts, -1 when it
 * is answered) to the idemproxy_inflight gauge. */
void metrics_inflight_add(int delta);

/* Counts a lock found taken by another request (lock_lost). */
void metrics_lock_lost(void);

/* Counts a store call that failed (not a lost lock). */
void metrics_store_error(void);

/* Appends the whole exposition to <out>: every family with # HELP and # TYPE,
 * and the memory-store gauges when <st> (borrowed, may be NULL) is the memory
 * store. Returns 0, -ENOMEM or -E2BIG. */
int metrics_format(struct buf *out, struct store *st);

/* The Content-Type of metrics_format()'s text. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
