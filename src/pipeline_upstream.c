/* SPDX-License-Identifier: MIT */
/* The pipeline's steps 5 and 6 (pipeline.c has the first four): a request
 * forwarded, and the upstream's answer, or its failure, ending the lock:
 * stored, released, or the key's outcome made unknown (doc/guarantees.md, Unknown outcomes). On the
 * loop thread of the upstream call; a late exchange (--upstream-late-timeout)
 * ends there after its client was answered. */
#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/config.h"
#include "idemproxy/idemkey.h"
#include "idemproxy/lease.h"
#include "idemproxy/log.h"
#include "idemproxy/metrics.h"
#include "idemproxy/problem.h"
#include "idemproxy/record.h"
#include "idemproxy/route.h"

#include "pipeline_impl.h"

/* An upstream failure that repeats across requests: the first of a kind is
 * logged, then a count every 10 s (log.h). */
static struct log_burst upstream_failures = LOG_BURST_INIT("upstream failures");

/* ---- 5. Forwarding ---- */

static void on_upstream(void *ctx, int err, struct record *rec);
static void on_overdue(void *ctx);
static int on_head(void *ctx, struct record *rec, uint64_t length);

void pipeline_forward(struct pipeline_req *r)
{
    const struct request *in = r->rq;
    int err;

    r->up_req = (struct upstream_request){
        .method = in->method,
        .target = r->adm.fwd_target,
        .host = r->adm.fwd_host,
        .headers = in->headers,
        .nheaders = in->nheaders,
        .body = buf_span(&r->adm.body),
        .client_ip = in->client_ip,
        .proto = r->pl->proto,
        .id_header = r->out.id_header ? span_from_cstr(r->out.id_header) : (struct span){ 0 },
        .id = r->out.id ? span_from_cstr(r->out.id) : (struct span){ 0 },
        .traceparent = pipeline_trace_forward(r),
        .overdue = r->lease ? on_overdue : NULL, /* a keyed request's answer may come late */
        .why = &r->up_why,
        .head = on_head,
        .flow = NULL, /* made when its head comes (on_head()) */
        .body_flow = r->body_streaming ? r->up_flow : NULL,
    };
    r->upstream_sent_us = metrics_now_us();
    err = r->pl->fwd.submit(r->pl->fwd.ctx, in->loop, &r->up_req, on_upstream, r);
    if (err < 0 && r->body_streaming)
        flow_reader_gone(r->up_flow); /* nobody will read the rest of the body */
    if (err < 0)
        on_upstream(r, err, NULL);
}

/* ---- 6. The upstream's answer: stored, or the lock released ---- */

/* The finishing chain's first attempt has reported back: <r> is answered,
 * or, when its client got a 504 already, its late exchange is over. */
static void on_lease_finished(void *ctx);

/* The end of an exchange that went on after its client was answered (a
 * late one, or a streamed one), on the request's loop: a streamed answer
 * held for its storage may end for the client now. Drops the exchange's
 * reference. */
static void exchange_end(void *ctx)
{
    struct pipeline_req *r = ctx;

    if (r->streamed)
        flow_release(r->flow);
    atomic_fetch_sub_explicit(&r->pl->late, 1, memory_order_release);
    pipeline_req_unref(r);
}

static void on_lease_finished(void *ctx)
{
    struct pipeline_req *r = ctx;

    pipeline_trace_finish_end(r);
    if (!r->late && !r->streamed) {
        pipeline_finish(r);
        return;
    }
    /* The store may report on another thread; the flow is the loop's. */
    if (r->streamed && !loop_on_thread(r->rq->loop)) {
        r->ended = (struct loop_task){ .fn = exchange_end, .ctx = r };
        if (loop_post(r->rq->loop, &r->ended) == 0)
            return; /* else the loop has stopped: nothing else touches the flow */
    }
    exchange_end(r);
}

/* Completes the lock of <r> with <rec> (a reference the lease takes over), or
 * releases it when <rec> is NULL; <r> is answered once the first attempt
 * has reported back (store failures are retried without it: lease.h). */
static void lease_end_linked(struct pipeline_req *r, struct record *rec,
                             const struct store_link *link)
{
    struct lease *l = r->lease;

    r->lease = NULL; /* the request's reference now belongs to the finishing chain */
    pipeline_trace_finish_begin(r, rec ? "complete" : "release");
    lease_finish(l, rec, r->adm.ttl_ms, link, on_lease_finished, r);
}

void pipeline_lease_end(struct pipeline_req *r, struct record *rec)
{
    lease_end_linked(r, rec, NULL);
}

/* Ends the lock of <r> with the upstream's answer <rec> (borrowed): stored,
 * or released when it is not kept: a status not cached, or <keep> false
 * (the API said no-store). <over>: its body passed --max-response while it
 * streamed, and was not kept. */
