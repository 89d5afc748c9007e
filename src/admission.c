/* SPDX-License-Identifier: MIT */
/* Admission, in the order a request comes in: its route (first on the
 * target as sent, so that even a malformed request is answered in its
 * route's dialect), the HTTP-level checks, the key from its head, the body
 * and its hash, then a key that only the body gives. */
#include "idemproxy/admission.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idemproxy/canonjson.h"
#include "idemproxy/config.h"
#include "idemproxy/fingerprint.h"
#include "idemproxy/http.h"
#include "idemproxy/idemkey.h"
#include "idemproxy/request.h"
#include "idemproxy/route.h"
#include "idemproxy/scope.h"

#define TOO_LARGE_DETAIL "The request body is larger than this proxy accepts (--max-body)."

static int refuse(struct admission_refusal *ret, enum problem p, enum outcome o, const char *detail)
{
    ret->problem = p;
    ret->outcome = o;
    snprintf(ret->detail, sizeof(ret->detail), "%s", detail ? detail : "");
    ret->why = NULL;
    return 1;
}

/* Refuses a request the proxy has no memory for: its own failure, not the
 * store's (a 503 that a retry may get past). Returns 1. */
static int oom(struct admission_refusal *ret)
{
    return refuse(ret, PROBLEM_INTERNAL, OUTCOME_INTERNAL_ERROR,
                  "Out of memory while reading the request.");
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
 * integer (capped at --max-ttl, raised to --min-ttl), else --ttl. */
static uint64_t request_ttl_ms(const struct admission *a, const struct request *rq)
{
    const struct route_settings *rs = &a->route->settings;
    const struct span *v;
    uint64_t s;

    if (!rs->ttl_header || !rs->ttl_header[0])
        return rs->ttl_ms;
    v = request_header(rq, span_from_cstr(rs->ttl_header), NULL);
    if (!v || parse_uint(*v, &s) < 0 || s == 0)
        return rs->ttl_ms;
    if (s > rs->max_ttl_ms / 1000)
        return rs->max_ttl_ms;
    return s * 1000 < rs->min_ttl_ms ? rs->min_ttl_ms : s * 1000;
}

/* The value of scope header <name> of <rq>: its one instance, or several
 * joined with commas into <joined> (as one list). Returns 0 or -ENOMEM. */
static int scope_value(const struct request *rq, struct span name, struct buf *joined,
                       struct span *ret)
{
    const struct span *first;
    size_t n;
    int err = 0;

    *ret = (struct span){ NULL, 0 };
    first = request_header(rq, name, &n);
    if (n <= 1) {
        if (first)
            *ret = *first;
        return 0;
    }
    for (size_t h = 0; h < rq->nheaders && err == 0; h++) {
        if (!span_eq_nocase(rq->headers[h].name, name))
            continue;
        if (joined->len)
            err = buf_append(joined, ",", 1);
        if (err == 0)
            err = buf_append(joined, rq->headers[h].value.base, rq->headers[h].value.len);
    }
    *ret = buf_span(joined);
    if (!ret->base)
        ret->base = ""; /* present, though empty */
    return err;
}

/* What the client is told of a token that does not verify (never the
 * token), by enum scope_failure. */
static const char *const unverified_detail[SCOPE_FAILURE_MAX] = {
    [SCOPE_FAILURE_MISSING] = "no bearer token was given",
    [SCOPE_FAILURE_MALFORMED] = "it is not one bearer token in JWS compact form",
    [SCOPE_FAILURE_SIGNATURE] = "its signature does not verify",
    [SCOPE_FAILURE_ALGORITHM] = "its algorithm (alg) is not one its key is for",
    [SCOPE_FAILURE_UNKNOWN_KID] = "its key id (kid) is not among the keys",
    [SCOPE_FAILURE_EXPIRED] = "it has expired or is not valid yet (exp, nbf)",
    [SCOPE_FAILURE_CLAIMS] = "its issuer, audience or a required claim does not match",
    [SCOPE_FAILURE_KEYS_UNAVAILABLE] = "the keys to verify it with cannot be fetched now",
};

/* A keyed request whose principal is refused for <f> (doc/configuration.md,
 * Scope): 401, or (on-unverified: passthrough, for a token) forwarded
 * unprotected. Returns 1 with the refusal, or 0 with <a> passthrough. */
static int refuse_scope(struct admission *a, enum scope_failure f, struct admission_refusal *ret)
{
    const struct route_settings *rs = &a->route->settings;
    char detail[256];

    a->scope_failure = (int)f + 1;
    if (f == SCOPE_FAILURE_MISSING)
        return refuse(ret, PROBLEM_SCOPE_MISSING, OUTCOME_SCOPE_REFUSED,
                      "This route needs a credential to scope the Idempotency-Key "
                      "(require-scope): none was given.");
    if (rs->on_unverified == CONFIG_ON_UNVERIFIED_PASSTHROUGH) {
        a->enforced = false; /* forwarded unprotected: no key, no lock */
        return 0;
    }
    snprintf(detail, sizeof(detail), "The bearer token that scopes the Idempotency-Key: %s.",
             unverified_detail[f]);
    return refuse(ret, PROBLEM_SCOPE_UNVERIFIED, OUTCOME_SCOPE_REFUSED, detail);
}

/* The scope values of <rq>: its --scope-header values in order (into
 * <joined>, <values>), and whether any was present. Returns 0 or -ENOMEM. */
static int header_values(const struct route_settings *rs, const struct request *rq,
                         struct buf *joined, struct span *values, bool *present)
{
    int err = 0;

    *present = false;
    for (size_t i = 0; i < rs->nscope_headers; i++) {
        joined[i] = BUF_INIT(SIZE_MAX);
        if (err == 0)
            err = scope_value(rq, span_from_cstr(rs->scope_headers[i]), &joined[i], &values[i]);
        *present |= err == 0 && values[i].base != NULL;
    }
    return err;
}

/* Builds <prefix><scope>:<key> (idemkey.h), the scope hashing the
 * principal (the --scope-header values in order, or the route's scope's),
 * then the key source's domain tag. Returns 0 (no store key: passthrough,
 * for a token on-unverified lets through), 1 with the refusal, or -ENOMEM. */
static int build_store_key(struct admission *a, const struct request *rq,
                           struct admission_refusal *ret)
{
    const struct route *rt = a->route;
    struct scope_principal p = { .n = 0 };
    struct buf joined[CONFIG_MAX_LIST];
    struct span *values = p.values;
    char scope[IDEMKEY_SCOPE_HEX + 1];
    size_t nvalues = rt->scope ? 0 : rt->settings.nscope_headers;
    enum scope_failure f = SCOPE_FAILURE_MISSING;
    bool present = false;
    int err;

    if (rt->scope) {
        err = scope_eval(rt->scope, rq, (uint64_t)time(NULL), &p, &f);
        nvalues = p.n;
        present = a->principal = p.n > 0;
    } else {
        err = header_values(&rt->settings, rq, joined, values, &present);
    }
    if (err == 0 && !present && rt->settings.require_scope)
        err = 1;
    if (err == 0) {
        values[nvalues] = keysource_tag(&rt->key, &a->key);
        nvalues += values[nvalues].base != NULL;
        err = idemkey_scope(values, nvalues, scope);
    }
    if (err == 0)
        err = idemkey_store_key(span_from_cstr(a->key_prefix), scope, a->key.key, &a->store_key);
    for (size_t i = 0; !rt->scope && i < rt->settings.nscope_headers; i++)
        buf_done(&joined[i]);
    scope_principal_done(&p);
    if (err == 1 && f == SCOPE_FAILURE_UNKNOWN_KID && !a->scope_waited &&
        scope_can_wait(rt->scope)) {
        a->scope_wait = true; /* the refetch it asked for may bring its key */
        return 0;
    }
    return err == 1 ? refuse_scope(a, f, ret) : err;
}

/* ---- the head ---- */

/* Refuses a malformed request: <status> 400 or 501, <why> in the problem's
 * detail (and, through the refusal, in the log). */
static int refuse_bad_request(struct admission_refusal *ret, unsigned status, const char *why)
{
    char detail[256];

    snprintf(detail, sizeof(detail), "The request is malformed: %s.", why);
    refuse(ret, status == 501 ? PROBLEM_NOT_IMPLEMENTED : PROBLEM_BAD_REQUEST, OUTCOME_BAD_REQUEST,
           detail);
    ret->why = why;
    ret->status = status;
    return 1;
}

/* The HTTP-level checks of doc/guarantees.md (Threat model): nothing malformed
 * is forwarded, locked or keyed. Sets what is forwarded. Returns 0, or 1 with
 * the refusal. */
static int check_head(struct admission *a, const struct request *rq, struct admission_refusal *ret)
{
    struct http_target t;
    const char *why;
    unsigned status = 400;

    if (rq->head_error)
        return refuse_bad_request(ret, 400, rq->head_error);
    why = http_check_request_line(rq->method, rq->target, &t, &status);
    if (!why)
        why = http_check_fields(rq->headers, rq->nheaders, rq->http11, &status);
    if (why)
        return refuse_bad_request(ret, status, why);
    a->fwd_target = t.path;
    if (t.form != HTTP_TARGET_ABSOLUTE)
        return 0;
    a->fwd_host = t.authority;
    if (t.needs_slash) {
        a->fwd_target_buf = malloc(t.path.len + 2);
        if (!a->fwd_target_buf)
            return oom(ret);
        a->fwd_target_buf[0] = '/';
        memcpy(a->fwd_target_buf + 1, t.path.base, t.path.len);
        a->fwd_target_buf[t.path.len + 1] = '\0';
        a->fwd_target = (struct span){ .base = a->fwd_target_buf, .len = t.path.len + 1 };
    }
    return 0;
}

/* Starts hashing the request, as its route says (the target's query sorted,
 * the named headers): its key will be checked against it. */
static int start_fingerprint(struct admission *a, const struct request *rq,
                             struct admission_refusal *ret)
{
    const struct route_fingerprint *f = &a->route->fingerprint;
    struct span target = a->fwd_target;
    char *sorted = NULL;
    int err = 0;

    if (f->query_sorted && fingerprint_sort_query(a->fwd_target, &sorted, &target.len) < 0)
        return oom(ret);
    if (sorted)
        target.base = sorted;
    err = fingerprint_init(&a->fp, rq->method, target);
    free(sorted);
    for (size_t i = 0; err == 0 && i < f->nheaders; i++)
        err =
            fingerprint_add_field(&a->fp, span_from_cstr(f->headers[i]), rq->headers, rq->nheaders);
    if (err < 0)
        return oom(ret);
    a->enforced = true;
    a->ttl_ms = request_ttl_ms(a, rq);
    return 0;
}

/* No key: the fingerprint stands for one (fallback), a 400 (require-key),
 * or passthrough. Returns 0 to go on, 1 with the refusal. */
static int no_key(struct admission *a, const struct request *rq, struct admission_refusal *ret)
{
    const struct route *rt = a->route;
    char detail[512];

    if (rt->key.fallback) {
        a->key_deferred = true; /* keyed by its fingerprint once the body is in */
        return a->enforced ? 0 : start_fingerprint(a, rq, ret);
    }
    if (rt->settings.require_key) {
        keysource_describe(&rt->key, detail, sizeof(detail));
        return refuse(ret, PROBLEM_KEY_MISSING, OUTCOME_MISSING_KEY, detail);
    }
    a->enforced = false; /* passthrough, unprotected */
    return 0;
}

/* What the key source found (<found>, an enum keysource_found or -ENOMEM),
 * <detail> saying why an invalid key is one. Returns 0 to go on, 1 with the
 * refusal. */
static int on_key(struct admission *a, const struct request *rq, int found, const char *detail,
                  struct admission_refusal *ret)
{
    int r;

    switch (found) {
    case KEYSOURCE_FOUND:
        r = build_store_key(a, rq, ret);
        if (r != 0 || (!a->store_key && !a->scope_wait))
            return r < 0 ? oom(ret) : r; /* refused, or passed through unprotected */
        return a->enforced ? 0 : start_fingerprint(a, rq, ret);
    case KEYSOURCE_MISSING:
        return no_key(a, rq, ret);
    case KEYSOURCE_INVALID:
        return refuse(ret, PROBLEM_KEY_INVALID, OUTCOME_INVALID_KEY, detail);
    case KEYSOURCE_IN_BODY:
        a->key_deferred = true;
        return start_fingerprint(a, rq, ret);
    default:
        return oom(ret);
    }
}

/* The path a route is matched on: the target up to its query. */
static struct span target_path(struct span target)
{
    const char *q = target.base ? memchr(target.base, '?', target.len) : NULL;

    if (q)
        target.len = (size_t)(q - target.base);
    return target;
}

/* Matches the route by <target>, and the Host of <host> (base NULL: the
 * client's Host header). */
static void route_request(struct admission *a, const struct request *rq, struct span target,
                          struct span host)
{
    const struct span *h = NULL;

    if (!host.base && (h = request_header(rq, SPAN_LIT("Host"), NULL)))
        host = *h;
    a->route = route_match(a->routes, rq->method, target_path(target), host);
    a->body.limit = a->route->settings.max_body_bytes;
}

int admission_head(struct admission *a, struct route_table *t, const struct request *rq,
                   const char *key_prefix, bool enabled, struct admission_refusal *ret)
{
    const struct route_settings *rs;
    const struct span *v;
    char detail[512];
    uint64_t announced = 0;

    a->routes = t;
    a->key_prefix = key_prefix;
    route_request(a, rq, rq->target, (struct span){ NULL, 0 });
    if (check_head(a, rq, ret))
        return 1;
    if (a->fwd_target.base != rq->target.base || a->fwd_host.base)
        route_request(a, rq, a->fwd_target, a->fwd_host); /* an absolute-form target */
    rs = &a->route->settings;
    if (enabled && a->route->enforce && config_is_enforced(rs, rq->method) &&
        on_key(a, rq, keysource_read(&a->route->key, rq, &a->key, detail, sizeof(detail)), detail,
               ret))
        return 1;
    v = request_header(rq, SPAN_LIT("Content-Length"), NULL);
    if (v && parse_uint(*v, &announced) < 0)
        v = NULL; /* check_head() let only one sane Content-Length through */
    if (!a->enforced && !a->key_deferred) {
        /* Passthrough, known from the head: --max-body is a keyed request's. */
        size_t max = rs->max_passthrough_body_bytes;

        if (v && max > 0 && announced > max)
            return refuse(ret, PROBLEM_PAYLOAD_TOO_LARGE, OUTCOME_TOO_LARGE,
                          ADMISSION_PASSTHROUGH_TOO_LARGE);
        a->body_length = v ? announced : UINT64_MAX;
        a->streams = v ? announced > ADMISSION_STREAM_MIN
                       : request_header(rq, SPAN_LIT("Transfer-Encoding"), NULL) != NULL;
        a->body.limit = SIZE_MAX; /* a body read whole is at most ADMISSION_STREAM_MIN */
        return 0;
    }
    if (v && announced > rs->max_body_bytes)
        return refuse(ret, PROBLEM_PAYLOAD_TOO_LARGE, OUTCOME_TOO_LARGE, TOO_LARGE_DETAIL);
    return 0;
}

/* ---- the body ---- */

int admission_body(struct admission *a, const char *p, size_t n, struct admission_refusal *ret)
{
    int err = buf_append(&a->body, p, n);

    /* A json body is hashed whole, in its canonical form, at its end. */
    if (err == 0 && a->enforced && !a->route->fingerprint.body_json)
        err = fingerprint_update(&a->fp, p, n);
    if (err == 0)
        return 0;
    buf_done(&a->body);
    if (err == -E2BIG)
        return refuse(ret, PROBLEM_PAYLOAD_TOO_LARGE, OUTCOME_TOO_LARGE, TOO_LARGE_DETAIL);
    return oom(ret);
}

/* Hashes the body of <a> in its canonical JSON form (RFC 8785, less the
 * route's ignored members), or as its bytes when it is no I-JSON or its
 * canonical form would pass four times its size (numbers written out: a
 * hostile body grows no further). Returns 0, or -ENOMEM, -EIO. */
static int hash_json_body(struct admission *a)
{
    const struct route_fingerprint *f = &a->route->fingerprint;
    struct span body = buf_span(&a->body);
    struct buf canon = BUF_INIT(body.len > SIZE_MAX / 4 ? SIZE_MAX : 4 * body.len + 16);
    int err = canonjson_write(body, (const char *const *)f->ignore, f->nignore, CANONJSON_DEPTH_MAX,
                              &canon);

    if (err == 0)
        err = fingerprint_update(&a->fp, canon.data, canon.len);
    else if (err == -EINVAL || err == -E2BIG)
        err = fingerprint_update(&a->fp, body.base, body.len);
    buf_done(&canon);
    return err;
}

int admission_end(struct admission *a, const struct request *rq, struct admission_refusal *ret)
{
    const struct keysource *ks = &a->route->key;
    char detail[512];
    int found = KEYSOURCE_MISSING;

    if (!a->enforced)
        return 0;
    if (a->route->fingerprint.body_json && hash_json_body(a) < 0)
        return oom(ret);
    if (fingerprint_final(&a->fp, a->digest) < 0)
        return oom(ret);
    if (!a->key_deferred)
        return 0;
    /* A key in the body (json), or the request's fingerprint (fallback). */
    a->key_deferred = false;
    if (!a->key.key.base)
        found = keysource_read_body(ks, buf_span(&a->body), &a->key, detail, sizeof(detail));
    if (found == KEYSOURCE_MISSING && ks->fallback)
        found = keysource_fingerprint(a->digest, FINGERPRINT_LEN, &a->key);
    if (found == KEYSOURCE_MISSING)
        a->enforced = false; /* for no_key(): nothing is hashed any more */
    return on_key(a, rq, found, detail, ret);
}

int admission_rescope(struct admission *a, const struct request *rq, struct admission_refusal *ret)
{
    int r;

    a->scope_wait = false;
    a->scope_waited = true; /* refused now if its kid is still unknown */
    r = build_store_key(a, rq, ret);
    return r < 0 ? oom(ret) : r;
}

void admission_done(struct admission *a)
{
    free(a->fwd_target_buf);
    buf_done(&a->body);
    fingerprint_done(&a->fp);
    free(a->store_key);
    keysource_key_done(&a->key);
    route_table_unref(a->routes);
}
