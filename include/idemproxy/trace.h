/* SPDX-License-Identifier: MIT */
/* Traces (doc/operations.md, Tracing): the W3C trace context a request
 * brings or starts, the spans the proxy makes of it, and their OTLP/HTTP
 * JSON encoding. Pure: no thread, no I/O (tracer.h exports). Any thread. */
#ifndef IDEMPROXY_TRACE_H
#define IDEMPROXY_TRACE_H

#include "idemproxy/common.h"

#define TRACE_ID_LEN 16
#define TRACE_SPAN_LEN 8
#define TRACEPARENT_LEN 55 /* "00-" 32 hex "-" 16 hex "-" 2 hex */

/* A W3C trace context: the trace, the span it names as parent, its flags. */
struct trace_ctx {
    uint8_t trace_id[TRACE_ID_LEN];
    uint8_t span_id[TRACE_SPAN_LEN];
    uint8_t flags; /* bit 0: sampled */
};

/* Parses a traceparent field's value <v> (W3C Trace Context, level 1):
 * version 00 exactly 55 bytes; a later version (not ff) its first 55 bytes
 * followed by nothing or "-"; lower-case hex; neither id all zeros.
 * Returns 0 with it in <ret>, or -EINVAL. */
int trace_parent_parse(struct span v, struct trace_ctx *ret);

/* Writes <c> as a version-00 traceparent, NUL-terminated. */
void trace_parent_format(const struct trace_ctx *c, char out[TRACEPARENT_LEN + 1]);

/* Lower-case hex of <n> bytes of <p> into <out> (2n + 1 bytes). */
void trace_hex(const uint8_t *p, size_t n, char *out);

/* New random ids: never all zeros. */
void trace_new_trace_id(uint8_t out[TRACE_ID_LEN]);
void trace_new_span_id(uint8_t out[TRACE_SPAN_LEN]);

/* Whether a request without a parent is sampled at <ratio> (0 to 1). */
bool trace_sample(double ratio);

/* The time now, in nanoseconds since the epoch (OTLP's clock). */
uint64_t trace_now_ns(void);

/* OTLP's SpanKind. */
enum trace_kind {
    TRACE_KIND_INTERNAL = 1,
    TRACE_KIND_SERVER = 2,
    TRACE_KIND_CLIENT = 3,
};

#define TRACE_ATTRS_MAX 8
#define TRACE_TEXT_MAX 512 /* the bytes of a span's text attributes together */
#define TRACE_NAME_MAX 64

struct trace_attr {
    const char *key; /* static */
    bool is_int;
    int64_t i;
    uint16_t off, len; /* a text value: in the span's <text> */
};

/* One finished span, by value: what the exporter's queue holds. */
struct trace_span {
    uint8_t trace_id[TRACE_ID_LEN];
    uint8_t span_id[TRACE_SPAN_LEN];
    uint8_t parent_id[TRACE_SPAN_LEN]; /* all zeros: a root span */
    enum trace_kind kind;
    bool error; /* its status is ERROR */
    bool has_link;
    uint8_t link_trace_id[TRACE_ID_LEN], link_span_id[TRACE_SPAN_LEN];
    uint64_t start_ns, end_ns;
    char name[TRACE_NAME_MAX];
    unsigned nattrs;
    struct trace_attr attrs[TRACE_ATTRS_MAX];
    uint16_t text_len;
    char text[TRACE_TEXT_MAX];
};

/* Starts <s>: zeroed, then its ids, kind and name (cut to fit). */
void trace_span_init(struct trace_span *s, const uint8_t trace_id[TRACE_ID_LEN],
                     const uint8_t span_id[TRACE_SPAN_LEN], const uint8_t *parent_id,
                     enum trace_kind kind, struct span name);

/* Adds an attribute: a text one cut to what room is left (none past
 * TRACE_ATTRS_MAX or the text's room: dropped), or an integer. */
void trace_span_text(struct trace_span *s, const char *key, struct span v);
void trace_span_int(struct trace_span *s, const char *key, int64_t v);

/* Links <s> to the span a traceparent <tp> names (STORE_TRACE_LEN bytes as a
 * store keeps it; anything that does not parse: no link). */
void trace_span_link(struct trace_span *s, struct span tp);

/* Encodes <n> spans as one OTLP/HTTP JSON ExportTraceServiceRequest: one
 * resource (service.name "idemproxy", service.version <version>), one
 * scope; ids lower-case hex, times and integers decimal strings, kinds and
 * status codes integers. Returns a malloc'd text (its length in <ret_len>)
 * or NULL on OOM. */
char *trace_encode(const struct trace_span *spans, size_t n, const char *version, size_t *ret_len);

#endif