static void lease_end_answer(struct pipeline_req *r, struct record *rec, bool keep, bool over)
{
    const struct route_settings *rs = &r->adm.route->settings;
    char resource[STORE_RESOURCE_MAX + 1];
    struct store_link link = { .prefix_len = strlen(r->pl->key_prefix),
                               .tomb_ms = rs->tombstone_ttl_ms };
    bool linked;

    if (!keep || !config_is_cacheable(rs, rec->status)) {
        pipeline_lease_end(r, NULL);
        return;
    }
    record_ensure_date(rec);
    /* The resource its answer created, by its route (doc/configuration.md,
     * Resource links): a marker, too, keeps its answer's link. */
    memcpy(link.fp, r->adm.digest, FINGERPRINT_LEN);
    link.resource.len = route_resource(r->adm.route, rec, resource);
    link.resource.base = resource;
    linked = link.resource.len > 0 || link.tomb_ms > 0;
    if (over || rec->body.len > rs->max_response_bytes) /* NULL (OOM): released */
        lease_end_linked(r, record_new_too_large(rec->status), linked ? &link : NULL);
    else
        lease_end_linked(r, record_ref(rec), linked ? &link : NULL);
}

/* Whether one storage header that says neither no-store nor ttl=S was logged. */
static atomic_bool storage_said;

/* Takes the storage header (doc/configuration.md, The API steers storage) out
 * of <rec>, the answer of <r>, which the client never sees, and returns
 * whether the answer may be kept: false for no-store; ttl=S sets its TTL,
 * capped at the route's max-ttl. */
static bool take_storage(struct pipeline_req *r, struct record *rec)
{
    uint64_t ttl_ms = 0, max_ms = r->adm.route->settings.max_ttl_ms;
    char value[80];

    if (!r->pl->storage_header)
        return true;
    switch (record_take_storage(rec, r->pl->storage_header, &ttl_ms, value, sizeof(value))) {
    case RECORD_STORAGE_NO_STORE:
        return false;
    case RECORD_STORAGE_TTL:
        r->adm.ttl_ms = ttl_ms < max_ms ? ttl_ms : max_ms;
        return true;
    case RECORD_STORAGE_INVALID:
        if (!atomic_exchange(&storage_said, true))
            log_warn("upstream answer header %s: '%s' is neither no-store nor ttl=SECONDS, nor "
                     "given once: ignored (this is said once; later ones are ignored silently)",
                     r->pl->storage_header, value);
        return true;
    case RECORD_STORAGE_DEFAULT:
        break;
    }
    return true;
}

/* Why the key of <r> is unknown after the upstream failure <err>, one that
 * may have sent bytes of the request (upstream_err_maybe_sent()): no complete
 * answer in time (a silence past the timeouts, or a late exchange, already
 * past --upstream-timeout, cut as the proxy stops), or else the exchange
 * broke (a reset, a close, an answer that is not HTTP, the proxy stopping).
 * The one place that says so, whatever the exchange's stage. */
static enum store_cause unknown_cause(const struct pipeline_req *r, int err)
{
    return err == -ETIMEDOUT || (err == -ESHUTDOWN && r->late) ? STORE_CAUSE_UPSTREAM_TIMEOUT
                                                               : STORE_CAUSE_UPSTREAM_RESET;
}

/* The request of <r> may have run upstream and its answer is lost to the
 * failure <err>: the key becomes unknown (refuse), or is released to run
 * again (retry). */
static void lease_end_unknown(struct pipeline_req *r, int err)
{
    const struct route_settings *rs = &r->adm.route->settings;
    enum store_cause cause = unknown_cause(r, err);
    struct lease *l = r->lease;

    if (rs->on_unknown == CONFIG_ON_UNKNOWN_RETRY) {
        pipeline_lease_end(r, NULL);
        return;
    }
    pipeline_became_unknown(r, cause);
    r->lease = NULL;
    pipeline_trace_finish_begin(r, "unknown");
    lease_finish_unknown(l, cause,
                         &(struct store_about){ .route = span_from_cstr(r->adm.route->name),
                                                .method = r->rq->method,
                                                .target = r->adm.fwd_target },
                         r->adm.ttl_ms, on_lease_finished, r);
}

/* --upstream-timeout passed while a keyed request's exchange goes on (for
 * --upstream-late-timeout): its client gets its 504 now, and the exchange,
 * under the same heartbeat-held lock, may still store a late answer. On the
 * loop thread, as on_upstream(). */
