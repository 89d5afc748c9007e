/* SPDX-License-Identifier: MIT */
/* The per-request idempotency state machine, in the order a request lives:
 * its head is checked and its key read (pipeline_begin), its body buffered
 * and hashed (pipeline_body), then (pipeline_end) the store's lock is asked
 * for, a duplicate may be held (--wait), the request is forwarded, and the
 * upstream's answer is stored and handed back. pipeline_begin() and
 * pipeline_body() run on the front end's event loop; from pipeline_end() on,
 * the request follows its store calls and its upstream call, whose callbacks
 * mostly come back on that same loop (a held duplicate's retry or a
 * heartbeat runs on a worker thread), one thread at a time, until its done
 * callback hands it back. Held locks are leases (lease.h: heartbeat,
 * confirmation, the finishing chain and its retries); held duplicates are a
 * waitlist (waitlist.h). */
#include "idemproxy/pipeline.h"

#include <assert.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "idemproxy/buf.h"
#include "idemproxy/config.h"
#include "idemproxy/fingerprint.h"
#include "idemproxy/http.h"
#include "idemproxy/idemkey.h"
#include "idemproxy/lease.h"
#include "idemproxy/log.h"
#include "idemproxy/metrics.h"
#include "idemproxy/problem.h"
#include "idemproxy/record.h"
#include "idemproxy/store.h"
#include "idemproxy/waitlist.h"
#include "idemproxy/worker.h"

#define TOO_LARGE_DETAIL "The request body is larger than this proxy accepts (--max-body)."

struct pipeline {
    const struct config *cfg;
    struct store *st;
    struct worker_pool *pool;
    struct waitlist *waits; /* owned: --wait's held duplicates (waitlist.h), NULL without */
    struct leases *leases;  /* owned: held locks and their heartbeat (lease.h) */
    struct pipeline_forwarder fwd;
};

/* A request as the pipeline knows it: what the front end sees (<req>), and
 * the pipeline's own state, which the front end never sees. */
struct preq {
    struct req req;
    struct pipeline *pl;
    struct buf body; /* owned, limited by --max-body */
    bool enforced;   /* the idempotency rules apply (a valid key was given) */
    /* What is forwarded and fingerprinted: the target in origin-form (or "*"),
     * borrowing <req.in.target_buf> or <fwd_target_buf>, and the Host an
     * absolute-form target names (base NULL: the client's Host). */
    struct span fwd_target;
    char *fwd_target_buf; /* owned: "/" + path, for an absolute-form target without one */
    struct span fwd_host;
    struct fingerprint fp;
    uint8_t digest[FINGERPRINT_LEN];
    char *store_key; /* owned: <prefix><scope>:<key> */
    struct store_token tok;
    struct lease *lease;            /* reference while the lock is held */
    struct upstream_request up_req; /* what is forwarded: borrows from this request */
    uint64_t ttl_ms;                /* how long a completed answer is kept */
    uint64_t acquire_sent_ms;
    uint64_t start_us;         /* metrics_now_us() when the headers were in */
    uint64_t store_sent_us;    /* the acquire in progress */
    uint64_t upstream_sent_us; /* when it was forwarded */
    uint64_t upstream_us;      /* what the upstream took, once <forwarded> */
    bool forwarded;
    bool running;               /* pipeline_end() ran it: counted in flight */
    struct waitlist_entry wait; /* --wait: a duplicate held until the first request ends */
    req_done_fn *done;
    void *done_ctx;
};

static struct preq *preq_of(struct req *r)
{
    return (struct preq *)(void *)((char *)r - offsetof(struct preq, req));
}

static void acquire(struct preq *r);
static void forward(struct preq *r);

/* ---- Reading the request ---- */

