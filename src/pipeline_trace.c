/* SPDX-License-Identifier: MIT */
/* The pipeline's spans (doc/operations.md, Tracing): one SERVER span per
 * request, a CLIENT span per store call and for the upstream exchange, and
 * the link from an answer that did not run the request (a replay, a 409, a
 * 422, an unknown outcome) to the one that did. The request's own step
 * calls each; none waits: a span goes to the exporter's queue by value. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/digest.h"
#include "idemproxy/route.h"
#include "idemproxy/tracer.h"

#include "pipeline_impl.h"

/* The client's traceparent: its one field's value, when that parses. */
static bool client_parent(const struct request *rq, struct trace_ctx *ret)
{
    static const struct span h_traceparent = SPAN_LIT("traceparent");
    const struct http_header *found = NULL;

    for (size_t i = 0; i < rq->nheaders; i++) {
        if (!span_eq_nocase(rq->headers[i].name, h_traceparent))
            continue;
        if (found)
            return false; /* two: neither is trusted (W3C Trace Context, 3.2) */
        found = &rq->headers[i];
    }
    return found && trace_parent_parse(found->value, ret) == 0;
}

void pipeline_trace_begin(struct pipeline_req *r)
{
    struct pipeline_trace *t;
    struct trace_ctx parent;

    if (!r->pl->tracer || !(t = r->trace = calloc(1, sizeof(*t))))
        return; /* out of memory: this request goes untraced */
    t->start_ns = trace_now_ns();
    if (client_parent(r->rq, &parent)) {
        memcpy(t->ctx.trace_id, parent.trace_id, TRACE_ID_LEN);
        memcpy(t->parent, parent.span_id, TRACE_SPAN_LEN);
        t->ctx.flags = parent.flags & 1; /* parent-based */
    } else {
        trace_new_trace_id(t->ctx.trace_id);
        t->ctx.flags = trace_sample(r->pl->trace_sample) ? 1 : 0;
    }
    trace_new_span_id(t->ctx.span_id);
    trace_parent_format(&t->ctx, t->own);
}

struct span pipeline_trace_acquire(struct pipeline_req *r)
{
    if (!r->trace)
        return (struct span){ 0 };
    r->trace->store_ns = trace_now_ns();
    return (struct span){ r->trace->own, TRACEPARENT_LEN };
}

static bool sampled(const struct pipeline_req *r) { return r->trace && (r->trace->ctx.flags & 1); }

/* A store call's CLIENT span, child of the request's, from <start_ns> to now. */
static void store_span(struct pipeline_req *r, const char *name, uint64_t start_ns, bool failed)
{
    struct trace_span s;
    uint8_t id[TRACE_SPAN_LEN];

    trace_new_span_id(id);
    trace_span_init(&s, r->trace->ctx.trace_id, id, r->trace->ctx.span_id, TRACE_KIND_CLIENT,
                    span_from_cstr(name));
    s.start_ns = start_ns;
    s.end_ns = trace_now_ns();
    s.error = failed;
    tracer_submit(r->pl->tracer, &s);
}

void pipeline_trace_acquired(struct pipeline_req *r, const struct store_result *res)
{
    struct pipeline_trace *t = r->trace;

    if (!t)
        return;
    if (res && res->trace.len == STORE_TRACE_LEN) {
        memcpy(t->link, res->trace.base, STORE_TRACE_LEN);
        t->link[STORE_TRACE_LEN] = '\0';
    }
    if (sampled(r))
        store_span(r, "store acquire", t->store_ns, !res);
}

const char *pipeline_trace_forward(struct pipeline_req *r)
{
    struct pipeline_trace *t = r->trace;
    struct trace_ctx up;

    if (!t)
        return NULL;
    up = t->ctx;
    trace_new_span_id(t->client);
    memcpy(up.span_id, t->client, TRACE_SPAN_LEN);
    trace_parent_format(&up, t->forward);
    t->upstream_ns = trace_now_ns();
    t->upstream_open = true;
    return t->forward;
}

void pipeline_trace_head(struct pipeline_req *r, unsigned status)
{
    if (r->trace)
        r->trace->upstream_status = status;
}

