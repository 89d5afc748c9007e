/* SPDX-License-Identifier: MIT */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

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

    metrics_request(0, OUTCOME_REPLAYED, 200, 1200, false, 0);
    metrics_request(0, OUTCOME_EXECUTED, 200, 3000, true, 2000);
    metrics_store_call(METRICS_STORE_EXTEND, 700);
    metrics_inflight_add(1);
    metrics_lock_lost();
    metrics_store_error();
    metrics_store_error();
    CHECK_EQ_INT(metrics_format(&out, NULL), 0);
    text = text_of(&out);
    CHECK(strstr(text, "# TYPE idemproxy_requests_total counter\n"));
    CHECK(strstr(text, "\nidemproxy_requests_total{route=\"default\",outcome=\"replayed\"} 1\n"));
    CHECK(strstr(text, "\nidemproxy_requests_total{route=\"default\",outcome=\"executed\"} 1\n"));
    CHECK(strstr(text,
                 "\nidemproxy_requests_total{route=\"default\",outcome=\"upstream_error\"} 0\n"));
    CHECK(
        strstr(text, "\nidemproxy_requests_total{route=\"default\",outcome=\"passthrough\"} 0\n"));
    CHECK(!strstr(text, "{outcome=")); /* the route label always comes first */
    CHECK(strstr(text, "\nidemproxy_request_duration_seconds_count{route=\"default\"} 2\n"));
    CHECK(strstr(text, "\nidemproxy_request_duration_seconds_sum{route=\"default\"} 0.0042\n"));
    CHECK(strstr(text, "\nidemproxy_upstream_duration_seconds_count{route=\"default\"} 1\n"));
    CHECK(strstr(text, "\nidemproxy_responses_total{route=\"default\",class=\"2xx\"} 2\n"));
    CHECK(strstr(text, "\nidemproxy_responses_total{route=\"default\",class=\"5xx\"} 0\n"));
    CHECK(strstr(text, "\nidemproxy_connections_refused_total 0\n"));
    CHECK(strstr(text, "\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds "));
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

/* Before any other test interns a name: "default" is there from the start. */
static void test_metrics_route_default_is_zero(void)
{
    struct buf out = BUF_INIT(1 << 20);
    char *text;

    CHECK_EQ_INT(metrics_route_id("default"), 0);
    CHECK_EQ_INT(metrics_route_id("default"), 0);
    CHECK_EQ_INT(metrics_format(&out, NULL), 0);
    text = text_of(&out);
    CHECK(strstr(text, "\nidemproxy_requests_total{route=\"default\",outcome=\"passthrough\"} "));
    CHECK(strstr(text, "\nidemproxy_requests_total{route=\"default\",outcome=\"bad_request\"} "));
    buf_done(&out);
}

static void test_metrics_route_id_interns_once(void)
{
    int a = metrics_route_id("payments"), b = metrics_route_id("stripe-webhooks_2");

    CHECK(a > 0);
    CHECK(b > 0 && b != a);
    CHECK_EQ_INT(b, a + 1); /* ids count up in the order names are first seen */
    CHECK_EQ_INT(metrics_route_id("payments"), a);
    CHECK_EQ_INT(metrics_route_id("stripe-webhooks_2"), b);
    CHECK_EQ_INT(metrics_route_id("default"), 0);
}

static void test_metrics_route_id_refuses_bad_names(void)
{
    char longest[METRICS_ROUTE_NAME_MAX + 2];

    CHECK_EQ_INT(metrics_route_id(NULL), -EINVAL);
    CHECK_EQ_INT(metrics_route_id(""), -EINVAL);
    CHECK_EQ_INT(metrics_route_id("Payments"), -EINVAL);
    CHECK_EQ_INT(metrics_route_id("a b"), -EINVAL);
    CHECK_EQ_INT(metrics_route_id("a.b"), -EINVAL);
    CHECK_EQ_INT(metrics_route_id("a\"b"), -EINVAL); /* would break the label */
    CHECK_EQ_INT(metrics_route_id("a\nb"), -EINVAL);
    CHECK_EQ_INT(metrics_route_id("caf\xc3\xa9"), -EINVAL);
    memset(longest, 'x', METRICS_ROUTE_NAME_MAX);
    longest[METRICS_ROUTE_NAME_MAX] = '\0';
    CHECK(metrics_route_id(longest) > 0); /* 64 bytes: the longest allowed */
    longest[METRICS_ROUTE_NAME_MAX] = 'x';
    longest[METRICS_ROUTE_NAME_MAX + 1] = '\0';
    CHECK_EQ_INT(metrics_route_id(longest), -EINVAL); /* 65 */
}

