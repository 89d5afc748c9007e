/* SPDX-License-Identifier: MIT */
/* The pipeline's answers, which its steps 1-4 (pipeline.c) and 5-6
 * (pipeline_upstream.c) both call down into, never the other way: the
 * answer set and handed back (pipeline_finish(), the one exit), counted and
 * logged once; the answers a key's state gives (replayed, in flight,
 * mismatch, unknown, unreadable, the store's failure); and the request's
 * end, when the last of its references (the front end's, a late
 * exchange's) goes. On whichever thread the request is on at the time. */
#include <assert.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/admission.h"
#include "idemproxy/http.h"
#include "idemproxy/idemkey.h"
#include "idemproxy/keysource.h"
#include "idemproxy/lease.h"
#include "idemproxy/log.h"
#include "idemproxy/metrics.h"
#include "idemproxy/problem.h"
#include "idemproxy/record.h"
#include "idemproxy/request.h"
#include "idemproxy/route.h"
#include "idemproxy/scope.h"
#include "idemproxy/store.h"

#include "pipeline_impl.h"

/* ---- The answer and the one exit ---- */

void pipeline_set_answer(struct pipeline_req *r, struct record *rec, enum outcome o,
                         const char *replayed)
{
    record_unref(r->out.rec);
    r->out.rec = rec;
    r->out.outcome = o;
    r->out.replayed = replayed;
    r->out.replay_header = r->adm.route->settings.replay_header;
}

/* Sets a problem answer. A record that cannot be built (OOM) leaves no answer:
 * the front end then drops the connection. */
void pipeline_set_problem(struct pipeline_req *r, enum problem p, enum outcome o,
                          const char *detail)
{
    pipeline_set_answer(r, problem_new(p, r->adm.route->errors, detail), o, NULL);
}

/* Counts <r> in the metrics and writes its access line. */
static void account(struct pipeline *pl, struct pipeline_req *r)
{
    const struct route *rt = r->adm.route;
    uint64_t total_us = metrics_now_us() - r->start_us;
    /* the key as sent, or the one derived (which /keys finds) */
    struct span key = r->adm.key.sent.base ? r->adm.key.sent : keysource_sent(&rt->key, r->rq);
    uint64_t bytes = r->streamed ? r->flow->taken : r->out.rec ? r->out.rec->body.len : 0;
    char trace_id[2 * TRACE_ID_LEN + 1];

    (void)pl;
    r->accounted = true;
    if (r->adm.scope_failure) {
        enum scope_failure f = (enum scope_failure)(r->adm.scope_failure - 1);
        char why[160];

        metrics_scope_failure(rt->metrics_id, f);
        snprintf(why, sizeof(why),
                 "its bearer token does not verify (%s): forwarded unprotected (on-unverified: "
                 "passthrough)",
                 scope_failure_label(f));
        if (!r->reason && (r->reason_buf = strdup(why)))
            r->reason = r->reason_buf; /* a refusal has its detail already */
    }
    if (r->streamed)
        metrics_streamed(rt->metrics_id, false, r->flow->taken);
    if (r->body_streaming)
        metrics_streamed(rt->metrics_id, true, r->up_flow->taken);
    metrics_request(rt->metrics_id, r->out.outcome, r->out.rec ? r->out.rec->status : 0, total_us,
                    r->forwarded, r->upstream_us);
    pipeline_trace_end(r, r->out.rec ? r->out.rec->status : 0);
    if (!log_enabled(LOG_LEVEL_INFO))
        return;
    pipeline_trace_id(r, trace_id);
    log_access(&(struct log_access){
        .route = rt->name,
        .method = r->rq->method,
        .target = r->rq->target,
        .key = key,
        .status = r->out.rec ? r->out.rec->status : 0,
        .outcome = outcome_label(r->out.outcome),
        .has_upstream = r->forwarded,
        .upstream_us = r->upstream_us,
        .total_us = total_us,
        .bytes = bytes,
        .unknown = r->unknown,
        .reason = r->reason,
        .request_id = r->out.id,
        .client = r->rq->client_ip[0] ? r->rq->client_ip : NULL,
        .trace_id = trace_id[0] ? trace_id : NULL,
    });
}

/* Hands <r> back to the front end with its answer, counted and logged first:
 * the client may read /metrics as soon as it has the answer. A streamed
 * answer is counted when the client's part of it is over (its flow
 * tells, before the client has the last bytes; or the client went:
 * pipeline_req_free()): its bytes are known then. The one exit. */
void pipeline_account(struct pipeline_req *r)
{
    if (!r->accounted)
        account(r->pl, r);
}