static const struct span *find_header(const struct preq *r, struct span name, size_t *ret_count)
{
    const struct req_intake *in = &r->req.in;
    const struct span *found = NULL;
    size_t n = 0;

    for (size_t i = 0; i < in->nheaders; i++) {
        if (span_eq_nocase(in->headers[i].name, name)) {
            if (!found)
                found = &in->headers[i].value;
            n++;
        }
    }
    if (ret_count)
        *ret_count = n;
    return found;
}

/* Parses a decimal integer of one or more digits, nothing else; a value past
 * UINT64_MAX is UINT64_MAX: "99999999999999999999999" is still a positive
 * integer, only a large one. */
static int parse_uint(struct span s, uint64_t *ret)
{
    uint64_t v = 0;

    if (s.len == 0)
        return -EINVAL;
    for (size_t i = 0; i < s.len; i++) {
        uint64_t d = (uint64_t)(s.base[i] - '0');

        if (s.base[i] < '0' || s.base[i] > '9')
            return -EINVAL;
        v = v > (UINT64_MAX - d) / 10 ? UINT64_MAX : v * 10 + d;
    }
    *ret = v;
    return 0;
}

/* The TTL of the completed answer: the TTL header when it is a positive
 * integer (capped at --max-ttl), else --ttl. */
static uint64_t request_ttl_ms(const struct pipeline *pl, const struct preq *r)
{
    const struct config *cfg = pl->cfg;
    const struct span *v;
    uint64_t s;

    if (!cfg->ttl_header || !cfg->ttl_header[0])
        return cfg->ttl_ms;
    v = find_header(r, span_from_cstr(cfg->ttl_header), NULL);
    if (!v || parse_uint(*v, &s) < 0 || s == 0)
        return cfg->ttl_ms;
    if (s > cfg->max_ttl_ms / 1000)
        return cfg->max_ttl_ms;
    return s * 1000;
}

/* Builds <prefix><scope>:<key> (idemkey.h), the scope hashing the
 * --scope-header values in order; several instances of one header count as
 * their comma-joined list. */
static int build_store_key(const struct pipeline *pl, struct preq *r, const struct idemkey *k)
{
    const struct config *cfg = pl->cfg;
    const struct req_intake *in = &r->req.in;
    struct span values[CONFIG_MAX_LIST];
    struct buf joined[CONFIG_MAX_LIST];
    char scope[IDEMKEY_SCOPE_HEX + 1];
    int err = 0;

    for (size_t i = 0; i < cfg->nscope_headers; i++) {
        struct span name = span_from_cstr(cfg->scope_headers[i]);
        const struct span *first;
        size_t n;

        joined[i] = BUF_INIT(SIZE_MAX);
        values[i] = (struct span){ NULL, 0 };
        first = find_header(r, name, &n);
        if (!first)
            continue;
        if (n == 1) {
            values[i] = *first;
            continue;
        }
        for (size_t h = 0; h < in->nheaders && err == 0; h++) {
            if (!span_eq_nocase(in->headers[h].name, name))
                continue;
            if (joined[i].len)
                err = buf_append(&joined[i], ",", 1);
            if (err == 0)
                err = buf_append(&joined[i], in->headers[h].value.base, in->headers[h].value.len);
        }
        values[i] = buf_span(&joined[i]);
        if (!values[i].base)
            values[i].base = ""; /* present, though empty */
    }
    if (err == 0)
        err = idemkey_scope(values, cfg->nscope_headers, scope);
    if (err == 0)
        err = idemkey_store_key(span_from_cstr(cfg->key_prefix), scope, k, &r->store_key);
    for (size_t i = 0; i < cfg->nscope_headers; i++)
        buf_done(&joined[i]);
    return err;
}

/* ---- Answering ---- */

static void set_answer(struct preq *r, struct record *rec, enum outcome o, const char *replayed)
{
    record_unref(r->req.out.answer);
    r->req.out.answer = rec;
    r->req.out.outcome = o;
    r->req.out.replayed = replayed;
}

/* Sets a problem answer. A record that cannot be built (OOM) leaves no answer:
 * the front end then drops the connection. */
