/* SPDX-License-Identifier: MIT */
/* The per-request idempotency state machine. pipeline_begin() and
 * pipeline_body() run on the front end's event loop; from pipeline_run() on,
 * the request follows its store calls (acquire, complete, release) and its
 * upstream call, whose callbacks mostly come back on that same loop (a held
 * duplicate's retry or a heartbeat runs on a worker thread), one thread at a
 * time, until its done callback hands it back. Held locks are leases
 * (lease.h: heartbeat, confirmation, the finishing chain and its retries). */
#include "idemproxy/pipeline.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "idemproxy/config.h"
#include "idemproxy/http.h"
#include "idemproxy/lease.h"
#include "idemproxy/log.h"
#include "idemproxy/metrics.h"
#include "idemproxy/problem.h"
#include "idemproxy/record.h"
#include "idemproxy/waitlist.h"
#include "idemproxy/worker.h"

#define TOO_LARGE_DETAIL "The request body is larger than this proxy accepts (--max-body)."



struct pipeline {
    const struct config *cfg;
    struct store *st;
    struct worker_pool *pool;
    struct waitlist *waits; /* owned: --wait's held duplicates (waitlist.h), NULL without */
    struct leases *leases; /* owned: held locks and their heartbeat (lease.h) */
    struct pipeline_forwarder fwd;
};

static void forward(struct req *r);

static const struct span *find_header(const struct req *r, struct span name, size_t *ret_count);

/* Counts <r> in the metrics and writes its access line, once, just before
 * its answer goes to the front end. */
static void account(struct pipeline *pl, struct req *r)
{
    uint64_t total_us = metrics_now_us() - r->start_us;
    const struct span *key = NULL;

    if (r->accounted)
        return;
    r->accounted = true;
    metrics_request(r->out.outcome, total_us, r->forwarded, r->upstream_us);
    if (!log_enabled(CONFIG_LOG_INFO))
        return;
    if (pl->cfg->key_header && pl->cfg->key_header[0])
        key = find_header(r, span_from_cstr(pl->cfg->key_header), NULL);
    log_access(&(struct log_access){
        .method = r->in.method,
        .target = r->in.target,
        .key = key ? *key : (struct span){ NULL, 0 },
        .status = r->out.answer ? r->out.answer->status : 0,
        .outcome = outcome_label(r->out.outcome),
        .has_upstream = r->forwarded,
        .upstream_us = r->upstream_us,
        .total_us = total_us,
        .bytes = r->out.answer ? r->out.answer->body.len : 0,
    });
}

/* Hands <r> back to the front end with its answer. */
static void req_finish(struct req *r)
{
    struct pipeline *pl = r->pl;

    account(pl, r);
    /* Before the answer can reach the client, who may read /metrics next. */
    metrics_inflight_add(-1);
    r->done(r, r->done_ctx);
}

static void finish_job(void *ctx) { req_finish(ctx); }

/* Answers from a pool thread, so that a refusal inside pipeline_run() never
 * calls back from inside it. */
static void req_finish_later(struct req *r)
{
    if (worker_submit(r->pl->pool, finish_job, r) < 0)
        req_finish(r); /* the pool is stopping: nobody is inside pipeline_run() then */
}

static void set_answer(struct req *r, struct record *rec, enum outcome o, const char *replayed)
{
    record_unref(r->out.answer);
    r->out.answer = rec;
    r->out.outcome = o;
    r->out.replayed = replayed;
}

/* Sets a problem answer. A record that cannot be built (OOM) leaves no answer:
 * the front end then drops the connection. */
static void set_problem(struct req *r, enum problem p, enum outcome o, const char *detail)
{
    set_answer(r, problem_new(p, detail), o, NULL);
}

