/* SPDX-License-Identifier: MIT */
/* The two log line formats: levels, one line per event whatever bytes a
 * client sent (escaped in text, valid JSON with bytes that are not UTF-8
 * escaped), and only the fields of an access line. */
#include <unistd.h>

#include <jansson.h>

#include "check.h"
#include "idemproxy/log.h"

/* Runs <fn> with fd 2 on a pipe and returns what it wrote (static buffer). */
static const char *capture_stderr(void (*fn)(void))
{
    static char out[65536];
    int fds[2], saved = dup(2);
    ssize_t n, got = 0;

    out[0] = '\0';
    if (saved < 0 || pipe(fds) != 0)
        return out;
    fflush(stderr);
    dup2(fds[1], 2);
    close(fds[1]);
    fn();
    dup2(saved, 2);
    close(saved);
    while ((n = read(fds[0], out + got, sizeof(out) - 1 - (size_t)got)) > 0)
        got += n;
    close(fds[0]);
    out[got] = '\0';
    return out;
}

static void check_stamp(const char *s)
{
    /* 2026-11-21T10:00:00.123Z */
    CHECK(strlen(s) >= 24);
    CHECK(s[4] == '-' && s[7] == '-' && s[10] == 'T' && s[13] == ':' && s[16] == ':');
    CHECK(s[19] == '.' && s[23] == 'Z');
}

