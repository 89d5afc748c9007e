/* SPDX-License-Identifier: MIT */
/* W3C trace context, spans, and their OTLP/HTTP JSON encoding (jansson). */
#include "idemproxy/trace.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idemproxy/buf.h"
#include "idemproxy/rng.h"

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1; /* upper case is not allowed */
}

/* <n> bytes from 2n lower-case hex digits at <s>; false on a bad digit. */
static bool unhex(const char *s, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);

        if (hi < 0 || lo < 0)
            return false;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return true;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

int trace_parent_parse(struct span v, struct trace_ctx *ret)
{
    const char *s = v.base;
    uint8_t version;
    struct trace_ctx c;

    if (v.len < TRACEPARENT_LEN || !unhex(s, 1, &version) || version == 0xff ||
        (version == 0 && v.len != TRACEPARENT_LEN) ||
        (v.len > TRACEPARENT_LEN && s[TRACEPARENT_LEN] != '-'))
        return -EINVAL;
    if (s[2] != '-' || s[35] != '-' || s[52] != '-' || !unhex(s + 3, TRACE_ID_LEN, c.trace_id) ||
        !unhex(s + 36, TRACE_SPAN_LEN, c.span_id) || !unhex(s + 53, 1, &c.flags) ||
        all_zero(c.trace_id, TRACE_ID_LEN) || all_zero(c.span_id, TRACE_SPAN_LEN))
        return -EINVAL;
    *ret = c;
    return 0;
}

void trace_hex(const uint8_t *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    out[2 * n] = '\0';
}

void trace_parent_format(const struct trace_ctx *c, char out[TRACEPARENT_LEN + 1])
{
    memcpy(out, "00-", 3);
    trace_hex(c->trace_id, TRACE_ID_LEN, out + 3);
    out[35] = '-';
    trace_hex(c->span_id, TRACE_SPAN_LEN, out + 36);
    out[52] = '-';
    trace_hex(&c->flags, 1, out + 53);
}

/* Random bytes that are not all zeros (OpenSSL failing: a counter's). */
static void new_id(uint8_t *out, size_t n)
{
    static _Atomic uint64_t fallback = 1;

    if (rng_bytes(out, n) < 0 || all_zero(out, n)) {
        uint64_t v = atomic_fetch_add(&fallback, 1);

        memset(out, 0, n);
        memcpy(out + n - sizeof(v), &v, sizeof(v));
    }
}

void trace_new_trace_id(uint8_t out[TRACE_ID_LEN]) { new_id(out, TRACE_ID_LEN); }

void trace_new_span_id(uint8_t out[TRACE_SPAN_LEN]) { new_id(out, TRACE_SPAN_LEN); }

bool trace_sample(double ratio)
{
    uint64_t r;

    if (ratio >= 1.0)
        return true;
    if (ratio <= 0.0 || rng_bytes(&r, sizeof(r)) < 0)
        return false;
    return (double)(r >> 11) < ratio * (double)(UINT64_C(1) << 53);
}

uint64_t trace_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void trace_span_init(struct trace_span *s, const uint8_t trace_id[TRACE_ID_LEN],
                     const uint8_t span_id[TRACE_SPAN_LEN], const uint8_t *parent_id,
                     enum trace_kind kind, struct span name)
{
    size_t n = name.len < TRACE_NAME_MAX - 1 ? name.len : TRACE_NAME_MAX - 1;

    memset(s, 0, offsetof(struct trace_span, text));
    memcpy(s->trace_id, trace_id, TRACE_ID_LEN);
    memcpy(s->span_id, span_id, TRACE_SPAN_LEN);
    if (parent_id)
        memcpy(s->parent_id, parent_id, TRACE_SPAN_LEN);
    s->kind = kind;
    if (n)
        memcpy(s->name, name.base, n);
    s->name[n] = '\0';
}

void trace_span_text(struct trace_span *s, const char *key, struct span v)
{
    size_t room = TRACE_TEXT_MAX - s->text_len, n = v.len < room ? v.len : room;

    if (s->nattrs >= TRACE_ATTRS_MAX)
        return;
    if (n)
        memcpy(s->text + s->text_len, v.base, n);
    s->attrs[s->nattrs++] =
        (struct trace_attr){ .key = key, .off = s->text_len, .len = (uint16_t)n };
    s->text_len = (uint16_t)(s->text_len + n);
}

void trace_span_int(struct trace_span *s, const char *key, int64_t v)
{
    if (s->nattrs < TRACE_ATTRS_MAX)
        s->attrs[s->nattrs++] = (struct trace_attr){ .key = key, .is_int = true, .i = v };
}

void trace_span_link(struct trace_span *s, struct span tp)
{
    struct trace_ctx c;

    if (trace_parent_parse(tp, &c) < 0)
        return;
    s->has_link = true;
    memcpy(s->link_trace_id, c.trace_id, TRACE_ID_LEN);
    memcpy(s->link_span_id, c.span_id, TRACE_SPAN_LEN);
}