static void set_problem(struct preq *r, enum problem p, enum outcome o, const char *detail)
{
    set_answer(r, problem_new(p, PROBLEM_DIALECT_PROBLEM, detail), o, NULL);
}

/* Counts <r> in the metrics and writes its access line. */
static void account(struct pipeline *pl, struct preq *r)
{
    const struct req *q = &r->req;
    uint64_t total_us = metrics_now_us() - r->start_us;
    const struct span *key = NULL;

    metrics_request(q->out.outcome, total_us, r->forwarded, r->upstream_us);
    if (!log_enabled(CONFIG_LOG_INFO))
        return;
    if (pl->cfg->key_header && pl->cfg->key_header[0])
        key = find_header(r, span_from_cstr(pl->cfg->key_header), NULL);
    log_access(&(struct log_access){
        .method = q->in.method,
        .target = q->in.target,
        .key = key ? *key : (struct span){ NULL, 0 },
        .status = q->out.answer ? q->out.answer->status : 0,
        .outcome = outcome_label(q->out.outcome),
        .has_upstream = r->forwarded,
        .upstream_us = r->upstream_us,
        .total_us = total_us,
        .bytes = q->out.answer ? q->out.answer->body.len : 0,
    });
}

/* Hands <r> back to the front end with its answer, counted and logged first:
 * the client may read /metrics as soon as it has the answer. The one exit. */
static void finish(struct preq *r)
{
    assert(!r->req.out.decided);
    account(r->pl, r);
    if (r->running)
        metrics_inflight_add(-1);
    r->req.out.decided = true;
    r->done(&r->req, r->done_ctx);
}

/* ---- 1. The head: HTTP-level checks, then the key ---- */

/* Refuses <r> with a bad_request answer: <status> 400 or 501, <why> in the
 * problem's detail and in the log (the client's bytes escaped there). */
static int refuse_bad_request(struct preq *r, unsigned status, const char *why)
{
    const struct req_intake *in = &r->req.in;
    char detail[256];

    snprintf(detail, sizeof(detail), "The request is malformed: %s.", why);
    log_info("refused %.*s %.*s from %s: %s (%u)", (int)(in->method.len < 64 ? in->method.len : 64),
             in->method.base ? in->method.base : "",
             (int)(in->target.len < 1024 ? in->target.len : 1024),
             in->target.base ? in->target.base : "", in->client_ip, why, status);
    set_problem(r, status == 501 ? PROBLEM_NOT_IMPLEMENTED : PROBLEM_BAD_REQUEST,
                OUTCOME_BAD_REQUEST, detail);
    return 1;
}

/* The HTTP-level checks of SPEC §7: nothing malformed is forwarded, locked or
 * keyed. Sets what is forwarded (<r>->fwd_target, <r>->fwd_host). Returns 0,
 * or 1 with the bad_request answer set. */
static int check_head(struct preq *r)
{
    const struct req_intake *in = &r->req.in;
    struct http_target t;
    const char *why;
    unsigned status = 400;

    if (in->head_error)
        return refuse_bad_request(r, 400, in->head_error);
    why = http_check_request_line(in->method, in->target, &t, &status);
    if (!why)
        why = http_check_fields(in->headers, in->nheaders, in->http11, &status);
    if (why)
        return refuse_bad_request(r, status, why);
    r->fwd_target = t.path;
    if (t.form == HTTP_TARGET_ABSOLUTE) {
        r->fwd_host = t.authority;
        if (t.needs_slash) {
            r->fwd_target_buf = malloc(t.path.len + 2);
            if (!r->fwd_target_buf) {
                set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                            "Out of memory while reading the request.");
                return 1;
            }
            r->fwd_target_buf[0] = '/';
            memcpy(r->fwd_target_buf + 1, t.path.base, t.path.len);
            r->fwd_target_buf[t.path.len + 1] = '\0';
            r->fwd_target = (struct span){ .base = r->fwd_target_buf, .len = t.path.len + 1 };
        }
    }
    return 0;
}

