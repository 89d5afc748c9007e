/* SPDX-License-Identifier: MIT */
#include <jansson.h>

#include "check.h"
#include "idemproxy/outcome.h"
#include "idemproxy/problem.h"
#include "idemproxy/record.h"

#define DRAFT "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header"

/* Builds problem <p> and checks every part of it against the expected values. */
static void check_problem(enum problem p, const char *detail, unsigned status, const char *code,
                          const char *type, const char *want_detail, bool retry_after)
{
    struct record *rec = problem_new(p, PROBLEM_DIALECT_PROBLEM, detail);
    json_error_t err;
    json_t *j;

    CHECK(rec != NULL);
    if (!rec)
        return;
    CHECK_EQ_INT(rec->status, status);
    CHECK_EQ_INT(atomic_load(&rec->refs), 1);
    CHECK_EQ_INT(rec->too_large, 0);
    CHECK_EQ_STR(record_header_get(rec, "Content-Type"), "application/problem+json");
    CHECK_EQ_INT(rec->nheaders, retry_after ? 2 : 1);
    if (retry_after)
        CHECK_EQ_STR(record_header_get(rec, "Retry-After"), "1");
    else
        CHECK(record_header_get(rec, "Retry-After") == NULL);

    j = json_loadb(rec->body.data, rec->body.len, JSON_REJECT_DUPLICATES, &err);
    CHECK(j != NULL);
    if (!j) {
        fprintf(stderr, "  body does not parse: %s\n", err.text);
        record_unref(rec);
        return;
    }
    CHECK(json_is_object(j));
    CHECK_EQ_INT(json_object_size(j), 5);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "type")), type);
    CHECK(json_is_string(json_object_get(j, "title")));
    CHECK(strlen(json_string_value(json_object_get(j, "title")) ?: "") > 0);
    CHECK(json_is_integer(json_object_get(j, "status")));
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "status")), status);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "code")), code);
    if (want_detail)
        CHECK_EQ_STR(json_string_value(json_object_get(j, "detail")), want_detail);
    else /* NULL detail: the title stands in */
        CHECK_EQ_STR(json_string_value(json_object_get(j, "detail")),
                     json_string_value(json_object_get(j, "title")));
    CHECK(memchr(rec->body.data, '\n', rec->body.len) == NULL); /* compact */
    json_decref(j);
    record_unref(rec);
}

static void test_problem_in_use_409(void)
{
    check_problem(PROBLEM_KEY_IN_USE, "try again", 409, "idempotency_key_in_use",
                  DRAFT "#section-2.6", "try again", true);
    check_problem(PROBLEM_KEY_IN_USE, NULL, 409, "idempotency_key_in_use", DRAFT "#section-2.6",
                  NULL, true);
}

static void test_problem_mismatch_422(void)
{
    check_problem(PROBLEM_KEY_MISMATCH, "different body", 422, "idempotency_key_mismatch",
                  DRAFT "#section-2.2", "different body", false);
    check_problem(PROBLEM_KEY_MISMATCH, NULL, 422, "idempotency_key_mismatch", DRAFT "#section-2.2",
                  NULL, false);
}

static void test_problem_key_errors_400(void)
{
    check_problem(PROBLEM_KEY_MISSING, NULL, 400, "idempotency_key_missing", DRAFT "#section-2.1",
                  NULL, false);
    check_problem(PROBLEM_KEY_INVALID, "key longer than 255 bytes", 400, "idempotency_key_invalid",
                  DRAFT "#section-2.1", "key longer than 255 bytes", false);
}

static void test_problem_payload_too_large_413(void)
{
    check_problem(PROBLEM_PAYLOAD_TOO_LARGE, "body over 1048576 bytes", 413, "payload_too_large",
                  "about:blank", "body over 1048576 bytes", false);
    check_problem(PROBLEM_PAYLOAD_TOO_LARGE, NULL, 413, "payload_too_large", "about:blank", NULL,
                  false);
}

static void test_problem_store_unavailable_503(void)
{
    check_problem(PROBLEM_STORE_UNAVAILABLE, NULL, 503, "store_unavailable", "about:blank", NULL,
                  true);
    check_problem(PROBLEM_STORE_UNAVAILABLE, "redis down", 503, "store_unavailable", "about:blank",
                  "redis down", true);
}

static void test_problem_upstream_and_marker(void)
{
    check_problem(PROBLEM_UPSTREAM_UNAVAILABLE, NULL, 502, "upstream_unavailable", "about:blank",
                  NULL, false);
    check_problem(PROBLEM_UPSTREAM_TIMEOUT, NULL, 504, "upstream_timeout", "about:blank", NULL,
                  false);
    check_problem(PROBLEM_RESPONSE_TOO_LARGE, NULL, 502, "response_too_large", "about:blank", NULL,
                  false);
}