void pipeline_finish(struct pipeline_req *r)
{
    struct pipeline_answer a = r->out;

    assert(!r->decided);
    if (!r->streamed && !r->accounted)
        account(r->pl, r);
    if (r->running)
        metrics_inflight_add(-1);
    r->decided = true;
    if (r->front_gone) {
        /* Its client went while its body streamed: nobody takes the answer,
         * and the front end's reference is dropped here. */
        if (r->streamed)
            flow_reader_gone(r->flow);
        pipeline_req_unref(r);
        return;
    }
    if (r->streamed)
        record_ref(a.rec); /* the front end's; this one stays for the access line */
    else
        r->out.rec = NULL; /* the front end's reference now */
    r->answer(r->answer_ctx, &a);
}

/* The method of <r>, and on a route that reconciles its header fields'
 * bytes, into <r>->late_method: the front end's memory is about to go, and
 * a probe of its key copies them (reconcile_key()). On OOM the method is
 * "" and the fields are dropped (a probe then sends none of them). */
void pipeline_keep_method(struct pipeline_req *r)
{
    struct request *in = r->rq;
    bool fields = r->adm.route && r->adm.route->reconcile;
    size_t n = in->method.len + 1, at;

    if (r->late_method)
        return;
    for (size_t i = 0; fields && i < in->nheaders; i++)
        n += in->headers[i].name.len + in->headers[i].value.len;
    if (!(r->late_method = malloc(n))) {
        in->method = span_from_cstr("");
        in->nheaders = fields ? 0 : in->nheaders;
        return;
    }
    memcpy(r->late_method, in->method.base, in->method.len);
    r->late_method[in->method.len] = '\0';
    in->method = span_from_cstr(r->late_method);
    at = in->method.len + 1;
    for (size_t i = 0; fields && i < in->nheaders; i++) {
        struct http_header *h = &in->headers[i];

        if (h->name.len)
            memcpy(r->late_method + at, h->name.base, h->name.len);
        h->name.base = r->late_method + at;
        at += h->name.len;
        if (h->value.len)
            memcpy(r->late_method + at, h->value.base, h->value.len);
        h->value.base = r->late_method + at;
        at += h->value.len;
    }
}

/* ---- Answers from the key's state ---- */

/* The 503 of a store that failed with <err>. */
void pipeline_answer_store_error(struct pipeline_req *r, int err)
{
    pipeline_set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                         err == -ENOSPC
                             ? "The idempotency store is full of requests in flight; retry later."
                             : "The idempotency store is not answering; retry later.");
}

/* Starts probing the unknown key of <r>, when its route reconciles
 * (doc/configuration.md, Reconcile); <made>: <r> made it unknown. */
static void reconcile_key(struct pipeline_req *r, bool made, enum store_cause cause)
{
    if (!r->adm.route->reconcile)
        return;
    reconciler_start(r->pl->rc, &(struct reconciler_key){
                                    .routes = r->adm.routes,
                                    .route = r->adm.route,
                                    .store_key = r->adm.store_key,
                                    .key = idemkey_store_key_key(span_from_cstr(r->adm.store_key),
                                                                 span_from_cstr(r->adm.key_prefix)),
                                    .rq = r->rq,
                                    .body = buf_span(&r->adm.body),
                                    .made = made,
                                    .cause = cause,
                                    .principal = r->adm.principal });
}

/* Counts and logs that <r> made its key's outcome unknown for <cause>. A
 * late exchange's client has had its 504 and its access line: this line
 * then carries what that one would have (doc/operations.md, Metrics and
 * access log), so that grep unknown= finds every key lost. */
