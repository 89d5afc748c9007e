/* SPDX-License-Identifier: MIT */
#include <stdint.h>

#include "check.h"
#include "idemproxy/buf.h"
#include "idemproxy/metrics.h"
#include "idemproxy_version.h"

/* NUL-terminated copy of <b>'s text, for strstr(). */
static char *text_of(struct buf *b)
{
    char nul = '\0';

    CHECK_EQ_INT(buf_append(b, &nul, 1), 0);
    return b->data;
}

static void test_metrics_bucket_bounds_are_inclusive(void)
{
    CHECK_EQ_INT(metrics_bucket_index(0), 0);
    CHECK_EQ_INT(metrics_bucket_index(500), 0);  /* le="0.0005" holds 500 us itself */
    CHECK_EQ_INT(metrics_bucket_index(501), 1);  /* le="0.001" */
    CHECK_EQ_INT(metrics_bucket_index(1000), 1); /* le="0.001" */
    CHECK_EQ_INT(metrics_bucket_index(1001), 2);
    CHECK_EQ_INT(metrics_bucket_index(30000000), METRICS_NBUCKETS - 2); /* le="30" */
    CHECK_EQ_INT(metrics_bucket_index(30000001), METRICS_NBUCKETS - 1); /* +Inf */
    CHECK_EQ_INT(metrics_bucket_index(UINT64_MAX), METRICS_NBUCKETS - 1);
}

static void test_metrics_histogram_is_cumulative_with_sum_and_count(void)
{
    struct metrics_histogram h = { 0 };
    struct buf out = BUF_INIT(1 << 16);
    char *text;

    metrics_histogram_observe(&h, 400);      /* 0.0005 */
    metrics_histogram_observe(&h, 2500);     /* 0.0025 */
    metrics_histogram_observe(&h, 2600);     /* 0.005 */
    metrics_histogram_observe(&h, 60000000); /* +Inf */
    CHECK_EQ_INT(metrics_histogram_format(&out, "t_seconds", NULL, &h), 0);
    text = text_of(&out);
    CHECK(strstr(text, "t_seconds_bucket{le=\"0.0005\"} 1\n") == text); /* first line */
    CHECK(strstr(text, "\nt_seconds_bucket{le=\"0.001\"} 1\n"));
    CHECK(strstr(text, "\nt_seconds_bucket{le=\"0.0025\"} 2\n"));
    CHECK(strstr(text, "\nt_seconds_bucket{le=\"0.005\"} 3\n"));
    CHECK(strstr(text, "\nt_seconds_bucket{le=\"30\"} 3\n"));
    CHECK(strstr(text, "\nt_seconds_bucket{le=\"+Inf\"} 4\n"));
    CHECK(strstr(text, "\nt_seconds_sum 60.0055\n"));
    CHECK(strstr(text, "\nt_seconds_count 4\n"));
    buf_done(&out);
}

static void test_metrics_histogram_labels_come_first(void)
{
    struct metrics_histogram h = { 0 };
    struct buf out = BUF_INIT(1 << 16);
    char *text;

    CHECK_EQ_INT(metrics_histogram_format(&out, "s", "op=\"acquire\"", &h), 0);
    text = text_of(&out);
    CHECK(strstr(text, "s_bucket{op=\"acquire\",le=\"+Inf\"} 0\n"));
    CHECK(strstr(text, "\ns_sum{op=\"acquire\"} 0\n"));
    CHECK(strstr(text, "\ns_count{op=\"acquire\"} 0\n"));
    buf_done(&out);
}

static void test_metrics_format_counts_every_outcome(void)
{
    struct buf out = BUF_INIT(1 << 20);
    char *text;

    metrics_request(OUTCOME_REPLAYED, 1200, false, 0);
    metrics_request(OUTCOME_EXECUTED, 3000, true, 2000);
    metrics_store_call(METRICS_STORE_EXTEND, 700);
    metrics_inflight_add(1);
    metrics_lock_lost();
    metrics_store_error();
    metrics_store_error();
    CHECK_EQ_INT(metrics_format(&out, NULL), 0);
    text = text_of(&out);
    CHECK(strstr(text, "# TYPE idemproxy_requests_total counter\n"));
    CHECK(strstr(text, "\nidemproxy_requests_total{outcome=\"replayed\"} 1\n"));
    CHECK(strstr(text, "\nidemproxy_requests_total{outcome=\"executed\"} 1\n"));
    CHECK(strstr(text, "\nidemproxy_requests_total{outcome=\"upstream_error\"} 0\n"));
    CHECK(strstr(text, "\nidemproxy_requests_total{outcome=\"passthrough\"} 0\n"));
    CHECK(strstr(text, "\nidemproxy_request_duration_seconds_count 2\n"));
    CHECK(strstr(text, "\nidemproxy_request_duration_seconds_sum 0.0042\n"));
    CHECK(strstr(text, "\nidemproxy_upstream_duration_seconds_count 1\n"));
    CHECK(
        strstr(text, "\nidemproxy_store_duration_seconds_bucket{op=\"extend\",le=\"0.001\"} 1\n"));
    CHECK(strstr(text, "\nidemproxy_store_duration_seconds_count{op=\"acquire\"} 0\n"));
    CHECK(strstr(text, "\nidemproxy_inflight 1\n"));
    CHECK(strstr(text, "\nidemproxy_lock_lost_total 1\n"));
    CHECK(strstr(text, "\nidemproxy_store_errors_total 2\n"));
    CHECK(strstr(text, "\nidemproxy_build_info{version=\"" IDEMPROXY_VERSION "\"} 1\n"));
    CHECK(!strstr(text, "idemproxy_memory_store")); /* no store given */
    metrics_inflight_add(-1);
    buf_done(&out);
}

static void test_metrics_format_respects_the_buffer_limit(void)
{
    struct buf out = BUF_INIT(100);

    CHECK_EQ_INT(metrics_format(&out, NULL), -E2BIG);
    buf_done(&out);
}

TEST_MAIN(test_metrics_bucket_bounds_are_inclusive,
          test_metrics_histogram_is_cumulative_with_sum_and_count,
          test_metrics_histogram_labels_come_first, test_metrics_format_counts_every_outcome,
          test_metrics_format_respects_the_buffer_limit)