void pipeline_trace_upstream_end(struct pipeline_req *r, unsigned status, bool failed)
{
    struct pipeline_trace *t = r->trace;
    struct trace_span s;
    char name[TRACE_NAME_MAX];

    if (!t || !t->upstream_open)
        return;
    status = status ? status : t->upstream_status;
    t->upstream_open = false;
    if (!sampled(r))
        return;
    snprintf(name, sizeof(name), "upstream %.*s",
             (int)(r->rq->method.len < 32 ? r->rq->method.len : 32), r->rq->method.base);
    trace_span_init(&s, t->ctx.trace_id, t->client, t->ctx.span_id, TRACE_KIND_CLIENT,
                    span_from_cstr(name));
    s.start_ns = t->upstream_ns;
    s.end_ns = trace_now_ns();
    s.error = failed || status >= 500;
    trace_span_text(&s, "http.request.method", r->rq->method);
    if (status)
        trace_span_int(&s, "http.response.status_code", status);
    tracer_submit(r->pl->tracer, &s);
}

void pipeline_trace_finish_begin(struct pipeline_req *r, const char *op)
{
    if (!r->trace)
        return;
    r->trace->finish_ns = trace_now_ns();
    r->trace->finish_op = op;
}

void pipeline_trace_finish_end(struct pipeline_req *r)
{
    char name[32];

    if (!sampled(r) || !r->trace->finish_op)
        return;
    snprintf(name, sizeof(name), "store %s", r->trace->finish_op);
    store_span(r, name, r->trace->finish_ns, false);
    r->trace->finish_op = NULL;
}

/* idempotency.key_hash: the first 16 bytes of the SHA-256 of the store key,
 * in hex: the key itself, a client's, is never exported. */
static void key_hash(const char *store_key, char out[33])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned n = 0;

    out[0] = '\0';
    if (EVP_Digest(store_key, strlen(store_key), md, &n, digest_sha256(), NULL) == 1 && n >= 16)
        trace_hex(md, 16, out);
}

/* The outcomes of a request that did not run, and the one that did ran it. */
static bool links_back(enum outcome o)
{
    return o == OUTCOME_REPLAYED || o == OUTCOME_IN_FLIGHT || o == OUTCOME_MISMATCH ||
           o == OUTCOME_UNKNOWN;
}

void pipeline_trace_end(struct pipeline_req *r, unsigned status)
{
    struct pipeline_trace *t = r->trace;
    const struct request *in = r->rq;
    const char *route = r->adm.route ? r->adm.route->name : "default";
    struct trace_span s;
    char name[TRACE_NAME_MAX], hash[33];
    const char *q;

    if (!sampled(r))
        return;
    snprintf(name, sizeof(name), "%.*s %s", (int)(in->method.len < 24 ? in->method.len : 24),
             in->method.base, route);
    trace_span_init(&s, t->ctx.trace_id, t->ctx.span_id, t->parent, TRACE_KIND_SERVER,
                    span_from_cstr(name));
    s.start_ns = t->start_ns;
    s.end_ns = trace_now_ns();
    s.error = status >= 500 || status == 0;
    trace_span_text(&s, "http.request.method", in->method);
    q = in->target.len ? memchr(in->target.base, '?', in->target.len) : NULL;
    trace_span_text(
        &s, "url.path",
        (struct span){ in->target.base, q ? (size_t)(q - in->target.base) : in->target.len });
    trace_span_text(&s, "http.route", span_from_cstr(route));
    if (status)
        trace_span_int(&s, "http.response.status_code", status);
    trace_span_text(&s, "idempotency.outcome", span_from_cstr(outcome_label(r->out.outcome)));
    if (r->adm.store_key) {
        key_hash(r->adm.store_key, hash);
        trace_span_text(&s, "idempotency.key_hash", span_from_cstr(hash));
    }
    if (links_back(r->out.outcome) && t->link[0])
        trace_span_link(&s, (struct span){ t->link, STORE_TRACE_LEN });
    tracer_submit(r->pl->tracer, &s);
}

void pipeline_trace_id(const struct pipeline_req *r, char out[2 * TRACE_ID_LEN + 1])
{
    if (r->trace)
        trace_hex(r->trace->ctx.trace_id, TRACE_ID_LEN, out);
    else
        out[0] = '\0';
}