static size_t count_lines(const char *s)
{
    size_t n = 0;

    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void log_some(void)
{
    log_info("hidden");
    log_warn("disk %d%% full\nsecond line", 93);
    log_error("boom");
}

static void log_json_some(void)
{
    log_debug("hidden");
    log_info("quote \" and \xff byte");
}

static void test_log_text_and_json(void)
{
    const char *out, *line2;
    json_t *j;
    json_error_t jerr;

    log_setup(LOG_LEVEL_WARN, LOG_FORMAT_TEXT);
    CHECK(log_enabled(LOG_LEVEL_ERROR));
    CHECK(log_enabled(LOG_LEVEL_WARN));
    CHECK(!log_enabled(LOG_LEVEL_INFO));
    CHECK(!log_enabled(LOG_LEVEL_DEBUG));
    out = capture_stderr(log_some);
    check_stamp(out);
    CHECK(strncmp(out + 24, " warn disk 93% full\\x0asecond line\n", 35) == 0);
    line2 = strchr(out, '\n');
    CHECK(line2 != NULL);
    if (line2) {
        check_stamp(line2 + 1);
        CHECK_EQ_STR(line2 + 25, " error boom\n");
    }
    CHECK(strstr(out, "hidden") == NULL);

    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
    out = capture_stderr(log_json_some);
    CHECK(strstr(out, "hidden") == NULL);
    CHECK(strncmp(out, "{\"time\":\"", 9) == 0);
    CHECK(strchr(out, '\n') == out + strlen(out) - 1);
    j = json_loads(out, 0, &jerr);
    CHECK(j != NULL);
    if (j) {
        check_stamp(json_string_value(json_object_get(j, "time")));
        CHECK_EQ_STR(json_string_value(json_object_get(j, "level")), "info");
        CHECK_EQ_STR(json_string_value(json_object_get(j, "msg")), "quote \" and \\xff byte");
        json_decref(j);
    }
    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
}

/* Every byte value, a forged line, quotes, a NUL, invalid and valid UTF-8. */
static const char hostile[] = "/a\"b\\c\r\n2026-01-01T00:00:00.000Z error forged key=x\0zz\x1b[31m"
                              "\x7f\xc3\xa9\xff\xc0\xaf\xed\xa0\x80 \t";
static char all_bytes[256];

static void log_hostile_access(void)
{
    for (int i = 0; i < 256; i++)
        all_bytes[i] = (char)i;
    log_access(&(struct log_access){
        .method = SPAN_LIT("PO\"ST"),
        .target = { hostile, sizeof(hostile) - 1 },
        .key = { all_bytes, sizeof(all_bytes) },
        .status = 400,
        .outcome = "bad_request",
        .route = "default",
        .total_us = 1500,
        .bytes = 12,
    });
    log_warn("upstream %s failed", hostile); /* a message quoting client bytes */
}

static void test_log_hostile_bytes_text(void)
{
    const char *out;

    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
    out = capture_stderr(log_hostile_access);
    CHECK_EQ_INT(count_lines(out), 2);
    for (const char *p = out; *p; p++) {
        unsigned char c = (unsigned char)*p;

        CHECK((c >= 0x20 && c < 0x7f) || c == '\n'); /* no control or 8-bit byte survives */
        if (c == '"')
            CHECK(p > out && p[-1] == '\\');
    }
    /* a space in a client's field is \x20: "error forged key=" stays inside the target */
    CHECK(strstr(out, " info access PO\\\"ST /a\\\"b\\\\c\\x0d\\x0a2026-01-01T00:00:00.000Z\\x20"
                      "error\\x20forged\\x20key=x\\x00zz\\x1b[31m\\x7f\\xc3\\xa9\\xff") != NULL);
    CHECK(strstr(out, " 400 bad_request route=default key=\\x00\\x01") != NULL);
    CHECK(strstr(out, "\\x1f\\x20!\\\"#") != NULL);
    CHECK(strstr(out, " upstream_ms=- total_ms=1.500 bytes=12\n") != NULL);
    CHECK(strstr(out, " warn upstream /a\\\"b\\\\c\\x0d\\x0a2026") != NULL);
}

static void test_log_hostile_bytes_json(void)
{
    const char *out, *line;
    json_error_t jerr;
    json_t *j;
    size_t n = 0;

    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
    out = capture_stderr(log_hostile_access);
    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
    CHECK_EQ_INT(count_lines(out), 2);
    for (line = out; *line; line = strchr(line, '\n') + 1, n++) {
        j = json_loadb(line, (size_t)(strchr(line, '\n') - line), 0, &jerr);
        CHECK(j != NULL);
        if (!j)
            break;
        if (n == 0) {
            const char *target = json_string_value(json_object_get(j, "target"));
            json_t *key = json_object_get(j, "key");

            CHECK_EQ_STR(json_string_value(json_object_get(j, "method")), "PO\"ST");
            /* JSON carries the bytes that are UTF-8; the rest, and NUL, is \xHH */
            CHECK(json_string_length(json_object_get(j, "target")) > 60);
            CHECK(target && strncmp(target,
                                    "/a\"b\\c\r\n2026-01-01T00:00:00.000Z error forged "
                                    "key=x",
                                    48) == 0);
            CHECK(target && strstr(target, "key=x\\x00zz\x1b[31m\x7f\xc3\xa9\\xff\\xc0\\xaf\\xed"
                                           "\\xa0\\x80 \t"));
            CHECK(json_is_string(key) && json_string_length(key) > 256);
            CHECK(json_integer_value(json_object_get(j, "status")) == 400);
            CHECK_EQ_STR(json_string_value(json_object_get(j, "outcome")), "bad_request");
            CHECK_EQ_STR(json_string_value(json_object_get(j, "route")), "default");
        } else {
            CHECK_EQ_STR(json_string_value(json_object_get(j, "level")), "warn");
        }
        json_decref(j);
    }
    CHECK_EQ_INT(n, 2);
}

static void log_routed_access(void)
{
    log_access(&(struct log_access){
        .method = SPAN_LIT("POST"),
        .target = SPAN_LIT("/v1/payments"),
        .key = SPAN_LIT("k-42"),
        .status = 201,
        .outcome = "executed",
        .route = "payments",
        .has_upstream = true,
        .upstream_us = 12804,
        .total_us = 13901,
        .bytes = 357,
    });
    log_access(&(struct log_access){
        .method = SPAN_LIT("GET"),
        .target = SPAN_LIT("/x"),
        .status = 200,
        .outcome = "passthrough",
        .route = NULL, /* left out */
        .total_us = 1,
    });
}

static void test_log_access_route_text(void)
{
    /* the route right after the outcome, before key= */
    static const char first[] = " info access POST /v1/payments 201 executed route=payments "
                                "key=k-42 upstream_ms=12.804 total_ms=13.901 bytes=357\n";
    const char *out, *line2;

    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
    out = capture_stderr(log_routed_access);
    CHECK_EQ_INT(count_lines(out), 2);
    check_stamp(out);
    CHECK(strncmp(out + 24, first, sizeof(first) - 1) == 0);
    line2 = strchr(out, '\n');
    CHECK(line2 != NULL);
    if (line2) {
        check_stamp(line2 + 1);
        CHECK_EQ_STR(line2 + 25,
                     " info access GET /x 200 passthrough upstream_ms=- total_ms=0.001 bytes=0\n");
    }
    CHECK(strstr(out, "route=(null)") == NULL);
}

static void test_log_access_route_json(void)
{
    const char *out, *nl;
    json_error_t jerr;
    json_t *j;

    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
    out = capture_stderr(log_routed_access);
    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
    CHECK_EQ_INT(count_lines(out), 2);
    nl = strchr(out, '\n');
    j = json_loadb(out, nl ? (size_t)(nl - out) : 0, 0, &jerr);
    CHECK(j != NULL);
    if (j) {
        CHECK_EQ_STR(json_string_value(json_object_get(j, "route")), "payments");
        CHECK_EQ_STR(json_string_value(json_object_get(j, "outcome")), "executed");
        CHECK_EQ_STR(json_string_value(json_object_get(j, "key")), "k-42");
        json_decref(j);
    }
    CHECK(strstr(out, "\"outcome\":\"executed\",\"route\":\"payments\",\"key\"") != NULL);
    j = nl ? json_loads(nl + 1, 0, &jerr) : NULL;
    CHECK(j != NULL);
    if (j) {
        CHECK_EQ_STR(json_string_value(json_object_get(j, "outcome")), "passthrough");
        CHECK(json_object_get(j, "route") == NULL); /* NULL: no member */
        json_decref(j);
    }
}

static void log_refused_access(void)
{
    log_access(&(struct log_access){
        .method = SPAN_LIT("POST"),
        .target = SPAN_LIT("/x"),
        .status = 400,
        .outcome = "bad_request",
        .route = "default",
        .total_us = 20,
        .reason = "a \"quoted\" value\nwith a line end",
        .request_id = "req-1\x01",
        .client = "192.0.2.7",
    });
}

/* The access line ends with the request id and the client's address, and a
 * refusal's reason, quoted: one line whatever the client sent. */
static void test_log_access_request_id_client_reason(void)
{
    static const char text[] = " info access POST /x 400 bad_request route=default "
                               "upstream_ms=- total_ms=0.020 bytes=0 request_id=req-1\\x01 "
                               "client=192.0.2.7 reason=\"a \\\"quoted\\\" value\\x0awith a "
                               "line end\"\n";
    const char *out;
    json_error_t jerr;
    json_t *j;

    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
    out = capture_stderr(log_refused_access);
    CHECK_EQ_INT(count_lines(out), 1);
    CHECK_EQ_STR(out + 24, text);
    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_JSON);
    out = capture_stderr(log_refused_access);
    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
    CHECK_EQ_INT(count_lines(out), 1);
    j = json_loads(out, 0, &jerr);
    CHECK(j != NULL);
    if (j) {
        CHECK_EQ_STR(json_string_value(json_object_get(j, "client")), "192.0.2.7");
        CHECK_EQ_STR(json_string_value(json_object_get(j, "reason")),
                     "a \"quoted\" value\nwith a line end");
        CHECK(json_object_get(j, "request_id") != NULL);
        json_decref(j);
    }
}