/* Decides passthrough or enforcement and reads the key. Returns 0 to go on
 * with the body, 1 with an answer set. */
static int begin(struct pipeline *pl, struct preq *r)
{
    const struct config *cfg = pl->cfg;
    const struct span *v;
    struct idemkey key;
    uint64_t announced;
    size_t n;

    r->req.out.outcome = OUTCOME_PASSTHROUGH;
    if (check_head(r))
        return 1;
    if (cfg->enabled && config_is_enforced(cfg, r->req.in.method)) {
        v = find_header(r, span_from_cstr(cfg->key_header), &n);
        if (n == 0 && cfg->require_key) {
            set_problem(r, PROBLEM_KEY_MISSING, OUTCOME_MISSING_KEY,
                        "This request must carry an Idempotency-Key header.");
            return 1;
        }
        if (n > 1) {
            set_problem(r, PROBLEM_KEY_INVALID, OUTCOME_INVALID_KEY,
                        "Send exactly one Idempotency-Key header.");
            return 1;
        }
        if (n == 1) {
            if (idemkey_parse(*v, &key) < 0) {
                set_problem(r, PROBLEM_KEY_INVALID, OUTCOME_INVALID_KEY,
                            "An Idempotency-Key is 1-255 visible ASCII characters (0x21-0x7E), "
                            "bare or as a quoted sf-string; a bare key may not hold , \" or \\.");
                return 1;
            }
            if (build_store_key(pl, r, &key) < 0 ||
                fingerprint_init(&r->fp, r->req.in.method, r->fwd_target) < 0) {
                set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                            "Out of memory while reading the request.");
                return 1;
            }
            r->enforced = true;
            r->ttl_ms = request_ttl_ms(pl, r);
        }
    }
    v = find_header(r, SPAN_LIT("Content-Length"), NULL);
    if (v && parse_uint(*v, &announced) == 0 && announced > cfg->max_body_bytes) {
        set_problem(r, PROBLEM_PAYLOAD_TOO_LARGE, OUTCOME_TOO_LARGE, TOO_LARGE_DETAIL);
        return 1;
    }
    return 0;
}

void pipeline_begin(struct pipeline *pl, struct req *q, req_done_fn *done, void *ctx)
{
    struct preq *r = preq_of(q);

    assert(r->pl == pl);
    r->done = done;
    r->done_ctx = ctx;
    r->start_us = metrics_now_us();
    if (begin(pl, r))
        finish(r);
}

/* ---- 2. The body ---- */

void pipeline_body(struct pipeline *pl, struct req *q, const char *p, size_t n)
{
    struct preq *r = preq_of(q);
    int err;

    (void)pl;
    if (q->out.decided)
        return; /* already refused: discard the rest */
    err = buf_append(&r->body, p, n);
    if (err == 0 && r->enforced)
        err = fingerprint_update(&r->fp, p, n);
    if (err == 0)
        return;
    buf_done(&r->body);
    if (err == -E2BIG)
        set_problem(r, PROBLEM_PAYLOAD_TOO_LARGE, OUTCOME_TOO_LARGE, TOO_LARGE_DETAIL);
    else
        set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                    "Out of memory while reading the request.");
    finish(r);
}

/* ---- 3. The run: the lock first, when the key is enforced ---- */

void pipeline_end(struct pipeline *pl, struct req *q)
{
    struct preq *r = preq_of(q);

    assert(r->pl == pl);
    if (q->out.decided)
        return;
    r->running = true;
    metrics_inflight_add(1);
    if (!r->enforced) {
        forward(r);
        return;
    }
    if (fingerprint_final(&r->fp, r->digest) < 0) {
        set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                    "Out of memory while reading the request.");
        finish(r);
        return;
    }
    acquire(r);
}

/* The 503 of a store that failed with <err>. */
static void set_store_problem(struct preq *r, int err)
{
    set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                err == -ENOSPC ? "The idempotency store is full of requests in flight; retry later."
                               : "The idempotency store is not answering; retry later.");
}