/* ---- OTLP/HTTP JSON ---- */

/* Written by hand into one buffer (jansson's objects cost the exporter more
 * than the spans it sends): every string it writes is either hex, digits,
 * or passed through put_text(). */

struct out {
    struct buf b;
    int err;
};

static void put(struct out *o, const char *p, size_t n)
{
    if (!o->err && buf_append(&o->b, p, n) < 0)
        o->err = -ENOMEM;
}

static void put_s(struct out *o, const char *s) { put(o, s, strlen(s)); }

/* <v> as a JSON string's contents: 0x20-0x7E as themselves (with '"' and
 * '\\' escaped), every other byte (a client's, in a path) as %XX, as a URI
 * would have it: the JSON is always valid UTF-8. */
static void put_text(struct out *o, struct span v)
{
    char esc[4];

    for (size_t i = 0, run = 0; i <= v.len; i++) {
        unsigned char c = i < v.len ? (unsigned char)v.base[i] : 0;

        if (i < v.len && c >= 0x20 && c <= 0x7e && c != '"' && c != '\\')
            continue;
        put(o, v.base + run, i - run);
        run = i + 1;
        if (i == v.len)
            break;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(o, esc, 2);
        } else {
            snprintf(esc, sizeof(esc), "%%%02X", c);
            put(o, esc, 3);
        }
    }
}

static void put_hex(struct out *o, const char *key, const uint8_t *p, size_t n)
{
    char h[2 * TRACE_ID_LEN + 1];

    trace_hex(p, n, h);
    put_s(o, "\"");
    put_s(o, key);
    put_s(o, "\":\"");
    put(o, h, 2 * n);
    put_s(o, "\"");
}

static void put_attr(struct out *o, const struct trace_span *s, const struct trace_attr *a)
{
    char d[32];

    put_s(o, "{\"key\":\"");
    put_text(o, span_from_cstr(a->key));
    if (a->is_int) {
        snprintf(d, sizeof(d), "%" PRId64, a->i);
        put_s(o, "\",\"value\":{\"intValue\":\"");
        put_s(o, d);
    } else {
        put_s(o, "\",\"value\":{\"stringValue\":\"");
        put_text(o, (struct span){ s->text + a->off, a->len });
    }
    put_s(o, "\"}}");
}

static void put_span(struct out *o, const struct trace_span *s)
{
    char d[192];

    put_s(o, "{");
    put_hex(o, "traceId", s->trace_id, TRACE_ID_LEN);
    put_s(o, ",");
    put_hex(o, "spanId", s->span_id, TRACE_SPAN_LEN);
    if (!all_zero(s->parent_id, TRACE_SPAN_LEN)) {
        put_s(o, ",");
        put_hex(o, "parentSpanId", s->parent_id, TRACE_SPAN_LEN);
    }
    put_s(o, ",\"name\":\"");
    put_text(o, span_from_cstr(s->name));
    snprintf(d, sizeof(d),
             "\",\"kind\":%d,\"startTimeUnixNano\":\"%" PRIu64 "\",\"endTimeUnixNano\":\"%" PRIu64
             "\",\"attributes\":[",
             (int)s->kind, s->start_ns, s->end_ns);
    put_s(o, d);
    for (unsigned i = 0; i < s->nattrs; i++) {
        if (i)
            put_s(o, ",");
        put_attr(o, s, &s->attrs[i]);
    }
    put_s(o, "]");
    if (s->has_link) {
        put_s(o, ",\"links\":[{");
        put_hex(o, "traceId", s->link_trace_id, TRACE_ID_LEN);
        put_s(o, ",");
        put_hex(o, "spanId", s->link_span_id, TRACE_SPAN_LEN);
        put_s(o, "}]");
    }
    put_s(o, s->error ? ",\"status\":{\"code\":2}}" : ",\"status\":{}}");
}

char *trace_encode(const struct trace_span *spans, size_t n, const char *version, size_t *ret_len)
{
    struct out o = { .b = BUF_INIT(SIZE_MAX) };
    struct span v = span_from_cstr(version);

    put_s(&o, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[{\"key\":\"service.name\","
              "\"value\":{\"stringValue\":\"idemproxy\"}},{\"key\":\"service.version\","
              "\"value\":{\"stringValue\":\"");
    put_text(&o, v);
    put_s(&o, "\"}}]},\"scopeSpans\":[{\"scope\":{\"name\":\"idemproxy\",\"version\":\"");
    put_text(&o, v);
    put_s(&o, "\"},\"spans\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            put_s(&o, ",");
        put_span(&o, &spans[i]);
    }
    put_s(&o, "]}]}]}");
    put(&o, "", 1); /* a C string too */
    if (o.err) {
        buf_done(&o.b);
        return NULL;
    }
    *ret_len = o.b.len - 1;
    return (char *)o.b.data;
}
