/* SPDX-License-Identifier: MIT */
/* Trace context and spans, pure (trace.h; doc/operations.md, Tracing): the
 * traceparent a client sends, parsed strictly; ids; sampling; and the OTLP
 * JSON a span becomes (ids in lower-case hex, 64-bit numbers as strings,
 * kinds as integers, a client's bytes never breaking the JSON). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "idemproxy/trace.h"

#define TP "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

static void test_trace_parent_parse(void)
{
    static const char *const bad[] = {
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",   /* short */
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-", /* 00 is exact */
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  /* upper case */
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  /* zero trace */
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  /* zero span */
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  /* version ff */
        "00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g",
        "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x", /* later: then '-' */
    };
    struct trace_ctx c;
    char out[TRACEPARENT_LEN + 1];

    CHECK_EQ_INT(trace_parent_parse(span_from_cstr(TP), &c), 0);
    CHECK_EQ_INT(c.flags, 1);
    CHECK_EQ_INT(c.trace_id[0], 0x0a);
    CHECK_EQ_INT(c.span_id[7], 0x31);
    trace_parent_format(&c, out);
    CHECK_EQ_STR(out, TP);
    /* a later version: its first fields, what follows a '-' ignored */
    CHECK_EQ_INT(trace_parent_parse(span_from_cstr("01-0af7651916cd43dd8448eb211c80319c-"
                                                   "b7ad6b7169203331-00-future"),
                                    &c),
                 0);
    CHECK_EQ_INT(c.flags, 0);
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
        CHECK_EQ_INT(trace_parent_parse(span_from_cstr(bad[i]), &c), -EINVAL);
}

static void test_trace_ids_and_sampling(void)
{
    uint8_t a[TRACE_ID_LEN], b[TRACE_ID_LEN], zero[TRACE_ID_LEN] = { 0 };
    unsigned in = 0;

    trace_new_trace_id(a);
    trace_new_trace_id(b);
    CHECK(memcmp(a, b, sizeof(a)) != 0 && memcmp(a, zero, sizeof(a)) != 0);
    CHECK(trace_sample(1.0) && !trace_sample(0.0));
    for (int i = 0; i < 4000; i++)
        in += trace_sample(0.25);
    CHECK(in > 800 && in < 1200); /* 1000 expected; 6 standard deviations apart */
    CHECK(trace_now_ns() > UINT64_C(1700000000) * 1000000000u);
}

static json_t *encoded(const struct trace_span *s, size_t n)
{
    size_t len = 0;
    char *text = trace_encode(s, n, "9.9", &len);
    json_t *doc;

    CHECK(text && len == strlen(text));
    doc = json_loadb(text, len, 0, NULL);
    CHECK(doc != NULL);
    free(text);
    return doc;
}

static void test_trace_encode(void)
{
    static const uint8_t tid[TRACE_ID_LEN] = { 0x0a, 0xf7, 1, 2,  3,  4,  5,  6,
                                               7,    8,    9, 10, 11, 12, 13, 14 };
    static const uint8_t sid[TRACE_SPAN_LEN] = { 1, 2, 3, 4, 5, 6, 7, 0xff };
    struct trace_span s;
    json_t *doc, *sp, *a;
    char path[600];

    memset(path, 'a', sizeof(path));
    path[0] = '/';
    path[1] = '\x01'; /* a client's bytes: not JSON's to break */
    path[2] = '\xff';
    path[3] = '"';
    trace_span_init(&s, tid, sid, NULL, TRACE_KIND_SERVER, span_from_cstr("POST payments"));
    s.start_ns = UINT64_C(1764300000123456789);
    s.end_ns = s.start_ns + 1000;
    s.error = true;
    trace_span_text(&s, "url.path", (struct span){ path, sizeof(path) });
    trace_span_int(&s, "http.response.status_code", 502);
    trace_span_link(&s, span_from_cstr(TP));
    doc = encoded(&s, 1);
    CHECK_EQ_STR(
        json_string_value(json_object_get(
            json_object_get(
                json_array_get(
                    json_object_get(
                        json_object_get(json_array_get(json_object_get(doc, "resourceSpans"), 0),
                                        "resource"),
                        "attributes"),
                    0),
                "value"),
            "stringValue")),
        "idemproxy");
    sp = json_array_get(
        json_object_get(
            json_array_get(json_object_get(json_array_get(json_object_get(doc, "resourceSpans"), 0),
                                           "scopeSpans"),
                           0),
            "spans"),
        0);
    CHECK_EQ_STR(json_string_value(json_object_get(sp, "traceId")),
                 "0af70102030405060708090a0b0c0d0e");
    CHECK_EQ_STR(json_string_value(json_object_get(sp, "spanId")), "01020304050607ff");
    CHECK(json_object_get(sp, "parentSpanId") == NULL); /* a root */
    CHECK_EQ_INT(json_integer_value(json_object_get(sp, "kind")), 2);
    CHECK_EQ_STR(json_string_value(json_object_get(sp, "startTimeUnixNano")),
                 "1764300000123456789");
    CHECK_EQ_STR(json_string_value(json_object_get(sp, "endTimeUnixNano")), "1764300000123457789");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(sp, "status"), "code")), 2);
    a = json_object_get(json_array_get(json_object_get(sp, "attributes"), 0), "value");
    /* cut to the span's room, bytes outside 0x20-0x7E as %XX */
    CHECK(strncmp(json_string_value(json_object_get(a, "stringValue")), "/%01%FF\"aaa", 11) == 0);
    CHECK_EQ_INT(strlen(json_string_value(json_object_get(a, "stringValue"))), TRACE_TEXT_MAX + 4);
    a = json_object_get(json_array_get(json_object_get(sp, "attributes"), 1), "value");
    CHECK_EQ_STR(json_string_value(json_object_get(a, "intValue")), "502");
    a = json_array_get(json_object_get(sp, "links"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(a, "traceId")),
                 "0af7651916cd43dd8448eb211c80319c");
    CHECK_EQ_STR(json_string_value(json_object_get(a, "spanId")), "b7ad6b7169203331");
    json_decref(doc);
    /* no room left: attributes past TRACE_ATTRS_MAX are dropped, not written over */
    for (int i = 0; i < TRACE_ATTRS_MAX + 3; i++)
        trace_span_int(&s, "x", i);
    CHECK_EQ_INT(s.nattrs, TRACE_ATTRS_MAX);
    /* a link that does not parse is no link */
    trace_span_init(&s, tid, sid, sid, TRACE_KIND_CLIENT, span_from_cstr("c"));
    trace_span_link(&s, span_from_cstr("00-zz"));
    CHECK(!s.has_link);
    doc = encoded(&s, 1);
    json_decref(doc);
}

TEST_MAIN(test_trace_parent_parse, test_trace_ids_and_sampling, test_trace_encode)