static void on_acquired(void *ctx, int err, const struct store_result *res);

/* Asks the store for the lock of <r>, under a new token; a store that refuses
 * the call at once answers 503. */
static void acquire(struct preq *r)
{
    struct pipeline *pl = r->pl;
    int err = store_token_new(&r->tok);

    r->acquire_sent_ms = now_ms();
    r->store_sent_us = metrics_now_us();
    if (err == 0)
        err = store_acquire(pl->st, span_from_cstr(r->store_key), r->digest, &r->tok,
                            pl->cfg->lock_ttl_ms, on_acquired, r);
    if (err < 0) {
        metrics_store_error();
        set_store_problem(r, err);
        finish(r);
    }
}

static bool wait_hold(struct preq *r, uint64_t now);
static void on_confirmed(void *ctx, int err);

static void on_acquired(void *ctx, int err, const struct store_result *res)
{
    struct preq *r = ctx;
    struct pipeline *pl = r->pl;
    uint64_t now = now_ms();

    metrics_store_call(METRICS_STORE_ACQUIRE, metrics_now_us() - r->store_sent_us);
    if (err == 0 && res->status == STORE_ACQUIRED) {
        r->lease = lease_start(pl->leases, r->store_key, &r->tok, r->acquire_sent_ms);
        if (!r->lease) {
            set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR, "Out of memory.");
            finish(r); /* the lock expires within --lock-ttl */
            return;
        }
        /* A holder that stalled past half its lock TTL confirms the lock first. */
        if (now - r->acquire_sent_ms > pl->cfg->lock_ttl_ms / 2) {
            lease_confirm(r->lease, on_confirmed, r);
            return;
        }
        forward(r);
        return;
    }
    if (err == 0 && res->status == STORE_IN_FLIGHT && wait_hold(r, now)) {
        return; /* held: the first request's end, or the deadline, resumes it */
    } else if (err == 0 && res->status == STORE_IN_FLIGHT) {
        set_problem(r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
                    "A request with this Idempotency-Key is still being processed; retry later.");
    } else if (err == 0 && res->status == STORE_MISMATCH) {
        set_problem(r, PROBLEM_KEY_MISMATCH, OUTCOME_MISMATCH,
                    "This Idempotency-Key was used with a different method, target or body.");
    } else if (err == 0 && res->status == STORE_COMPLETED && res->rec->too_large) {
        set_problem(r, PROBLEM_RESPONSE_TOO_LARGE, OUTCOME_REPLAYED,
                    "The request was executed, but its response was larger than --max-response, "
                    "so it cannot be replayed; it was not executed again.");
    } else if (err == 0 && res->status == STORE_COMPLETED) {
        set_answer(r, record_ref(res->rec), OUTCOME_REPLAYED, "true");
    } else {
        metrics_store_error();
        log_warn("store acquire of key %s failed: %s", r->store_key,
                 err < 0 ? store_strerror(err) : "unexpected answer");
        if (pl->cfg->on_store_error == CONFIG_ON_STORE_ERROR_PASSTHROUGH) {
            r->req.out.outcome = OUTCOME_STORE_ERROR;
            forward(r); /* unprotected, as configured */
            return;
        }
        set_store_problem(r, err);
    }
    finish(r);
}

/* The lock of a holder that stalled is confirmed (or lost) before it runs. */
static void on_confirmed(void *ctx, int err)
{
    struct preq *r = ctx;

    if (err == 0) {
        forward(r);
        return;
    }
    if (err == -ESTALE)
        set_problem(r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
                    "This request stalled and its lock passed to another request.");
    else
        set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                    "The idempotency store could not confirm the lock.");
    lease_abandon(r->lease); /* not forwarded: the lock expires within --lock-ttl */
    r->lease = NULL;
    finish(r);
}

/* ---- 4. --wait: a duplicate held until the first request ends ---- */