static const struct span *find_header(const struct req *r, struct span name, size_t *ret_count)
{
    const struct span *found = NULL;
    size_t n = 0;

    for (size_t i = 0; i < r->in.nheaders; i++) {
        if (span_eq_nocase(r->in.headers[i].name, name)) {
            if (!found)
                found = &r->in.headers[i].value;
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
static uint64_t request_ttl_ms(const struct pipeline *pl, const struct req *r)
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

/* Builds <prefix><scope>:<key>, the scope hashing the --scope-header values in
 * order; several instances of one header count as their comma-joined list. */
static int build_store_key(const struct pipeline *pl, struct req *r, const struct idemkey *k)
{
    const struct config *cfg = pl->cfg;
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
        for (size_t h = 0; h < r->in.nheaders && err == 0; h++) {
            if (!span_eq_nocase(r->in.headers[h].name, name))
                continue;
            if (joined[i].len)
                err = buf_append(&joined[i], ",", 1);
            if (err == 0)
                err =
                    buf_append(&joined[i], r->in.headers[h].value.base, r->in.headers[h].value.len);
        }
        values[i] = buf_span(&joined[i]);
        if (!values[i].base)
            values[i].base = ""; /* present, though empty */
    }
    if (err == 0)
        err = idemkey_scope(values, cfg->nscope_headers, scope);
    if (err == 0) {
        err = idemkey_store_key(span_from_cstr(cfg->key_prefix), scope, k, &r->store_key);
    }
    for (size_t i = 0; i < cfg->nscope_headers; i++)
        buf_done(&joined[i]);
    return err;
}

/* Refuses <r> with a bad_request answer: <status> 400 or 501, <why> in the
 * problem's detail and in the log (the client's bytes escaped there). */
static int refuse_bad_request(struct req *r, unsigned status, const char *why)
{
    char detail[256];

    snprintf(detail, sizeof(detail), "The request is malformed: %s.", why);
    log_info("refused %.*s %.*s from %s: %s (%u)",
             (int)(r->in.method.len < 64 ? r->in.method.len : 64),
             r->in.method.base ? r->in.method.base : "",
             (int)(r->in.target.len < 1024 ? r->in.target.len : 1024),
             r->in.target.base ? r->in.target.base : "", r->in.client_ip, why, status);
    set_problem(r, status == 501 ? PROBLEM_NOT_IMPLEMENTED : PROBLEM_BAD_REQUEST,
                OUTCOME_BAD_REQUEST, detail);
    return 1;
}

/* The HTTP-level checks of SPEC §7: nothing malformed is forwarded, locked or
 * keyed. Sets what is forwarded (<r>->fwd_target, <r>->fwd_host). Returns 0,
 * or 1 with the bad_request answer set. */
static int check_head(struct req *r)
{
    struct http_target t;
    const char *why;
    unsigned status = 400;

    if (r->in.head_error)
        return refuse_bad_request(r, 400, r->in.head_error);
    why = http_check_request_line(r->in.method, r->in.target, &t, &status);
    if (!why)
        why = http_check_fields(r->in.headers, r->in.nheaders, r->in.http11, &status);
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

static int begin(struct pipeline *pl, struct req *r)
{
    const struct config *cfg = pl->cfg;
    const struct span *v;
    struct idemkey key;
    uint64_t announced;
    size_t n;

    r->start_us = metrics_now_us();
    r->out.outcome = OUTCOME_PASSTHROUGH;
    if (check_head(r))
        return 1;
    if (cfg->enabled && config_is_enforced(cfg, r->in.method)) {
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
                fingerprint_init(&r->fp, r->in.method, r->fwd_target) < 0) {
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

static void body(struct req *r, const char *p, size_t n)
{
    int err;

    err = buf_append(&r->body, p, n);
    if (err == -E2BIG) {
        buf_done(&r->body);
        set_problem(r, PROBLEM_PAYLOAD_TOO_LARGE, OUTCOME_TOO_LARGE, TOO_LARGE_DETAIL);
        return;
    }
    if (err == 0 && r->enforced)
        err = fingerprint_update(&r->fp, p, n);
    if (err < 0) {
        buf_done(&r->body);
        set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                    "Out of memory while reading the request.");
    }
}

int pipeline_begin(struct pipeline *pl, struct req *r)
{
    if (!begin(pl, r))
        return 0;
    account(pl, r); /* answered at once: counted before the front end sends it */
    return 1;
}

void pipeline_body(struct pipeline *pl, struct req *r, const char *p, size_t n)
{
    if (r->out.answer)
        return; /* already refused: discard the rest */
    body(r, p, n);
    if (r->out.answer)
        account(pl, r); /* refused while reading */
}

/* ---- The request path ---- */

static void finish_answered(void *ctx) { req_finish(ctx); }

/* Completes the lock of <r> with <rec> (a reference the lease takes over), or
 * releases it when <rec> is NULL; <r> is answered once the first attempt
 * has reported back (store failures are retried without it: lease.h). */
static void lease_end(struct req *r, struct record *rec)
{
    struct lease *l = r->lease;

    r->lease = NULL; /* the request's reference now belongs to the finishing chain */
    lease_finish(l, rec, r->ttl_ms, finish_answered, r);
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

static void on_upstream(void *ctx, int err, struct record *rec)
{
    struct req *r = ctx;
    const struct config *cfg = r->pl->cfg;
    struct record *marker;

    r->forwarded = true;
    r->upstream_us = metrics_now_us() - r->upstream_sent_us;
    if (err < 0) {
        enum problem p = err == -ETIMEDOUT ? PROBLEM_UPSTREAM_TIMEOUT
                         : err == -E2BIG   ? PROBLEM_RESPONSE_TOO_LARGE
                                           : PROBLEM_UPSTREAM_UNAVAILABLE;

        log_warn("upstream %.*s %.*s failed: %s", (int)r->in.method.len, r->in.method.base,
                 (int)r->in.target.len, r->in.target.base,
                 err == -E2BIG ? "response larger than the proxy can hold" : strerror(-err));
        set_problem(r, p, OUTCOME_UPSTREAM_ERROR, NULL);
        if (!r->lease) {
            req_finish(r);
            return;
        }
        if (err != -E2BIG) {
            lease_end(r, NULL); /* nothing was stored: a retry may run */
            return;
        }
        /* The upstream did answer: it must never run twice. */
        r->out.replayed = "false";
        marker = record_new(0);
        if (marker) {
            marker->too_large = true;
            marker->status = 502;
        }
        lease_end(r, marker);
        return;
    }
    if (!r->lease) {
        set_answer(r, rec, r->out.outcome, NULL); /* passthrough, or store_error */
        req_finish(r);
        return;
    }
    set_answer(r, rec, OUTCOME_EXECUTED, "false");
    if (!is_cacheable(cfg, rec->status)) {
        lease_end(r, NULL);
        return;
    }
    ensure_date(rec);
    if (rec->body.len > cfg->max_response_bytes) {
        marker = record_new(0);
        if (marker) {
            marker->too_large = true;
            marker->status = rec->status;
        }
        lease_end(r, marker); /* a NULL marker (OOM) releases instead */
        return;
    }
    lease_end(r, record_ref(rec));
}

static void forward(struct req *r)
{
    int err = -ECANCELED;

    r->up_req = (struct upstream_request){
        .method = r->in.method,
        .target = r->fwd_target,
        .host = r->fwd_host,
        .headers = r->in.headers,
        .nheaders = r->in.nheaders,
        .body = buf_span(&r->body),
        .client_ip = r->in.client_ip,
        .proto = "http",
    };
    r->upstream_sent_us = metrics_now_us();
    err = r->pl->fwd.submit(r->pl->fwd.ctx, r->in.loop, &r->up_req, on_upstream, r);
    if (err < 0)
        on_upstream(r, err, NULL);
}

static void on_confirmed(void *ctx, int err)
{
    struct req *r = ctx;

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
    req_finish(r);
}

static void on_acquired(void *ctx, int err, const struct store_result *res);

/* Asks the store for the lock of <r>, under a new token. */
static int acquire_start(struct req *r)
{
    struct pipeline *pl = r->pl;
    int err = store_token_new(&r->tok);

    r->acquire_sent_ms = now_ms();
    r->store_sent_us = metrics_now_us();
    if (err == 0)
        err = store_acquire(pl->st, span_from_cstr(r->store_key), r->digest, &r->tok,
                            pl->cfg->lock_ttl_ms, on_acquired, r);
    return err;
}

/* The 503 of a store that failed with <err>. */
static void set_store_problem(struct req *r, int err)
{
    set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                err == -ENOSPC ? "The idempotency store is full of requests in flight; retry later."
                               : "The idempotency store is not answering; retry later.");
}

/* Answers <r> whose acquire the store refused with <err>, from a pool thread. */
static void acquire_refused(struct req *r, int err)
{
    metrics_store_error();
    set_store_problem(r, err);
    req_finish_later(r);
}

/* ---- --wait: holding duplicates (waitlist.h) ---- */

static struct req *req_of_wait(struct waitlist_entry *e)
{
    return (struct req *)(void *)((char *)e - offsetof(struct req, wait));
}

/* A held duplicate's key was completed or released, or it is time to look:
 * it replays, executes (the first ended without storing), or is held again. */
static void on_wait_retry(void *ctx, struct waitlist_entry *e)
{
    struct req *r = req_of_wait(e);
    int err;

    (void)ctx;
    err = acquire_start(r);
    if (err < 0)
        acquire_refused(r, err);
}

static void on_wait_expired(void *ctx, struct waitlist_entry *e)
{
    struct req *r = req_of_wait(e);

    (void)ctx;
    set_problem(r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
                "A request with this Idempotency-Key is still being processed (waited "
                "--wait); retry later.");
    req_finish(r);
}

/* With --wait, holds <r> (whose key is in flight). Returns false when it is
 * not held: no --wait, its wait is over, or the proxy is stopping. */
static bool wait_hold(struct req *r, uint64_t now)
{
    if (!r->pl->waits)
        return false;
    r->wait.key = r->store_key;
    return waitlist_hold(r->pl->waits, &r->wait, now);
}

static void on_acquired(void *ctx, int err, const struct store_result *res)
{
    struct req *r = ctx;
    struct pipeline *pl = r->pl;
    uint64_t now = now_ms();

    metrics_store_call(METRICS_STORE_ACQUIRE, metrics_now_us() - r->store_sent_us);
    if (err == 0 && res->status == STORE_ACQUIRED) {
        r->lease = lease_start(pl->leases, r->store_key, &r->tok, r->acquire_sent_ms);
        if (!r->lease) {
            set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR, "Out of memory.");
            req_finish(r); /* the lock expires within --lock-ttl */
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
            r->out.outcome = OUTCOME_STORE_ERROR;
            forward(r); /* unprotected, as configured */
            return;
        }
        set_store_problem(r, err);
    }
    req_finish(r);
}

void pipeline_run(struct pipeline *pl, struct req *r, req_done_fn *done, void *ctx)
{
    int err;

    assert(r->pl == pl);
    r->out.running = true;
    r->done = done;
    r->done_ctx = ctx;
    metrics_inflight_add(1);
    if (!r->enforced) {
        forward(r);
        return;
    }
    err = fingerprint_final(&r->fp, r->digest);
    if (err == 0)
        err = acquire_start(r);
    if (err < 0)
        acquire_refused(r, err);
}

/* ---- Lifecycle ---- */

int pipeline_new(const struct config *cfg, struct store *st, struct worker_pool *pool,
                 const struct pipeline_forwarder *fwd, struct pipeline **ret)
{
    struct pipeline *pl = calloc(1, sizeof(*pl));

    if (!pl)
        return -ENOMEM;
    pl->cfg = cfg;
    pl->st = st;
    pl->pool = pool;
    pl->fwd = *fwd;
    if (st && cfg->wait_ms > 0) {
        int err = waitlist_new(pool, cfg->wait_ms, on_wait_retry, on_wait_expired, pl, &pl->waits);

        if (err == 0)
            err = store_set_notify(st, waitlist_notify, pl->waits);
        if (err < 0) {
            pipeline_free(pl);
            return err;
        }
    }
    if (st) {
        int err = leases_new(st, pool, cfg->lock_ttl_ms, &pl->leases);

        if (err < 0) {
            pipeline_free(pl);
            return err;
        }
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

struct req *req_new(struct pipeline *pl)
{
    struct req *r = calloc(1, sizeof(*r));

    if (!r)
        return NULL;
    r->pl = pl;
    r->body = BUF_INIT(pl->cfg->max_body_bytes);
    return r;
}

int req_add_header(struct req *r, struct span name, struct span value)
{
    if (r->in.nheaders == r->in.headers_cap) {
        size_t cap = r->in.headers_cap ? r->in.headers_cap * 2 : 16;
        struct http_header *h = realloc(r->in.headers, cap * sizeof(*h));

        if (!h)
            return -ENOMEM;
        r->in.headers = h;
        r->in.headers_cap = cap;
    }
    r->in.headers[r->in.nheaders++] = (struct http_header){ .name = name, .value = value };
    return 0;
}

void req_free(struct req *r)
{
    if (!r)
        return;
    free(r->in.target_buf);
    free(r->fwd_target_buf);
    free(r->in.headers);
    buf_done(&r->body);
    fingerprint_done(&r->fp);
    free(r->store_key);
    lease_abandon(r->lease); /* freed unfinished: no endless heartbeat */
    record_unref(r->out.answer);
    free(r);
}