static void on_overdue(void *ctx)
{
    struct pipeline_req *r = ctx;
    const struct request *in = r->rq;

    if (r->streamed) {
        /* Its client has the head and part of the body: that answer is cut
         * (never taken for whole), and the exchange goes on, copied. */
        log_warn("upstream %.*s %.*s: its answer stopped for longer than --upstream-timeout "
                 "after %llu bytes were sent: the client's answer is cut; the exchange goes "
                 "on while it is not silent for --upstream-late-timeout",
                 (int)in->method.len, in->method.base,
                 (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base,
                 (unsigned long long)r->flow->taken);
        r->late = true;
        r->out.outcome = OUTCOME_UPSTREAM_ERROR; /* what its access line and metrics say */
        flow_cut(r->flow);
        return;
    }
    r->forwarded = true;
    r->upstream_us = metrics_now_us() - r->upstream_sent_us;
    log_info("upstream %.*s %.*s: no answer within --upstream-timeout; answered 504, the exchange "
             "goes on for --upstream-late-timeout",
             (int)in->method.len, in->method.base,
             (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base);
    pipeline_set_problem(r, PROBLEM_UPSTREAM_TIMEOUT, OUTCOME_UPSTREAM_ERROR, NULL);
    pipeline_keep_method(r);
    r->late = true;
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->pl->late, 1, memory_order_relaxed);
    pipeline_finish(r);
}

/* The end of a late exchange: its client has its 504 (and may be gone, with
 * the front end's part of <r>): the lock is completed, released or made
 * unknown, and nothing is answered. */
static void late_end(struct pipeline_req *r, int err, struct record *rec)
{
    pipeline_trace_upstream_end(r, rec ? rec->status : 0, err < 0);
    log_info("key %s: the late exchange ended: %s", r->adm.store_key,
             err == 0            ? "an answer"
             : err == -ETIMEDOUT ? "no answer within --upstream-late-timeout either"
                                 : strerror(-err));
    if (err == -E2BIG) {
        pipeline_lease_end(r, record_new_too_large(502)); /* it did answer */
    } else if (err < 0 && upstream_err_maybe_sent(err)) {
        lease_end_unknown(r, err);
    } else if (err < 0) {
        pipeline_lease_end(r, NULL);
    } else {
        lease_end_answer(r, rec, take_storage(r, rec), false);
    }
    record_unref(rec);
}

/* The client's streamed answer is over, before it has its last bytes: it is
 * counted and logged now, as a whole answer is before it goes (a client may
 * read /metrics as soon as it has its answer). */
static void on_answer_over(void *ctx)
{
    struct pipeline_req *r = ctx;

    pipeline_account(r);
}

/* The head of an answer whose body is still to come (doc/guarantees.md,
 * "Streaming"): it goes to the client now, and the body follows through
 * the flow. A keyed answer is copied into <rec> as it passes, up to the
 * route's max-response, and its end (the last byte of a known length) is
 * held from the client until the store has reported: a client that has the
 * whole answer finds it stored. A request whose client got its 504 already
 * copies only. On the loop thread. */
static int on_head(void *ctx, struct record *rec, uint64_t length)
{
    struct pipeline_req *r = ctx;
    struct flow *f = malloc(sizeof(*f));
    const struct route_settings *rs = &r->adm.route->settings;
    bool keep;

    if (!f) {
        record_unref(rec);
        return -ENOMEM; /* the exchange ends */
    }
    flow_init(f);
    r->flow = f;
    r->up_req.flow = f;
    keep = take_storage(r, rec);
    r->streamed = true;
    r->forwarded = true;
    pipeline_trace_head(r, rec->status);
    pipeline_keep_method(r);
    if (!r->late)
        r->upstream_us = metrics_now_us() - r->upstream_sent_us;
    flow_set_length(f, length);
    if (r->lease)
        flow_set_to_the_end(f); /* its end decides its key, client or not */
    /* The bytes read with the head: an empty flow takes them whole. */
    flow_write(f, rec->body.data, rec->body.len);
    r->keep = r->lease && keep && config_is_cacheable(rs, rec->status);
    if (r->keep) {
        r->capture = record_ref(rec);
        flow_set_copy(f, &rec->body, rs->max_response_bytes);
    } else {
        buf_done(&rec->body); /* the answer's head only, from here */
    }
    if (r->late) { /* the exchange holds its reference since the 504 */
        flow_cut(f);
        record_unref(rec);
        return 0;
    }
    flow_set_over(f, on_answer_over, r);
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed); /* the exchange's */
    atomic_fetch_add_explicit(&r->pl->late, 1, memory_order_relaxed);
    if (r->lease) {
        flow_hold(f);
        pipeline_set_answer(r, rec, OUTCOME_EXECUTED, "false");
    } else {
        pipeline_set_answer(r, rec, r->out.outcome, NULL); /* passthrough, or store_error */
    }
    r->out.body = f;
    pipeline_finish(r);
    return 0;
}