/* With --wait, holds <r> (whose key is in flight). Returns false when it is
 * not held: no --wait, its wait is over, or the proxy is stopping. */
static bool wait_hold(struct preq *r, uint64_t now)
{
    if (!r->pl->waits)
        return false;
    r->wait.key = r->store_key;
    return waitlist_hold(r->pl->waits, &r->wait, now);
}

static struct preq *preq_of_wait(struct waitlist_entry *e)
{
    return (struct preq *)(void *)((char *)e - offsetof(struct preq, wait));
}

/* A held duplicate's key was completed or released, or it is time to look:
 * it replays, executes (the first ended without storing), or is held again. */
static void on_wait_retry(void *ctx, struct waitlist_entry *e)
{
    (void)ctx;
    acquire(preq_of_wait(e));
}

static void on_wait_expired(void *ctx, struct waitlist_entry *e)
{
    struct preq *r = preq_of_wait(e);

    (void)ctx;
    set_problem(r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
                "A request with this Idempotency-Key is still being processed (waited "
                "--wait); retry later.");
    finish(r);
}

/* ---- 5. Forwarding ---- */

static void on_upstream(void *ctx, int err, struct record *rec);

static void forward(struct preq *r)
{
    const struct req_intake *in = &r->req.in;
    int err;

    r->up_req = (struct upstream_request){
        .method = in->method,
        .target = r->fwd_target,
        .host = r->fwd_host,
        .headers = in->headers,
        .nheaders = in->nheaders,
        .body = buf_span(&r->body),
        .client_ip = in->client_ip,
        .proto = "http",
    };
    r->upstream_sent_us = metrics_now_us();
    err = r->pl->fwd.submit(r->pl->fwd.ctx, in->loop, &r->up_req, on_upstream, r);
    if (err < 0)
        on_upstream(r, err, NULL);
}

/* ---- 6. The upstream's answer: stored, or the lock released ---- */

static void on_lease_finished(void *ctx) { finish(ctx); }

/* Completes the lock of <r> with <rec> (a reference the lease takes over), or
 * releases it when <rec> is NULL; <r> is answered once the first attempt
 * has reported back (store failures are retried without it: lease.h). */
static void lease_end(struct preq *r, struct record *rec)
{
    struct lease *l = r->lease;

    r->lease = NULL; /* the request's reference now belongs to the finishing chain */
    lease_finish(l, rec, r->ttl_ms, on_lease_finished, r);
}

static bool is_cacheable(const struct config *cfg, unsigned status)
{
    return status < ARRAY_SIZE(cfg->no_cache) && !cfg->no_cache[status];
}