static void test_metrics_format_labels_route_and_outcome(void)
{
    struct buf out = BUF_INIT(1 << 20);
    int pay = metrics_route_id("payments"), hooks = metrics_route_id("stripe-webhooks_2");
    char *text, *p_default, *p_pay, *p_hooks;

    CHECK(pay > 0 && hooks > pay);
    metrics_request((unsigned)pay, OUTCOME_EXECUTED, 200, 100, true, 50);
    metrics_request((unsigned)pay, OUTCOME_EXECUTED, 200, 100, true, 50);
    metrics_request((unsigned)hooks, OUTCOME_MISMATCH, 422, 100, false, 0);
    metrics_request((unsigned)hooks, OUTCOME_UPSTREAM_ERROR, 502, 100, true, 90);
    metrics_request((unsigned)hooks, OUTCOME_PASSTHROUGH, 0, 100, true, 90); /* no answer sent */
    CHECK_EQ_INT(metrics_format(&out, NULL), 0);
    text = text_of(&out);
    CHECK(strstr(text, "# HELP idemproxy_requests_total Client requests answered, by route"));
    CHECK(strstr(text, "\nidemproxy_requests_total{route=\"payments\",outcome=\"executed\"} 2\n"));
    CHECK(strstr(text, "\nidemproxy_requests_total{route=\"payments\",outcome=\"mismatch\"} 0\n"));
    CHECK(strstr(
        text, "\nidemproxy_requests_total{route=\"stripe-webhooks_2\",outcome=\"mismatch\"} 1\n"));
    CHECK(strstr(
        text, "\nidemproxy_requests_total{route=\"stripe-webhooks_2\",outcome=\"executed\"} 0\n"));
    CHECK(
        strstr(text, "\nidemproxy_responses_total{route=\"stripe-webhooks_2\",class=\"4xx\"} 1\n"));
    CHECK(
        strstr(text, "\nidemproxy_responses_total{route=\"stripe-webhooks_2\",class=\"5xx\"} 1\n"));
    CHECK(
        strstr(text, "\nidemproxy_responses_total{route=\"stripe-webhooks_2\",class=\"2xx\"} 0\n"));
    CHECK(strstr(text, "\nidemproxy_upstream_duration_seconds_count{route=\"stripe-webhooks_2\"} "
                       "2\n"));
    CHECK(strstr(text, "\nidemproxy_upstream_duration_seconds_count{route=\"payments\"} 2\n"));
    /* in id order, the family's samples together, histograms by route */
    p_default = strstr(text, "{route=\"default\",outcome=\"bad_request\"}");
    p_pay = strstr(text, "{route=\"payments\",outcome=\"passthrough\"}");
    p_hooks = strstr(text, "{route=\"stripe-webhooks_2\",outcome=\"passthrough\"}");
    CHECK(p_default && p_pay && p_hooks && p_default < p_pay && p_pay < p_hooks);
    CHECK(p_hooks && p_hooks < strstr(text, "# HELP idemproxy_request_duration_seconds "));
    CHECK(strstr(
        text, "\nidemproxy_request_duration_seconds_bucket{route=\"payments\",le=\"+Inf\"} 2\n"));
    CHECK(!strstr(text, "duration_seconds_bucket{le="));
    buf_done(&out);
}

struct intern_arg {
    int ids[64];
    bool reverse;
};

static void *intern_many(void *p)
{
    struct intern_arg *a = p;
    char name[32];

    for (int k = 0; k < 64; k++) {
        int i = a->reverse ? 63 - k : k;

        snprintf(name, sizeof(name), "race-%d", i);
        a->ids[i] = metrics_route_id(name);
    }
    return NULL;
}

