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
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "idemproxy/buf.h"
#include "idemproxy/config.h"
#include "idemproxy/fingerprint.h"
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
#include "idemproxy/store.h"
#include "idemproxy/waitlist.h"
#include "idemproxy/worker.h"

#define TOO_LARGE_DETAIL "The request body is larger than this proxy accepts (--max-body)."

struct pipeline {
    struct store *st;
    struct worker_pool *pool;
    struct waitlist *waits; /* owned: --wait's held duplicates (waitlist.h), NULL without */
    struct leases *leases;  /* owned: held locks and their heartbeat (lease.h) */
    struct pipeline_forwarder fwd;
    pthread_mutex_t routes_mu;  /* guards <routes> while a request takes its reference */
    struct route_table *routes; /* owned reference: what new requests are matched against */
    uint64_t min_lock_ttl_ms;   /* the heartbeat was set up for locks this short */
    const char *key_prefix;     /* --key-prefix, borrowed from the configuration */
    bool enabled;               /* IDEMPOTENCY_ENABLED */
    atomic_uint late;           /* exchanges going on after their client got its 504 */
};

/* A request as the pipeline knows it: what the front end sees (<req>), and
 * the pipeline's own state, which the front end never sees. */
struct pipeline_req {
    struct request *rq; /* owned: what the front end read */
    struct pipeline_answer out; /* the answer, until it is handed over */
    bool decided;               /* the answer was handed over */
    struct pipeline *pl;
    /* The front end's reference, and a late exchange's (SPEC §9): the last
     * one frees it. */
    atomic_int refs;
    bool late;                  /* answered 504 at --upstream-timeout; its exchange goes on */
    char *late_method;          /* owned: the method, once late (the front end's copy may go) */
    const char *unknown;        /* the cause, once this request made its key unknown */
    struct route_table *routes; /* reference: the table <route> belongs to */
    const struct route *route;  /* its route, and the settings it runs under (route->settings) */
    struct buf body;            /* owned, limited by the route's max-body */
    bool enforced;              /* the idempotency rules apply (a key was given, or may be) */
    bool key_deferred;          /* the key comes from the body: decided by pipeline_end() */
    struct keysource_key key;   /* its key, once read (owns what it derived) */
    /* What is forwarded and fingerprinted: the target in origin-form (or "*"),
     * borrowing <rq->target_buf> or <fwd_target_buf>, and the Host an
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
    pipeline_answer_fn *answer;
    void *answer_ctx;
};

static void acquire(struct pipeline_req *r);
static void forward(struct pipeline_req *r);

/* ---- Reading the request ---- */

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
static uint64_t request_ttl_ms(const struct pipeline_req *r)
{
    const struct route_settings *rs = &r->route->settings;
    const struct span *v;
    uint64_t s;

    if (!rs->ttl_header || !rs->ttl_header[0])
        return rs->ttl_ms;
    v = request_header(r->rq, span_from_cstr(rs->ttl_header), NULL);
    if (!v || parse_uint(*v, &s) < 0 || s == 0)
        return rs->ttl_ms;
    if (s > rs->max_ttl_ms / 1000)
        return rs->max_ttl_ms;
    return s * 1000;
}

/* Builds <prefix><scope>:<key> (idemkey.h), the scope hashing the
 * --scope-header values in order (several instances of one header count as
 * their comma-joined list), then the tag of <domain> for a derived key. */
static int build_store_key(struct pipeline_req *r)
{
    const struct route_settings *rs = &r->route->settings;
    const struct request *in = r->rq;
    struct span values[CONFIG_MAX_LIST + 1];
    size_t nvalues = rs->nscope_headers;
    struct buf joined[CONFIG_MAX_LIST];
    char scope[IDEMKEY_SCOPE_HEX + 1];
    int err = 0;

    for (size_t i = 0; i < rs->nscope_headers; i++) {
        struct span name = span_from_cstr(rs->scope_headers[i]);
        const struct span *first;
        size_t n;

        joined[i] = BUF_INIT(SIZE_MAX);
        values[i] = (struct span){ NULL, 0 };
        first = request_header(r->rq, name, &n);
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
    values[nvalues] = keysource_tag(&r->route->key, &r->key);
    if (values[nvalues].base)
        nvalues++;
    if (err == 0)
        err = idemkey_scope(values, nvalues, scope);
    if (err == 0)
        err = idemkey_store_key(span_from_cstr(r->pl->key_prefix), scope, r->key.key, &r->store_key);
    for (size_t i = 0; i < rs->nscope_headers; i++)
        buf_done(&joined[i]);
    return err;
}

/* ---- Answering ---- */

static void set_answer(struct pipeline_req *r, struct record *rec, enum outcome o, const char *replayed)
{
    record_unref(r->out.rec);
    r->out.rec = rec;
    r->out.outcome = o;
    r->out.replayed = replayed;
    r->out.replay_header = r->route->settings.replay_header;
}

/* Sets a problem answer. A record that cannot be built (OOM) leaves no answer:
 * the front end then drops the connection. */
static void set_problem(struct pipeline_req *r, enum problem p, enum outcome o, const char *detail)
{
    set_answer(r, problem_new(p, r->route->errors, detail), o, NULL);
}

/* Counts <r> in the metrics and writes its access line. */
static void account(struct pipeline *pl, struct pipeline_req *r)
{
    const struct route *rt = r->route;
    uint64_t total_us = metrics_now_us() - r->start_us;
    /* the key as sent, or the one derived (which /keys finds) */
    struct span key = r->key.sent.base ? r->key.sent : keysource_sent(&rt->key, r->rq);

    (void)pl;
    metrics_request(rt->metrics_id, r->out.outcome, total_us, r->forwarded, r->upstream_us);
    if (!log_enabled(LOG_LEVEL_INFO))
        return;
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
        .bytes = r->out.rec ? r->out.rec->body.len : 0,
        .unknown = r->unknown,
    });
}