/* A stored answer needs the original Date: a replay carries it. */
static void ensure_date(struct record *rec)
{
    char date[64];
    struct tm tm;
    time_t t = time(NULL);

    if (record_header_get(rec, "Date"))
        return;
    gmtime_r(&t, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    (void)record_add_header(rec, SPAN_LIT("Date"), span_from_cstr(date));
}

/* A marker stored instead of an answer larger than the proxy keeps: the
 * request ran, and must not run again. NULL on OOM. */
static struct record *too_large_marker(unsigned status)
{
    struct record *marker = record_new(0);

    if (marker) {
        marker->too_large = true;
        marker->status = status;
    }
    return marker;
}

static void on_upstream(void *ctx, int err, struct record *rec)
{
    struct preq *r = ctx;
    const struct req_intake *in = &r->req.in;
    const struct config *cfg = r->pl->cfg;

    r->forwarded = true;
    r->upstream_us = metrics_now_us() - r->upstream_sent_us;
    if (err < 0) {
        enum problem p = err == -ETIMEDOUT ? PROBLEM_UPSTREAM_TIMEOUT
                         : err == -E2BIG   ? PROBLEM_RESPONSE_TOO_LARGE
                                           : PROBLEM_UPSTREAM_UNAVAILABLE;

        log_warn("upstream %.*s %.*s failed: %s", (int)in->method.len, in->method.base,
                 (int)in->target.len, in->target.base,
                 err == -E2BIG ? "response larger than the proxy can hold" : strerror(-err));
        set_problem(r, p, OUTCOME_UPSTREAM_ERROR, NULL);
        if (!r->lease) {
            finish(r);
            return;
        }
        if (err != -E2BIG) {
            lease_end(r, NULL); /* nothing was stored: a retry may run */
            return;
        }
        /* The upstream did answer: it must never run twice. */
        r->req.out.replayed = "false";
        lease_end(r, too_large_marker(502));
        return;
    }
    if (!r->lease) {
        set_answer(r, rec, r->req.out.outcome, NULL); /* passthrough, or store_error */
        finish(r);
        return;
    }
    set_answer(r, rec, OUTCOME_EXECUTED, "false");
    if (!is_cacheable(cfg, rec->status)) {
        lease_end(r, NULL);
        return;
    }
    ensure_date(rec);
    if (rec->body.len > cfg->max_response_bytes) {
        lease_end(r, too_large_marker(rec->status)); /* a NULL marker (OOM) releases instead */
        return;
    }
    lease_end(r, record_ref(rec));
}

/* ---- Lifecycle ---- */

int pipeline_new(const struct config *cfg, struct store *st, struct worker_pool *pool,
                 const struct pipeline_forwarder *fwd, struct pipeline **ret)
{
    struct pipeline *pl = calloc(1, sizeof(*pl));
    int err = 0;

    if (!pl)
        return -ENOMEM;
    pl->cfg = cfg;
    pl->st = st;
    pl->pool = pool;
    pl->fwd = *fwd;
    if (st && cfg->wait_ms > 0) {
        err = waitlist_new(pool, cfg->wait_ms, on_wait_retry, on_wait_expired, pl, &pl->waits);
        if (err == 0)
            err = store_set_notify(st, waitlist_notify, pl->waits);
    }
    if (st && err == 0)
        err = leases_new(st, pool, cfg->lock_ttl_ms, &pl->leases);
    if (err < 0) {
        pipeline_free(pl);
        return err;
    }
    *ret = pl;
    return 0;
}

void pipeline_stop(struct pipeline *pl)
{
    waitlist_stop(pl->waits);
    leases_stop(pl->leases); /* waits for a heartbeat in progress */
}

void pipeline_quiesce(struct pipeline *pl) { waitlist_quiesce(pl->waits); }

void pipeline_free(struct pipeline *pl)
{
    if (!pl)
        return;
    leases_free(pl->leases);
    waitlist_free(pl->waits);
    free(pl);
}

/* ---- The request object ---- */

struct req *req_new(struct pipeline *pl)
{
    struct preq *r = calloc(1, sizeof(*r));

    if (!r)
        return NULL;
    r->pl = pl;
    r->body = BUF_INIT(pl->cfg->max_body_bytes);
    return &r->req;
}

int req_add_header(struct req *q, struct span name, struct span value)
{
    struct req_intake *in = &q->in;

    if (in->nheaders == in->headers_cap) {
        size_t cap = in->headers_cap ? in->headers_cap * 2 : 16;
        struct http_header *h = realloc(in->headers, cap * sizeof(*h));

        if (!h)
            return -ENOMEM;
        in->headers = h;
        in->headers_cap = cap;
    }
    in->headers[in->nheaders++] = (struct http_header){ .name = name, .value = value };
    return 0;
}

void req_free(struct req *q)
{
    struct preq *r;

    if (!q)
        return;
    r = preq_of(q);
    free(q->in.target_buf);
    free(r->fwd_target_buf);
    free(q->in.headers);
    buf_done(&r->body);
    fingerprint_done(&r->fp);
    free(r->store_key);
    lease_abandon(r->lease); /* freed unfinished: no endless heartbeat */
    record_unref(q->out.answer);
    free(r);
}
