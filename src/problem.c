/* SPDX-License-Identifier: MIT */
/* The problems the proxy answers with itself (problem.h): their table, and
 * their bodies in each dialect, built with jansson. Pure, any thread. */
#include "idemproxy/problem.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>

#include "idemproxy/record.h"

struct problem_desc {
    unsigned status;
    const char *code, *title, *type;
};

static const struct problem_desc problems[] = {
#define X(id, status, code, title, type) [PROBLEM_##id] = { status, code, title, type },
    PROBLEM_LIST(X)
#undef X
};

unsigned problem_status(enum problem p)
{
    return (unsigned)p < ARRAY_SIZE(problems) ? problems[p].status : 500;
}

const char *problem_code(enum problem p)
{
    return (unsigned)p < ARRAY_SIZE(problems) ? problems[p].code : "internal_error";
}

/* The error's type in the stripe dialect: the key problems are the client's
 * to fix, and Stripe-style SDKs raise an error of their own class for
 * "idempotency_error"; a credential refused is an "invalid_request_error"
 * (their SDKs raise an authentication error for any 401). */
static const char *stripe_type(enum problem p)
{
    switch (p) {
    case PROBLEM_KEY_IN_USE:
    case PROBLEM_KEY_MISMATCH:
    case PROBLEM_KEY_MISSING:
    case PROBLEM_KEY_INVALID:
    case PROBLEM_KEY_EXPIRED:
        return "idempotency_error";
    case PROBLEM_SCOPE_UNVERIFIED:
    case PROBLEM_SCOPE_MISSING:
        return "invalid_request_error";
    default:
        return "api_error";
    }
}

static json_t *body_object(enum problem p, enum problem_dialect dialect, const char *detail)
{
    const struct problem_desc *d = &problems[p];

    if (dialect == PROBLEM_DIALECT_STRIPE)
        return json_pack("{s:{s:s, s:s, s:s}}", "error", "type", stripe_type(p), "code", d->code,
                         "message", detail);
    return json_pack("{s:s, s:s, s:i, s:s, s:s}", "type", d->type, "title", d->title, "status",
                     (int)d->status, "detail", detail, "code", d->code);
}

static char *problem_json(enum problem p, enum problem_dialect dialect, const char *detail,
                          const char *name, const char *value)
{
    json_t *obj, *v;
    char *s;

    /* json_pack() refuses a detail that is not UTF-8: fall back to the title. */
    obj = body_object(p, dialect, detail ? detail : problems[p].title);
    if (!obj && detail)
        obj = body_object(p, dialect, problems[p].title);
    if (!obj)
        return NULL;
    if (name && (v = json_string(value))) /* not UTF-8: left out */
        json_object_set_new(dialect == PROBLEM_DIALECT_STRIPE ? json_object_get(obj, "error") : obj,
                            name, v);
    s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    return s;
}

struct record *problem_new(enum problem p, enum problem_dialect dialect, const char *detail)
{
    return problem_new_with(p, dialect, detail, NULL, NULL);
}

struct record *problem_new_with(enum problem p, enum problem_dialect dialect, const char *detail,
                                const char *name, const char *value)
{
    const struct problem_desc *d;
    struct record *rec = NULL;
    char *body;
    size_t len;

    if ((unsigned)p >= ARRAY_SIZE(problems) ||
        (dialect != PROBLEM_DIALECT_PROBLEM && dialect != PROBLEM_DIALECT_STRIPE))
        return NULL;
    d = &problems[p];
    body = problem_json(p, dialect, detail, name, value);
    if (!body)
        return NULL;
    len = strlen(body);
    rec = record_new(len);
    if (!rec)
        goto fail;
    rec->status = d->status;
    if (record_add_header(rec, SPAN_LIT("Content-Type"),
                          dialect == PROBLEM_DIALECT_STRIPE
                              ? SPAN_LIT("application/json")
                              : SPAN_LIT("application/problem+json")) < 0)
        goto fail;
    if ((p == PROBLEM_KEY_IN_USE || d->status == 503) && /* a retry may succeed */
        record_add_header(rec, SPAN_LIT("Retry-After"), SPAN_LIT("1")) < 0)
        goto fail;
    /* Every 401 carries a challenge (RFC 9110, 15.5.2; RFC 6750, 3). */
    if (p == PROBLEM_SCOPE_UNVERIFIED &&
        record_add_header(rec, SPAN_LIT("WWW-Authenticate"),
                          SPAN_LIT("Bearer error=\"invalid_token\"")) < 0)
        goto fail;
    if (p == PROBLEM_SCOPE_MISSING &&
        record_add_header(rec, SPAN_LIT("WWW-Authenticate"), SPAN_LIT("Bearer")) < 0)
        goto fail;
    /* Framing or bytes the proxy could not trust: nothing after this request
     * on the connection can be trusted either. */
    if ((p == PROBLEM_BAD_REQUEST || p == PROBLEM_NOT_IMPLEMENTED) &&
        record_add_header(rec, SPAN_LIT("Connection"), SPAN_LIT("close")) < 0)
        goto fail;
    /* A retry cannot help (doc/guarantees.md, Unknown outcomes): SDKs built by
     * Stainless read the first, Stripe's the second. */
    if (p == PROBLEM_OUTCOME_UNKNOWN &&
        (record_add_header(rec, SPAN_LIT("X-Should-Retry"), SPAN_LIT("false")) < 0 ||
         (dialect == PROBLEM_DIALECT_STRIPE &&
          record_add_header(rec, SPAN_LIT("Stripe-Should-Retry"), SPAN_LIT("false")) < 0)))
        goto fail;
    if (buf_append(&rec->body, body, len) < 0)
        goto fail;
    free(body);
    return rec;

fail:
    record_unref(rec);
    free(body);
    return NULL;
}