static void test_problem_detail_is_escaped(void)
{
    /* Quotes, backslashes, control bytes and UTF-8 survive as JSON. */
    check_problem(PROBLEM_KEY_INVALID, "bad \"key\" \\ \n\t caf\xc3\xa9", 400,
                  "idempotency_key_invalid", DRAFT "#section-2.1",
                  "bad \"key\" \\ \n\t caf\xc3\xa9", false);
    /* Not UTF-8: still a valid problem, with the title as detail. */
    check_problem(PROBLEM_KEY_INVALID, "bad \xff", 400, "idempotency_key_invalid",
                  DRAFT "#section-2.1", NULL, false);
}

static void test_problem_out_of_range(void)
{
    CHECK(problem_new(_PROBLEM_MAX, PROBLEM_DIALECT_PROBLEM, NULL) == NULL);
    CHECK(problem_new((enum problem) - 1, PROBLEM_DIALECT_PROBLEM, NULL) == NULL);
    CHECK(problem_new(PROBLEM_KEY_MISSING, (enum problem_dialect)7, NULL) == NULL);
}

/* The stripe dialect: same status and headers but Content-Type, body
 * {"error": {"type", "code", "message"}} and nothing else. */
static void check_stripe(enum problem p, const char *detail, const char *want_type,
                         const char *want_message)
{
    struct record *rec = problem_new(p, PROBLEM_DIALECT_STRIPE, detail);
    struct record *plain = problem_new(p, PROBLEM_DIALECT_PROBLEM, detail);
    json_t *j = NULL, *e;

    CHECK(rec != NULL && plain != NULL);
    if (!rec || !plain)
        goto out;
    CHECK_EQ_INT(rec->status, plain->status);
    CHECK_EQ_INT(rec->nheaders, plain->nheaders);
    CHECK_EQ_STR(record_header_get(rec, "Content-Type"), "application/json");
    if (record_header_get(plain, "Retry-After"))
        CHECK_EQ_STR(record_header_get(rec, "Retry-After"), "1");
    if (record_header_get(plain, "Connection"))
        CHECK_EQ_STR(record_header_get(rec, "Connection"), "close");
    j = json_loadb(rec->body.data, rec->body.len, JSON_REJECT_DUPLICATES, NULL);
    CHECK(json_is_object(j) && json_object_size(j) == 1);
    e = json_object_get(j, "error");
    CHECK(json_is_object(e) && json_object_size(e) == 3);
    CHECK_EQ_STR(json_string_value(json_object_get(e, "type")), want_type);
    CHECK_EQ_STR(json_string_value(json_object_get(e, "code")), problem_code(p));
    CHECK_EQ_STR(json_string_value(json_object_get(e, "message")), want_message);
out:
    json_decref(j);
    record_unref(rec);
    record_unref(plain);
}

static void test_problem_stripe_dialect(void)
{
    check_stripe(PROBLEM_KEY_IN_USE, "still running", "idempotency_error", "still running");
    check_stripe(PROBLEM_KEY_MISMATCH, "other payload", "idempotency_error", "other payload");
    check_stripe(PROBLEM_KEY_MISSING, NULL, "idempotency_error",
                 "Idempotency-Key header is required");
    check_stripe(PROBLEM_KEY_INVALID, "bad", "idempotency_error", "bad");
    check_stripe(PROBLEM_STORE_UNAVAILABLE, "down", "api_error", "down");
    check_stripe(PROBLEM_UPSTREAM_UNAVAILABLE, NULL, "api_error", "Upstream unavailable");
    check_stripe(PROBLEM_UPSTREAM_TIMEOUT, NULL, "api_error", "Upstream timed out");
    check_stripe(PROBLEM_PAYLOAD_TOO_LARGE, NULL, "api_error", "Request body too large");
    check_stripe(PROBLEM_RESPONSE_TOO_LARGE, NULL, "api_error",
                 "Original response was too large to keep");
    check_stripe(PROBLEM_BAD_REQUEST, "framing", "api_error", "framing");
    /* not UTF-8: the title instead, as in the problem dialect */
    check_stripe(PROBLEM_KEY_INVALID, "bad \xff", "idempotency_error",
                 "Idempotency-Key header is invalid");
}