static struct log_burst test_burst = LOG_BURST_INIT("test failures");
static int burst_written;

/* A burst: the first line of a kind, a count of the rest every 10 s, and a
 * new kind or a quiet spell written in full again. */
static void burst_steps(void)
{
    uint64_t t = 1000000;

    burst_written = 0;
    burst_written += log_burst_admit_at(&test_burst, "refused", t); /* written */
    for (int i = 0; i < 211; i++)
        burst_written += log_burst_admit_at(&test_burst, "refused", t + 10 + (uint64_t)i);
    log_burst_tick_at(t + 5000);                                            /* not yet */
    log_burst_tick_at(t + 10000);                                           /* "211 more" */
    burst_written += log_burst_admit_at(&test_burst, "refused", t + 11000); /* counted */
    burst_written += log_burst_admit_at(&test_burst, "reset", t + 11001);   /* another kind */
    log_burst_tick_at(t + 21001);                                           /* nothing counted */
    log_burst_tick_at(t + 31002);                                           /* quiet: ends */
    burst_written += log_burst_admit_at(&test_burst, "reset", t + 31003);   /* written again */
}

static void test_log_burst(void)
{
    const char *out;

    log_setup(LOG_LEVEL_INFO, LOG_FORMAT_TEXT);
    out = capture_stderr(burst_steps);
    CHECK_EQ_INT(burst_written, 3);
    CHECK(strstr(out, "warn test failures (refused): 211 more in the last 10 s\n") != NULL);
    /* the one counted before "reset" came is said when it comes */
    CHECK(strstr(out, "warn test failures (refused): 1 more in the last 1 s\n") != NULL);
    CHECK_EQ_INT(count_lines(out), 2);
}

TEST_MAIN(test_log_text_and_json, test_log_hostile_bytes_text, test_log_hostile_bytes_json,
          test_log_access_route_text, test_log_access_route_json,
          test_log_access_request_id_client_reason, test_log_burst)