/* A streamed answer's exchange is over: whole (<err> 0) or cut. The client's
 * body ends so; a keyed one ends its lock as a whole answer would, or
 * becomes unknown when the request may have run and its answer is not
 * whole (a reset, or a silence past the late timeout). */
static void stream_end(struct pipeline_req *r, int err)
{
    const struct request *in = r->rq;
    struct flow *f = r->flow;

    if (!r->late)
        r->upstream_us = metrics_now_us() - r->upstream_sent_us;
    pipeline_trace_upstream_end(r, 0, err < 0);
    if (err < 0 && !f->reader_gone && !f->cut)
        r->out.outcome = OUTCOME_UPSTREAM_ERROR; /* what its access line and metrics say */
    if (err < 0 && !f->reader_gone && !f->cut && log_enabled(LOG_LEVEL_WARN))
        log_warn("upstream %.*s %.*s: its answer was cut after %llu bytes were sent to the "
                 "client: %s",
                 (int)in->method.len, in->method.base,
                 (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base,
                 (unsigned long long)f->taken, r->up_why.cause ? r->up_why.cause : strerror(-err));
    flow_end(f, err == 0);
    if (!r->lease) { /* passthrough: nothing to end */
        exchange_end(r);
        return;
    }
    if (err == 0 && r->keep)
        lease_end_answer(r, r->capture, true, f->copy_over);
    else if (err == 0 || !r->keep || !upstream_err_maybe_sent(err))
        pipeline_lease_end(r, NULL); /* a head not to be kept (a 5xx, no-store) is released */
    else
        lease_end_unknown(r, err);
}

static void on_upstream(void *ctx, int err, struct record *rec)
{
    struct pipeline_req *r = ctx;
    const struct request *in = r->rq;
    bool keep;

    if (r->streamed) {
        stream_end(r, err);
        return;
    }
    if (r->late) {
        late_end(r, err, rec);
        return;
    }
    r->forwarded = true;
    r->upstream_us = metrics_now_us() - r->upstream_sent_us;
    pipeline_trace_upstream_end(r, rec ? rec->status : 0, err < 0);
    if (err < 0 && r->body_over) { /* passthrough: there is no lock */
        r->reason = "its body passed --max-passthrough-body";
        pipeline_set_problem(r, PROBLEM_PAYLOAD_TOO_LARGE, OUTCOME_TOO_LARGE,
                             ADMISSION_PASSTHROUGH_TOO_LARGE);
        pipeline_finish(r);
        return;
    }
    if (err < 0) {
        enum problem p = err == -ETIMEDOUT || err == -ENOTCONN ? PROBLEM_UPSTREAM_TIMEOUT
                         : err == -E2BIG                       ? PROBLEM_RESPONSE_TOO_LARGE
                                                               : PROBLEM_UPSTREAM_UNAVAILABLE;
        const char *cause = r->up_why.cause ? r->up_why.cause
                            : err == -E2BIG ? "its answer is larger than the proxy can hold"
                                            : strerror(-err);
        char detail[160];

        if (log_enabled(LOG_LEVEL_WARN) && log_burst_admit(&upstream_failures, cause))
            log_warn("upstream %.*s %.*s failed: %s%s%s%s%s", (int)in->method.len, in->method.base,
                     (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base, cause,
                     r->up_why.more ? " (" : "", r->up_why.more ? r->up_why.more : "",
                     r->up_why.more ? ")" : "",
                     upstream_err_maybe_sent(err) ? "; the request may have reached it" : "");
        snprintf(detail, sizeof(detail), "%s.", cause);
        detail[0] = (char)toupper((unsigned char)detail[0]);
        pipeline_set_problem(r, p, OUTCOME_UPSTREAM_ERROR, err == -E2BIG ? NULL : detail);
        if (!r->lease) {
            pipeline_finish(r);
            return;
        }
        if (err == -E2BIG) {
            /* The upstream did answer: it must never run twice. */
            r->out.replayed = "false";
            pipeline_lease_end(r, record_new_too_large(502));
            return;
        }
        if (upstream_err_maybe_sent(err)) {
            lease_end_unknown(r, err);
            return;
        }
        pipeline_lease_end(r, NULL); /* nothing reached the upstream: a retry may run */
        return;
    }
    keep = take_storage(r, rec);
    if (!r->lease) {
        pipeline_set_answer(r, rec, r->out.outcome, NULL); /* passthrough, or store_error */
        pipeline_finish(r);
        return;
    }
    pipeline_set_answer(r, rec, OUTCOME_EXECUTED, "false");
    lease_end_answer(r, rec, keep, false);
}