/* Threads interning the same names in different orders agree on every id. */
static void test_metrics_route_id_is_thread_safe(void)
{
    struct intern_arg args[4] = {
        { .reverse = false }, { .reverse = true }, { .reverse = false }, { .reverse = true }
    };
    pthread_t t[4];

    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(pthread_create(&t[i], NULL, intern_many, &args[i]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    for (int k = 0; k < 64; k++) {
        CHECK(args[0].ids[k] > 0);
        for (int i = 1; i < 4; i++)
            CHECK_EQ_INT(args[i].ids[k], args[0].ids[k]);
    }
}

/* Last: it fills the table for the rest of the process. */
static void test_metrics_route_id_full_is_e2big(void)
{
    struct buf out = BUF_INIT(METRICS_TEXT_MAX);
    char name[METRICS_ROUTE_NAME_MAX + 1], last[METRICS_ROUTE_NAME_MAX + 1] = "", line[128];
    int pay = metrics_route_id("payments"), id, prev = -1;

    for (int i = 0; i <= METRICS_ROUTES_MAX; i++) {
        snprintf(name, sizeof(name), "%064d", i); /* the longest names: the biggest exposition */
        id = metrics_route_id(name);
        if (id < 0)
            break;
        if (prev >= 0)
            CHECK_EQ_INT(id, prev + 1);
        prev = id;
        memcpy(last, name, sizeof(name));
    }
    CHECK_EQ_INT(id, -E2BIG);
    CHECK_EQ_INT(prev, METRICS_ROUTES_MAX - 1);
    CHECK_EQ_INT(metrics_route_id(name), -E2BIG);    /* refused again: nothing half interned */
    CHECK_EQ_INT(metrics_route_id("payments"), pay); /* known names still get their id */
    CHECK_EQ_INT(metrics_route_id("default"), 0);
    CHECK_EQ_INT(metrics_route_id(last), METRICS_ROUTES_MAX - 1);
    CHECK_EQ_INT(metrics_route_id("Bad name"), -EINVAL); /* validated first */
    metrics_request(METRICS_ROUTES_MAX - 1, OUTCOME_REPLAYED, 200, 1, false, 0);
    CHECK_EQ_INT(metrics_format(&out, NULL), 0); /* the whole table fits METRICS_TEXT_MAX */
    snprintf(line, sizeof(line),
             "\nidemproxy_requests_total{route=\"%s\",outcome=\"replayed\"} 1\n", last);
    CHECK(strstr(text_of(&out), line));
    buf_done(&out);
}

/* idemproxy_config_last_reload_successful: 1 from start, 0 while the last
 * reload failed, the counters by result beside it. */
static void test_metrics_last_reload_follows_the_last_result(void)
{
    static const struct {
        int reload; /* -1: none yet; else the result of the reload */
        const char *gauge, *ok, *error;
    } steps[] = {
        { -1, "1", "0", "0" }, { 0, "0", "0", "1" }, { 0, "0", "0", "2" },
        { 1, "1", "1", "2" },  { 0, "0", "1", "3" },
    };
    char line[128];

    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        struct buf out = BUF_INIT(METRICS_TEXT_MAX);
        const char *text;

        if (steps[i].reload >= 0)
            metrics_config_reload(steps[i].reload);
        CHECK_EQ_INT(metrics_format(&out, NULL), 0);
        text = text_of(&out);
        CHECK(strstr(text, "# TYPE idemproxy_config_last_reload_successful gauge\n"));
        snprintf(line, sizeof(line), "\nidemproxy_config_last_reload_successful %s\n",
                 steps[i].gauge);
        CHECK(strstr(text, line));
        snprintf(line, sizeof(line), "\nidemproxy_config_reloads_total{result=\"ok\"} %s\n",
                 steps[i].ok);
        CHECK(strstr(text, line));
        snprintf(line, sizeof(line), "\nidemproxy_config_reloads_total{result=\"error\"} %s\n",
                 steps[i].error);
        CHECK(strstr(text, line));
        buf_done(&out);
    }
}

/* A thread's counts: 1000 requests of route 0 answered 503 (store_error),
 * and a request in flight that another thread ends. */
static void *count_from_a_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < 1000; i++)
        metrics_request(0, OUTCOME_STORE_ERROR, 503, 100, false, 0);
    metrics_inflight_add(1);
    return NULL;
}

/* Each thread counts in a shard of its own; a scrape sums them all, those
 * of threads gone included, and a gauge raised on one thread and lowered on
 * another comes back to what it was. */
static void test_metrics_counts_of_every_thread_are_summed(void)
{
    pthread_t t[3];
    struct buf out = BUF_INIT(METRICS_TEXT_MAX);
    const char *text;

    for (size_t i = 0; i < 3; i++)
        CHECK_EQ_INT(pthread_create(&t[i], NULL, count_from_a_thread, NULL), 0);
    for (size_t i = 0; i < 3; i++)
        CHECK_EQ_INT(pthread_join(t[i], NULL), 0);
    metrics_request(0, OUTCOME_STORE_ERROR, 503, 100, false, 0);
    CHECK_EQ_INT(metrics_format(&out, NULL), 0);
    text = text_of(&out);
    CHECK(strstr(text,
                 "\nidemproxy_requests_total{route=\"default\",outcome=\"store_error\"} 3001\n"));
    CHECK(strstr(text, "\nidemproxy_inflight 3\n"));
    metrics_inflight_add(-3);
    buf_done(&out);
    out = BUF_INIT(METRICS_TEXT_MAX);
    CHECK_EQ_INT(metrics_format(&out, NULL), 0);
    CHECK(strstr(text_of(&out), "\nidemproxy_inflight 0\n"));
    buf_done(&out);
}

TEST_MAIN(test_metrics_route_default_is_zero, test_metrics_bucket_bounds_are_inclusive,
          test_metrics_histogram_is_cumulative_with_sum_and_count,
          test_metrics_histogram_labels_come_first, test_metrics_format_counts_every_outcome,
          test_metrics_format_respects_the_buffer_limit, test_metrics_route_id_interns_once,
          test_metrics_route_id_refuses_bad_names, test_metrics_format_labels_route_and_outcome,
          test_metrics_route_id_is_thread_safe, test_metrics_route_id_full_is_e2big,
          test_metrics_last_reload_follows_the_last_result,
          test_metrics_counts_of_every_thread_are_summed)