void pipeline_became_unknown(struct pipeline_req *r, enum store_cause cause)
{
    const struct request *in = r->rq;
    char late[REQUEST_ID_MAX + 160] = "";

    r->unknown = store_cause_name(cause);
    metrics_unknown_outcome(r->adm.route->metrics_id, cause);
    if (r->late)
        snprintf(late, sizeof(late), " [late window over: unknown=%s request_id=%s client=%s]",
                 r->unknown, r->out.id ? r->out.id : "-", in->client_ip[0] ? in->client_ip : "-");
    log_warn("key %s: outcome unknown (%s): %.*s %.*s of route %s may have run upstream and its "
             "answer was lost; duplicates get 502 idempotency_outcome_unknown until %s%s",
             r->adm.store_key, r->unknown, (int)(in->method.len < 64 ? in->method.len : 64),
             in->method.base, (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base,
             r->adm.route->name,
             r->adm.route->reconcile ? "a probe of the API (reconcile) or an operator settles it"
                                     : "an operator resolves it (/keys)",
             late);
    reconcile_key(r, true, cause);
}

/* The answer to a request whose key's outcome is unknown (doc/guarantees.md, Unknown outcomes). */
void pipeline_answer_unknown(struct pipeline_req *r, const struct store_result *res)
{
    if (res->became)
        pipeline_became_unknown(r, res->cause);
    else
        reconcile_key(r, false, res->cause); /* its maker may be gone: this proxy probes too */
    pipeline_set_problem(
        r, PROBLEM_OUTCOME_UNKNOWN, OUTCOME_UNKNOWN,
        "The original request with this Idempotency-Key may have been processed, but its "
        "answer was lost; do not retry with this key. Check whether it took effect; an "
        "operator can then resolve the key.");
}

/* A stored answer that does not open: the same kind is logged once, then
 * counted every 10 s (log.h). */
static struct log_burst sealed_failures = LOG_BURST_INIT("stored answers that do not open");

/* The answer to a key completed earlier whose answer does not open
 * (store_seal.h): a store error that runs nothing again, whatever
 * --on-store-error says. */
void pipeline_answer_unreadable(struct pipeline_req *r, const char *why)
{
    char kind[96]; /* why, less the key id it may name: one kind per failure */

    snprintf(kind, sizeof(kind), "%.*s", (int)strcspn(why, "("), why);
    metrics_store_error();
    if (log_enabled(LOG_LEVEL_ERROR) && log_burst_admit(&sealed_failures, kind))
        log_error("key %s: its stored answer does not open: %s; answered 503, neither replayed "
                  "nor run again",
                  r->adm.store_key, why);
    pipeline_set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                         "The stored answer of this Idempotency-Key cannot be read; the request "
                         "was not run again.");
}

/* Replays the stored answer <rec> (borrowed) of <r>'s key. */
void pipeline_answer_stored(struct pipeline_req *r, struct record *rec)
{
    if (rec->too_large)
        pipeline_set_problem(
            r, PROBLEM_RESPONSE_TOO_LARGE, OUTCOME_REPLAYED,
            "The request was executed, but its response was larger than --max-response, "
            "so it cannot be replayed; it was not executed again.");
    else
        pipeline_set_answer(r, record_ref(rec), OUTCOME_REPLAYED, "true");
}

/* The 422 of a key used for another request, naming the resource its
 * first answer created (doc/configuration.md, Resource links) when the store kept a sane one. */
void pipeline_answer_mismatch(struct pipeline_req *r, struct span resource)
{
    static const char detail[] =
        "This Idempotency-Key was used with a different method, target or body.";
    char id[STORE_RESOURCE_MAX + 1];

    if (!http_is_visible(resource, STORE_RESOURCE_MAX)) {
        pipeline_set_problem(r, PROBLEM_KEY_MISMATCH, OUTCOME_MISMATCH, detail);
        return;
    }
    memcpy(id, resource.base, resource.len);
    id[resource.len] = '\0';
    pipeline_set_answer(
        r, problem_new_with(PROBLEM_KEY_MISMATCH, r->adm.route->errors, detail, "resource", id),
        OUTCOME_MISMATCH, NULL);
}

/* ---- The front end's reference ---- */

void pipeline_req_free(struct pipeline_req *r)
{
    if (!r)
        return;
    r->body_wake = NULL; /* the front end's wake-up goes with it */
    if (r->body_streaming) {
        flow_set_writer(r->up_flow, NULL, NULL);
        flow_end(r->up_flow, false); /* a body not whole by now never will be: cut */
    }
    if (r->body_streaming && !r->decided) {
        /* Its client went while its body streamed: the exchange, cut, ends
         * and drops this reference (pipeline_finish()). */
        r->front_gone = true;
        r->reason = "the client went away before the answer";
        pipeline_keep_method(r);
        pipeline_account(r);
        return;
    }
    if (r->streamed) {
        flow_reader_gone(r->flow); /* the exchange may go on: it must not wake the front end */
        if (!r->accounted)
            pipeline_account(r);
    }
    pipeline_req_unref(r);
}

/* Drops a reference to <r>: the front end's (pipeline_req_free()) or its late
 * exchange's; the last frees it. A late exchange reads none of the front
 * end's memory (the header spans) once its client was answered. */
void pipeline_req_unref(struct pipeline_req *r)
{
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    request_free(r->rq);
    free(r->late_method);
    free(r->trace);
    free(r->reason_buf);
    free((void *)(uintptr_t)r->out.id); /* its own: pipeline_begin()'s copy */
    free(r->up_why.more);
    admission_done(&r->adm);
    lease_abandon(r->lease); /* freed unfinished: no endless heartbeat */
    record_unref(r->out.rec);
    record_unref(r->capture);
    flow_done(r->flow);
    free(r->flow);
    flow_done(r->up_flow);
    free(r->up_flow);
    free(r);
}