/* Hands <r> back to the front end with its answer, counted and logged first:
 * the client may read /metrics as soon as it has the answer. The one exit. */
static void finish(struct pipeline_req *r)
{
    struct pipeline_answer a = r->out;

    assert(!r->decided);
    account(r->pl, r);
    if (r->running)
        metrics_inflight_add(-1);
    r->decided = true;
    r->out.rec = NULL; /* the front end's reference now */
    r->answer(r->answer_ctx, &a);
}

/* ---- 1. The head: HTTP-level checks, then the key ---- */

/* Refuses <r> with a bad_request answer: <status> 400 or 501, <why> in the
 * problem's detail and in the log (the client's bytes escaped there). */
static int refuse_bad_request(struct pipeline_req *r, unsigned status, const char *why)
{
    const struct request *in = r->rq;
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
static int check_head(struct pipeline_req *r)
{
    const struct request *in = r->rq;
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

/* Answers 503 for a request the proxy has no memory for. Returns 1. */
static int oom(struct pipeline_req *r)
{
    set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                "Out of memory while reading the request.");
    return 1;
}

/* Starts hashing the request: its key will be checked against it. */
static int start_fingerprint(struct pipeline_req *r)
{
    if (fingerprint_init(&r->fp, r->rq->method, r->fwd_target) < 0)
        return oom(r);
    r->enforced = true;
    r->ttl_ms = request_ttl_ms(r);
    return 0;
}

/* <r> runs under the idempotency key <key> from <domain>. Returns 0, or 1
 * with an answer set. */
static int keyed(struct pipeline_req *r)
{
    if (build_store_key(r) < 0)
        return oom(r);
    return r->enforced ? 0 : start_fingerprint(r);
}

/* No key: the fingerprint stands for one (fallback), a 400 (require-key),
 * or passthrough. Returns 0 to go on, 1 with an answer set. */
static int no_key(struct pipeline_req *r)
{
    const struct route *rt = r->route;
    char detail[512];

    if (rt->key.fallback) {
        r->key_deferred = true; /* keyed by its fingerprint once the body is in */
        return r->enforced ? 0 : start_fingerprint(r);
    }
    if (rt->settings.require_key) {
        keysource_describe(&rt->key, detail, sizeof(detail));
        set_problem(r, PROBLEM_KEY_MISSING, OUTCOME_MISSING_KEY, detail);
        return 1;
    }
    r->enforced = false; /* passthrough, unprotected */
    return 0;
}

/* What the key source found (<found>, an enum keysource_found or -ENOMEM),
 * <detail> saying why an invalid key is one. Returns 0 to go on, 1 with an
 * answer set. */
static int on_key(struct pipeline_req *r, int found, const char *detail)
{
    switch (found) {
    case KEYSOURCE_FOUND:
        return keyed(r);
    case KEYSOURCE_MISSING:
        return no_key(r);
    case KEYSOURCE_INVALID:
        set_problem(r, PROBLEM_KEY_INVALID, OUTCOME_INVALID_KEY, detail);
        return 1;
    case KEYSOURCE_IN_BODY:
        r->key_deferred = true;
        return start_fingerprint(r);
    default:
        return oom(r);
    }
}

/* Reads the key from the headers, as the route's key source says; a key in
 * the body is left for pipeline_end(). Returns 0 to go on, 1 with an answer. */
static int read_key(struct pipeline_req *r)
{
    char detail[512];
    int found = keysource_read(&r->route->key, r->rq, &r->key, detail, sizeof(detail));

    return on_key(r, found, detail);
}

/* The path a route is matched on: the target up to its query. */
static struct span target_path(struct span target)
{
    const char *q = target.base ? memchr(target.base, '?', target.len) : NULL;

    if (q)
        target.len = (size_t)(q - target.base);
    return target;
}

/* Matches <r> to its route, by <target>, and the Host of <host> (base NULL:
 * the client's Host header). */
static void route_request(struct pipeline_req *r, struct span target, struct span host)
{
    const struct span *h = NULL;

    if (!host.base && (h = request_header(r->rq, SPAN_LIT("Host"), NULL)))
        host = *h;
    r->route = route_match(r->routes, r->rq->method, target_path(target), host);
    r->body.limit = r->route->settings.max_body_bytes;
}

/* Routes the request, decides passthrough or enforcement and reads the key.
 * Returns 0 to go on with the body, 1 with an answer set. */
static int begin(struct pipeline *pl, struct pipeline_req *r)
{
    const struct route_settings *rs;
    const struct span *v;
    uint64_t announced;

    pthread_mutex_lock(&pl->routes_mu);
    r->routes = route_table_ref(pl->routes);
    pthread_mutex_unlock(&pl->routes_mu);
    /* A first match on the target as sent, so that even a malformed request
     * is answered in its route's dialect and counted under its route. */
    route_request(r, r->rq->target, (struct span){ NULL, 0 });
    r->out.outcome = OUTCOME_PASSTHROUGH;
    if (check_head(r))
        return 1;
    if (r->fwd_target.base != r->rq->target.base || r->fwd_host.base)
        route_request(r, r->fwd_target, r->fwd_host); /* an absolute-form target */
    rs = &r->route->settings;
    if (pl->enabled && r->route->enforce && config_is_enforced(rs, r->rq->method) &&
        read_key(r))
        return 1;
    v = request_header(r->rq, SPAN_LIT("Content-Length"), NULL);
    if (v && parse_uint(*v, &announced) == 0 && announced > rs->max_body_bytes) {
        set_problem(r, PROBLEM_PAYLOAD_TOO_LARGE, OUTCOME_TOO_LARGE, TOO_LARGE_DETAIL);
        return 1;
    }
    return 0;
}

struct pipeline_req *pipeline_begin(struct pipeline *pl, struct request *rq,
                                    pipeline_answer_fn *answer, void *ctx)
{
    struct pipeline_req *r = calloc(1, sizeof(*r));

    if (!r) {
        request_free(rq);
        return NULL;
    }
    r->pl = pl;
    r->rq = rq;
    atomic_init(&r->refs, 1);
    r->body = BUF_INIT(0); /* its limit is its route's max-body (route_request()) */
    r->answer = answer;
    r->answer_ctx = ctx;
    r->start_us = metrics_now_us();
    if (begin(pl, r))
        finish(r);
    return r;
}

/* ---- 2. The body ---- */

void pipeline_body(struct pipeline_req *r, const char *p, size_t n)
{
    int err;

    if (r->decided)
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

/* The key of a route whose key is in the body (json), or of a request keyed
 * by its fingerprint (fallback), now that the body is in. Returns 0 to go
 * on (<r>->enforced false: passthrough), 1 with an answer set. */
static int body_key(struct pipeline_req *r)
{
    const struct keysource *ks = &r->route->key;
    char detail[512];
    int found = KEYSOURCE_MISSING;

    r->key_deferred = false;
    if (!r->key.key.base)
        found = keysource_read_body(ks, buf_span(&r->body), &r->key, detail, sizeof(detail));
    if (found == KEYSOURCE_MISSING && ks->fallback)
        found = keysource_fingerprint(r->digest, FINGERPRINT_LEN, &r->key);
    if (found == KEYSOURCE_MISSING)
        r->enforced = false; /* for no_key(): nothing is hashed any more */
    return on_key(r, found, detail);
}

void pipeline_end(struct pipeline_req *r)
{
    if (r->decided)
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
    if (r->key_deferred && body_key(r)) {
        finish(r);
        return;
    }
    if (!r->enforced) {
        forward(r); /* no key in the body, none required: passthrough */
        return;
    }
    acquire(r);
}

/* The 503 of a store that failed with <err>. */
static void set_store_problem(struct pipeline_req *r, int err)
{
    set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR,
                err == -ENOSPC ? "The idempotency store is full of requests in flight; retry later."
                               : "The idempotency store is not answering; retry later.");
}

static void on_acquired(void *ctx, int err, const struct store_result *res);

/* Asks the store for the lock of <r>, under a new token; a store that refuses
 * the call at once answers 503. */
static void acquire(struct pipeline_req *r)
{
    struct pipeline *pl = r->pl;
    int err = store_token_new(&r->tok);

    r->acquire_sent_ms = now_ms();
    r->store_sent_us = metrics_now_us();
    if (err == 0)
        err = store_acquire(pl->st, span_from_cstr(r->store_key), r->digest, &r->tok,
                            &(struct store_lock){
                                .lease_ms = r->route->settings.lock_ttl_ms,
                                .keep_ms = r->ttl_ms,
                                .take_over = r->route->settings.on_unknown == CONFIG_ON_UNKNOWN_RETRY,
                                .about = { .route = span_from_cstr(r->route->name),
                                           .method = r->rq->method,
                                           .target = r->fwd_target },
                            },
                            on_acquired, r);
    if (err < 0) {
        metrics_store_error();
        set_store_problem(r, err);
        finish(r);
    }
}

static bool wait_hold(struct pipeline_req *r, uint64_t now);
static void on_confirmed(void *ctx, int err);
static void lease_end(struct pipeline_req *r, struct record *rec);

/* Counts and logs that <r> made its key's outcome unknown for <cause>. */
static void became_unknown(struct pipeline_req *r, enum store_cause cause)
{
    const struct request *in = r->rq;

    r->unknown = store_cause_name(cause);
    metrics_unknown_outcome(r->route->metrics_id, cause);
    log_warn("key %s: outcome unknown (%s): %.*s %.*s of route %s may have run upstream and its "
             "answer was lost; duplicates get 502 idempotency_outcome_unknown until an operator "
             "resolves it (/keys)",
             r->store_key, r->unknown, (int)(in->method.len < 64 ? in->method.len : 64),
             in->method.base, (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base,
             r->route->name);
}

/* The answer to a request whose key's outcome is unknown (SPEC §9). */
static void answer_unknown(struct pipeline_req *r, const struct store_result *res)
{
    if (res->became)
        became_unknown(r, res->cause);
    set_problem(r, PROBLEM_OUTCOME_UNKNOWN, OUTCOME_UNKNOWN,
                "The original request with this Idempotency-Key may have been processed, but its "
                "answer was lost; do not retry with this key. Check whether it took effect; an "
                "operator can then resolve the key.");
}

static void on_acquired(void *ctx, int err, const struct store_result *res)
{
    struct pipeline_req *r = ctx;
    struct pipeline *pl = r->pl;
    const struct route_settings *rs = &r->route->settings;
    uint64_t now = now_ms();

    metrics_store_call(METRICS_STORE_ACQUIRE, metrics_now_us() - r->store_sent_us);
    if (err == 0 && res->status == STORE_ACQUIRED) {
        r->lease =
            lease_start(pl->leases, r->store_key, &r->tok, r->acquire_sent_ms, rs->lock_ttl_ms);
        if (!r->lease) {
            set_problem(r, PROBLEM_STORE_UNAVAILABLE, OUTCOME_STORE_ERROR, "Out of memory.");
            finish(r); /* the lock expires within --lock-ttl */
            return;
        }
        /* A holder that stalled past half its lock TTL confirms the lock first. */
        if (now - r->acquire_sent_ms > rs->lock_ttl_ms / 2) {
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
    } else if (err == 0 && res->status == STORE_UNKNOWN) {
        answer_unknown(r, res);
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
        if (r->routes->on_store_error == CONFIG_ON_STORE_ERROR_PASSTHROUGH) {
            r->out.outcome = OUTCOME_STORE_ERROR;
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
    struct pipeline_req *r = ctx;

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
    /* Not forwarded: given back, or its lapsed lease would look like a lost
     * holder's. Stale, the key may have been found unknown with this token
     * (SPEC §9): nothing ran, so that is given back too; another holder's
     * lock is left alone (the release is fenced). */
    lease_end(r, NULL);
}

/* ---- 4. --wait: a duplicate held until the first request ends ---- */

/* With --wait, holds <r> (whose key is in flight). Returns false when it is
 * not held: no --wait, its wait is over, or the proxy is stopping. */
static bool wait_hold(struct pipeline_req *r, uint64_t now)
{
    if (!r->pl->waits || r->route->settings.wait_ms == 0)
        return false;
    r->wait.key = r->store_key;
    if (r->wait.until_ms == 0)
        r->wait.until_ms = now + r->route->settings.wait_ms; /* the route's, not the list's */
    return waitlist_hold(r->pl->waits, &r->wait, now);
}

static struct pipeline_req *preq_of_wait(struct waitlist_entry *e)
{
    return (struct pipeline_req *)(void *)((char *)e - offsetof(struct pipeline_req, wait));
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
    struct pipeline_req *r = preq_of_wait(e);

    (void)ctx;
    set_problem(r, PROBLEM_KEY_IN_USE, OUTCOME_IN_FLIGHT,
                "A request with this Idempotency-Key is still being processed (waited "
                "--wait); retry later.");
    finish(r);
}

/* ---- 5. Forwarding ---- */

static void on_upstream(void *ctx, int err, struct record *rec);
static void on_overdue(void *ctx);

static void forward(struct pipeline_req *r)
{
    const struct request *in = r->rq;
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
        .overdue = r->lease ? on_overdue : NULL, /* a keyed request's answer may come late */
    };
    r->upstream_sent_us = metrics_now_us();
    err = r->pl->fwd.submit(r->pl->fwd.ctx, in->loop, &r->up_req, on_upstream, r);
    if (err < 0)
        on_upstream(r, err, NULL);
}

/* ---- 6. The upstream's answer: stored, or the lock released ---- */

static void preq_unref(struct pipeline_req *r);

/* The finishing chain's first attempt has reported back: <r> is answered,
 * or, when its client got a 504 already, its late exchange is over. */
static void on_lease_finished(void *ctx)
{
    struct pipeline_req *r = ctx;

    if (!r->late) {
        finish(r);
        return;
    }
    atomic_fetch_sub_explicit(&r->pl->late, 1, memory_order_release);
    preq_unref(r);
}

/* Completes the lock of <r> with <rec> (a reference the lease takes over), or
 * releases it when <rec> is NULL; <r> is answered once the first attempt
 * has reported back (store failures are retried without it: lease.h). */
static void lease_end(struct pipeline_req *r, struct record *rec)
{
    struct lease *l = r->lease;

    r->lease = NULL; /* the request's reference now belongs to the finishing chain */
    lease_finish(l, rec, r->ttl_ms, on_lease_finished, r);
}

/* The request of <r> may have run upstream and its answer is lost, for
 * <cause>: the key becomes unknown (refuse), or is released to run again
 * (retry). */
static void lease_end_unknown(struct pipeline_req *r, enum store_cause cause)
{
    const struct route_settings *rs = &r->route->settings;
    struct lease *l = r->lease;

    if (rs->on_unknown == CONFIG_ON_UNKNOWN_RETRY) {
        lease_end(r, NULL);
        return;
    }
    became_unknown(r, cause);
    r->lease = NULL;
    lease_finish_unknown(l, cause,
                         &(struct store_about){ .route = span_from_cstr(r->route->name),
                                                .method = r->rq->method,
                                                .target = r->fwd_target },
                         r->ttl_ms, on_lease_finished, r);
}

static bool is_cacheable(const struct route_settings *rs, unsigned status)
{
    return status < ARRAY_SIZE(rs->no_cache) && !rs->no_cache[status];
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

/* --upstream-timeout passed while a keyed request's exchange goes on (for
 * --upstream-late-timeout): its client gets its 504 now, and the exchange,
 * under the same heartbeat-held lock, may still store a late answer. On the
 * loop thread, as on_upstream(). */
static void on_overdue(void *ctx)
{
    struct pipeline_req *r = ctx;
    const struct request *in = r->rq;

    r->forwarded = true;
    r->upstream_us = metrics_now_us() - r->upstream_sent_us;
    log_info("upstream %.*s %.*s: no answer within --upstream-timeout; answered 504, the exchange "
             "goes on for --upstream-late-timeout",
             (int)in->method.len, in->method.base,
             (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base);
    set_problem(r, PROBLEM_UPSTREAM_TIMEOUT, OUTCOME_UPSTREAM_ERROR, NULL);
    /* The method is the front end's memory, which goes with the client. */
    r->late_method = strndup(in->method.base, in->method.len);
    r->rq->method = span_from_cstr(r->late_method ? r->late_method : "");
    r->late = true;
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->pl->late, 1, memory_order_relaxed);
    finish(r);
}

/* The end of a late exchange: its client has its 504 (and may be gone, with
 * the front end's part of <r>): the lock is completed, released or made
 * unknown, and nothing is answered. */
static void late_end(struct pipeline_req *r, int err, struct record *rec)
{
    const struct route_settings *rs = &r->route->settings;

    log_info("key %s: the late exchange ended: %s", r->store_key,
             err == 0            ? "an answer"
             : err == -ETIMEDOUT ? "no answer within --upstream-late-timeout either"
                                 : strerror(-err));
    if (err == -E2BIG) {
        lease_end(r, too_large_marker(502)); /* it did answer */
    } else if (err < 0 && upstream_err_maybe_sent(err)) {
        lease_end_unknown(r, err == -ECONNRESET ? STORE_CAUSE_UPSTREAM_RESET
                                                : STORE_CAUSE_UPSTREAM_TIMEOUT);
    } else if (err < 0 || !is_cacheable(rs, rec->status)) {
        lease_end(r, NULL);
    } else {
        record_ensure_date(rec);
        if (rec->body.len > rs->max_response_bytes)
            lease_end(r, too_large_marker(rec->status));
        else
            lease_end(r, record_ref(rec));
    }
    record_unref(rec);
}

static void on_upstream(void *ctx, int err, struct record *rec)
{
    struct pipeline_req *r = ctx;
    const struct request *in = r->rq;
    const struct route_settings *rs = &r->route->settings;

    if (r->late) {
        late_end(r, err, rec);
        return;
    }
    r->forwarded = true;
    r->upstream_us = metrics_now_us() - r->upstream_sent_us;
    if (err < 0) {
        enum problem p = err == -ETIMEDOUT || err == -ENOTCONN ? PROBLEM_UPSTREAM_TIMEOUT
                         : err == -E2BIG                       ? PROBLEM_RESPONSE_TOO_LARGE
                                                               : PROBLEM_UPSTREAM_UNAVAILABLE;

        log_warn("upstream %.*s %.*s failed: %s%s", (int)in->method.len, in->method.base,
                 (int)(in->target.len < 1024 ? in->target.len : 1024), in->target.base,
                 err == -E2BIG ? "response larger than the proxy can hold" : strerror(-err),
                 upstream_err_maybe_sent(err) ? " (after the request may have reached it)" : "");
        set_problem(r, p, OUTCOME_UPSTREAM_ERROR, NULL);
        if (!r->lease) {
            finish(r);
            return;
        }
        if (err == -E2BIG) {
            /* The upstream did answer: it must never run twice. */
            r->out.replayed = "false";
            lease_end(r, too_large_marker(502));
            return;
        }
        if (upstream_err_maybe_sent(err)) {
            lease_end_unknown(r, err == -ETIMEDOUT ? STORE_CAUSE_UPSTREAM_TIMEOUT
                                                   : STORE_CAUSE_UPSTREAM_RESET);
            return;
        }
        lease_end(r, NULL); /* nothing reached the upstream: a retry may run */
        return;
    }
    if (!r->lease) {
        set_answer(r, rec, r->out.outcome, NULL); /* passthrough, or store_error */
        finish(r);
        return;
    }
    set_answer(r, rec, OUTCOME_EXECUTED, "false");
    if (!is_cacheable(rs, rec->status)) {
        lease_end(r, NULL);
        return;
    }
    record_ensure_date(rec);
    if (rec->body.len > rs->max_response_bytes) {
        lease_end(r, too_large_marker(rec->status)); /* a NULL marker (OOM) releases instead */
        return;
    }
    lease_end(r, record_ref(rec));
}

/* ---- Lifecycle ---- */

int pipeline_new(const struct config *cfg, struct route_table *t, struct store *st,
                 struct worker_pool *pool, const struct pipeline_forwarder *fwd,
                 struct pipeline **ret)
{
    struct pipeline *pl = calloc(1, sizeof(*pl));
    uint64_t wait_ms = 0;
    int err = 0;

    if (!pl)
        return -ENOMEM;
    pthread_mutex_init(&pl->routes_mu, NULL);
    pl->routes = route_table_ref(t);
    pl->key_prefix = cfg->key_prefix;
    pl->enabled = cfg->enabled;
    pl->st = st;
    pl->pool = pool;
    pl->fwd = *fwd;
    pl->min_lock_ttl_ms = cfg->route.lock_ttl_ms;
    for (size_t i = 0; i <= t->nroutes; i++) {
        if (t->routes[i].settings.wait_ms > wait_ms)
            wait_ms = t->routes[i].settings.wait_ms;
        if (t->routes[i].settings.lock_ttl_ms < pl->min_lock_ttl_ms)
            pl->min_lock_ttl_ms = t->routes[i].settings.lock_ttl_ms;
    }
    /* The --wait subscriber only when a route waits (an ACL may forbid it). */
    if (st && wait_ms > 0) {
        err = waitlist_new(pool, wait_ms, on_wait_retry, on_wait_expired, pl, &pl->waits);
        if (err == 0)
            err = store_set_notify(st, waitlist_notify, pl->waits);
    }
    if (st && err == 0)
        err = leases_new(st, pool, pl->min_lock_ttl_ms, &pl->leases);
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

unsigned pipeline_late(struct pipeline *pl)
{
    return pl ? atomic_load_explicit(&pl->late, memory_order_acquire) : 0;
}

void pipeline_free(struct pipeline *pl)
{
    if (!pl)
        return;
    leases_free(pl->leases);
    waitlist_free(pl->waits);
    route_table_unref(pl->routes);
    pthread_mutex_destroy(&pl->routes_mu);
    free(pl);
}

int pipeline_set_routes(struct pipeline *pl, struct route_table *t, char *why, size_t whylen)
{
    struct route_table *old;
    size_t used = 0;

    why[0] = '\0';
    for (size_t i = 0; i <= t->nroutes && used < whylen; i++) {
        const struct route *rt = &t->routes[i];
        const char *sep = used ? "\n" : "";

        if (rt->settings.wait_ms > 0 && !pl->waits && pl->st)
            used += (size_t)snprintf(why + used, whylen - used,
                                     "%sroute %s: wait needs a restart (no route waited at start, "
                                     "so the notifications of --wait are not subscribed to); it "
                                     "answers 409 at once until then",
                                     sep, rt->name);
        else if (rt->settings.lock_ttl_ms < pl->min_lock_ttl_ms)
            used += (size_t)snprintf(why + used, whylen - used,
                                     "%sroute %s: a lock-ttl shorter than at start (%llu ms) needs "
                                     "a restart for the heartbeat to keep up; the lock may lapse "
                                     "under a long request until then",
                                     sep, rt->name, (unsigned long long)pl->min_lock_ttl_ms);
    }
    pthread_mutex_lock(&pl->routes_mu);
    old = pl->routes;
    pl->routes = route_table_ref(t);
    pthread_mutex_unlock(&pl->routes_mu);
    route_table_unref(old); /* the requests that began under it keep their own references */
    return why[0] ? 1 : 0;
}

/* ---- The front end's reference ---- */

void pipeline_req_free(struct pipeline_req *r)
{
    if (r)
        preq_unref(r);
}

/* Drops a reference to <r>: the front end's (pipeline_req_free()) or its late
 * exchange's; the last frees it. A late exchange reads none of the front
 * end's memory (the header spans) once its client was answered. */
static void preq_unref(struct pipeline_req *r)
{
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    request_free(r->rq);
    free(r->late_method);
    free(r->fwd_target_buf);
    buf_done(&r->body);
    fingerprint_done(&r->fp);
    free(r->store_key);
    lease_abandon(r->lease); /* freed unfinished: no endless heartbeat */
    record_unref(r->out.rec);
    keysource_key_done(&r->key);
    route_table_unref(r->routes);
    free(r);
}