static void test_problem_tables(void)
{
    CHECK_EQ_STR(outcome_label(OUTCOME_PASSTHROUGH), "passthrough");
    CHECK_EQ_STR(outcome_label(OUTCOME_EXECUTED), "executed");
    CHECK_EQ_STR(outcome_label(OUTCOME_REPLAYED), "replayed");
    CHECK_EQ_STR(outcome_label(OUTCOME_IN_FLIGHT), "in_flight");
    CHECK_EQ_STR(outcome_label(OUTCOME_MISMATCH), "mismatch");
    CHECK_EQ_STR(outcome_label(OUTCOME_MISSING_KEY), "missing_key");
    CHECK_EQ_STR(outcome_label(OUTCOME_INVALID_KEY), "invalid_key");
    CHECK_EQ_STR(outcome_label(OUTCOME_TOO_LARGE), "too_large");
    CHECK_EQ_STR(outcome_label(OUTCOME_STORE_ERROR), "store_error");
    CHECK_EQ_STR(outcome_label(OUTCOME_UPSTREAM_ERROR), "upstream_error");
    CHECK_EQ_STR(outcome_label(_OUTCOME_MAX), "unknown");
    CHECK_EQ_INT(problem_status(PROBLEM_KEY_IN_USE), 409);
    CHECK_EQ_INT(problem_status(PROBLEM_KEY_MISMATCH), 422);
    CHECK_EQ_INT(problem_status(PROBLEM_KEY_MISSING), 400);
    CHECK_EQ_INT(problem_status(PROBLEM_KEY_INVALID), 400);
    CHECK_EQ_INT(problem_status(PROBLEM_PAYLOAD_TOO_LARGE), 413);
    CHECK_EQ_INT(problem_status(PROBLEM_STORE_UNAVAILABLE), 503);
    CHECK_EQ_INT(problem_status(PROBLEM_UPSTREAM_UNAVAILABLE), 502);
    CHECK_EQ_INT(problem_status(PROBLEM_UPSTREAM_TIMEOUT), 504);
    CHECK_EQ_INT(problem_status(PROBLEM_RESPONSE_TOO_LARGE), 502);
    CHECK_EQ_STR(problem_code(PROBLEM_KEY_MISMATCH), "idempotency_key_mismatch");
    CHECK_EQ_STR(problem_code(PROBLEM_RESPONSE_TOO_LARGE), "response_too_large");
    CHECK(problem_code(_PROBLEM_MAX) != NULL);
}

/* An unknown outcome (doc/guarantees.md, Unknown outcomes): a retry cannot
 * help, and SDKs are told so in the header they read; no Retry-After, which
 * would invite one. */
static void test_problem_outcome_unknown_says_do_not_retry(void)
{
    struct record *plain = problem_new(PROBLEM_OUTCOME_UNKNOWN, PROBLEM_DIALECT_PROBLEM, NULL);
    struct record *stripe = problem_new(PROBLEM_OUTCOME_UNKNOWN, PROBLEM_DIALECT_STRIPE, "lost");
    json_t *j = NULL;

    CHECK(plain != NULL && stripe != NULL);
    if (!plain || !stripe)
        goto out;
    CHECK_EQ_INT(plain->status, 502);
    CHECK_EQ_STR(problem_code(PROBLEM_OUTCOME_UNKNOWN), "idempotency_outcome_unknown");
    CHECK_EQ_STR(record_header_get(plain, "X-Should-Retry"), "false");
    CHECK(record_header_get(plain, "Stripe-Should-Retry") == NULL);
    CHECK(record_header_get(plain, "Retry-After") == NULL);
    CHECK_EQ_INT(plain->nheaders, 2);
    CHECK_EQ_INT(stripe->status, 502);
    CHECK_EQ_STR(record_header_get(stripe, "X-Should-Retry"), "false");
    CHECK_EQ_STR(record_header_get(stripe, "Stripe-Should-Retry"), "false");
    CHECK(record_header_get(stripe, "Retry-After") == NULL);
    CHECK_EQ_INT(stripe->nheaders, 3);
    j = json_loadb(stripe->body.data, stripe->body.len, JSON_REJECT_DUPLICATES, NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "error"), "type")),
                 "api_error");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                 "idempotency_outcome_unknown");
out:
    json_decref(j);
    record_unref(plain);
    record_unref(stripe);
}

TEST_MAIN(test_problem_in_use_409, test_problem_mismatch_422, test_problem_key_errors_400,
          test_problem_payload_too_large_413, test_problem_store_unavailable_503,
          test_problem_upstream_and_marker, test_problem_detail_is_escaped,
          test_problem_out_of_range, test_problem_stripe_dialect, test_problem_tables,
          test_problem_outcome_unknown_says_do_not_retry)
