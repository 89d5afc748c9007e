/* SPDX-License-Identifier: MIT */
/* The outcomes of README.md, What it does with each request (metric labels,
 * log fields) and the problems the proxy answers with itself (status, stable
 * code, title, type link). */
#ifndef IDEMPROXY_OUTCOME_H
#define IDEMPROXY_OUTCOME_H

#include "idemproxy/common.h"

#define OUTCOME_LIST(X)                                                                            \
    X(PASSTHROUGH, "passthrough")                                                                  \
    X(EXECUTED, "executed")                                                                        \
    X(REPLAYED, "replayed")                                                                        \
    X(IN_FLIGHT, "in_flight")                                                                      \
    X(MISMATCH, "mismatch")                                                                        \
    X(MISSING_KEY, "missing_key")                                                                  \
    X(INVALID_KEY, "invalid_key")                                                                  \
    X(TOO_LARGE, "too_large")                                                                      \
    X(STORE_ERROR, "store_error")                                                                  \
    X(UPSTREAM_ERROR, "upstream_error")                                                            \
    X(BAD_REQUEST, "bad_request")                                                                  \
    X(UNKNOWN, "outcome_unknown")                                                                  \
    X(INTERNAL_ERROR, "internal_error")                                                            \
    X(SCOPE_REFUSED, "scope_refused")                                                              \
    X(EXPIRED, "expired")

enum outcome {
#define X(id, label) OUTCOME_##id,
    OUTCOME_LIST(X)
#undef X
        _OUTCOME_MAX
};

#define PROBLEM_DRAFT                                                                              \
    "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header"

/* id, status, code, title, type */
#define PROBLEM_LIST(X)                                                                            \
    X(KEY_IN_USE, 409, "idempotency_key_in_use",                                                   \
      "A request with this Idempotency-Key is in progress", PROBLEM_DRAFT "#section-2.6")          \
    X(KEY_MISMATCH, 422, "idempotency_key_mismatch",                                               \
      "Idempotency-Key reused with a different request", PROBLEM_DRAFT "#section-2.2")             \
    X(KEY_MISSING, 400, "idempotency_key_missing", "Idempotency-Key header is required",           \
      PROBLEM_DRAFT "#section-2.1")                                                                \
    X(KEY_INVALID, 400, "idempotency_key_invalid", "Idempotency-Key header is invalid",            \
      PROBLEM_DRAFT "#section-2.1")                                                                \
    X(PAYLOAD_TOO_LARGE, 413, "payload_too_large", "Request body too large", "about:blank")        \
    X(STORE_UNAVAILABLE, 503, "store_unavailable", "Idempotency store unavailable", "about:blank") \
    X(UPSTREAM_UNAVAILABLE, 502, "upstream_unavailable", "Upstream unavailable", "about:blank")    \
    X(UPSTREAM_TIMEOUT, 504, "upstream_timeout", "Upstream timed out", "about:blank")              \
    X(RESPONSE_TOO_LARGE, 502, "response_too_large", "Original response was too large to keep",    \
      "about:blank")                                                                               \
    X(BAD_REQUEST, 400, "bad_request", "Bad request", "about:blank")                               \
    X(NOT_IMPLEMENTED, 501, "bad_request", "Not implemented", "about:blank")                       \
    X(ADMIN_UNAUTHORIZED, 401, "unauthorized", "Admin token required", "about:blank")              \
    X(ADMIN_FORBIDDEN, 403, "forbidden", "Not served on this admin address", "about:blank")        \
    X(ADMIN_CONFLICT, 409, "conflict", "The key is not in the state this call needs",              \
      "about:blank")                                                                               \
    X(ADMIN_NOT_FOUND, 404, "not_found", "Not found", "about:blank")                               \
    X(ADMIN_BAD_REQUEST, 400, "bad_request", "Bad request", "about:blank")                         \
    X(ADMIN_METHOD, 405, "method_not_allowed", "Method not allowed", "about:blank")                \
    X(ADMIN_TOO_LARGE, 413, "payload_too_large", "Request body too large", "about:blank")          \
    X(ADMIN_INTERNAL, 500, "internal_error", "The proxy could not answer", "about:blank")          \
    X(OUTCOME_UNKNOWN, 502, "idempotency_outcome_unknown",                                         \
      "The outcome of the original request is unknown", "about:blank")                             \
    X(INTERNAL, 503, "internal_error", "The proxy cannot take the request now", "about:blank")     \
    X(SCOPE_UNVERIFIED, 401, "idempotency_scope_unverified",                                       \
      "The credential that scopes the key could not be verified", "about:blank")                   \
    X(SCOPE_MISSING, 401, "idempotency_scope_missing",                                             \
      "A credential that scopes the key is required", "about:blank")                               \
    X(KEY_EXPIRED, 410, "idempotency_key_expired",                                                 \
      "This Idempotency-Key was used and its answer has expired", "about:blank")

enum problem {
#define X(id, status, code, title, type) PROBLEM_##id,
    PROBLEM_LIST(X)
#undef X
        _PROBLEM_MAX
};

/* The metric/log label of <o>, e.g. "in_flight". */
const char *outcome_label(enum outcome o);

#endif
