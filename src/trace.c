/* SPDX-License-Identifier: MIT */
/* W3C trace context, spans, and their OTLP/HTTP JSON encoding (jansson). */
#include "idemproxy/trace.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static json_t *hex_json(const uint8_t *p, size_t n)
{
    char h[2 * TRACE_ID_LEN + 1];

    trace_hex(p, n, h);
    return json_string(h);
}

static json_t *u64_json(uint64_t v)
{
    char d[24];

    snprintf(d, sizeof(d), "%" PRIu64, v);
    return json_string(d);
}

/* {"key": K, "value": {"stringValue": V}} or {"intValue": "N"}. A text's
 * bytes outside 0x20-0x7E (a client's, in a path) are written %XX, as a URI
 * would have them: the JSON is always valid UTF-8. */
static json_t *attr_json(const char *key, bool is_int, int64_t i, struct span text)
{
    char d[24], clean[3 * TRACE_TEXT_MAX + 1];
    size_t n = 0;
    json_t *v;

    if (is_int) {
        snprintf(d, sizeof(d), "%" PRId64, i);
        v = json_pack("{s:s}", "intValue", d);
    } else {
        for (size_t k = 0; k < text.len; k++) {
            unsigned char c = (unsigned char)text.base[k];

            if (c >= 0x20 && c <= 0x7e)
                clean[n++] = (char)c;
            else
                n += (size_t)snprintf(clean + n, 4, "%%%02X", c);
        }
        v = json_pack("{s:s%}", "stringValue", clean, n);
    }
    return v ? json_pack("{s:s, s:o}", "key", key, "value", v) : NULL;
}

static json_t *span_json(const struct trace_span *s)
{
    json_t *o = json_object(), *attrs = json_array(), *links = json_array();
    int err = !o || !attrs || !links;

    for (unsigned i = 0; !err && i < s->nattrs; i++) {
        const struct trace_attr *a = &s->attrs[i];

        err |= json_array_append_new(
            attrs, attr_json(a->key, a->is_int, a->i, (struct span){ s->text + a->off, a->len }));
    }
    if (!err && s->has_link)
        err |= json_array_append_new(
            links, json_pack("{s:o, s:o}", "traceId", hex_json(s->link_trace_id, TRACE_ID_LEN),
                             "spanId", hex_json(s->link_span_id, TRACE_SPAN_LEN)));
    if (!err) {
        err |= json_object_set_new(o, "traceId", hex_json(s->trace_id, TRACE_ID_LEN));
        err |= json_object_set_new(o, "spanId", hex_json(s->span_id, TRACE_SPAN_LEN));
        if (!all_zero(s->parent_id, TRACE_SPAN_LEN))
            err |= json_object_set_new(o, "parentSpanId", hex_json(s->parent_id, TRACE_SPAN_LEN));
        err |= json_object_set_new(o, "name", json_string(s->name));
        err |= json_object_set_new(o, "kind", json_integer(s->kind));
        err |= json_object_set_new(o, "startTimeUnixNano", u64_json(s->start_ns));
        err |= json_object_set_new(o, "endTimeUnixNano", u64_json(s->end_ns));
        err |= json_object_set(o, "attributes", attrs);
        if (s->has_link)
            err |= json_object_set(o, "links", links);
        err |= json_object_set_new(o, "status",
                                   s->error ? json_pack("{s:i}", "code", 2) : json_object());
    }
    json_decref(attrs);
    json_decref(links);
    if (err) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *trace_encode(const struct trace_span *spans, size_t n, const char *version, size_t *ret_len)
{
    json_t *list = json_array(), *root;
    char *text;
    int err = !list;

    for (size_t i = 0; !err && i < n; i++)
        err |= json_array_append_new(list, span_json(&spans[i]));
    root =
        err ? NULL
            : json_pack("{s:[{s:{s:[{s:s, s:{s:s}}, {s:s, s:{s:s}}]}, s:[{s:{s:s, s:s}, s:O}]}]}",
                        "resourceSpans", "resource", "attributes", "key", "service.name", "value",
                        "stringValue", "idemproxy", "key", "service.version", "value",
                        "stringValue", version, "scopeSpans", "scope", "name", "idemproxy",
                        "version", version, "spans", list);
    json_decref(list);
    if (!root)
        return NULL;
    text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (text)
        *ret_len = strlen(text);
    return text;
}
