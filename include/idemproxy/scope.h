/* SPDX-License-Identifier: MIT */
/* Whose a key is (doc/configuration.md, Scope): the principal of a request,
 * from a verified bearer token (the issuer and the claims a route names) or
 * from a header that an authenticating gateway in front sets (honoured only
 * from its addresses). A scope is built from the configuration (its keys
 * read, or fetched and then refreshed by a thread of this module), never
 * changed, and shared by reference by the routes that use it; evaluating a
 * request is thread-safe. */
#ifndef IDEMPROXY_SCOPE_H
#define IDEMPROXY_SCOPE_H

#include "idemproxy/common.h"
#include "idemproxy/config.h"

struct request;

/* Why a request's principal is refused: the reason label of
 * idemproxy_scope_failures_total (doc/operations.md, Metrics and access log). */
#define SCOPE_FAILURE_LIST(X)                                                                      \
    X(MISSING, "missing")                                                                          \
    X(MALFORMED, "malformed")                                                                      \
    X(SIGNATURE, "signature")                                                                      \
    X(ALGORITHM, "algorithm")                                                                      \
    X(UNKNOWN_KID, "unknown_kid")                                                                  \
    X(EXPIRED, "expired")                                                                          \
    X(CLAIMS, "claims")                                                                            \
    X(KEYS_UNAVAILABLE, "keys_unavailable")

enum scope_failure {
#define X(id, label) SCOPE_FAILURE_##id,
    SCOPE_FAILURE_LIST(X)
#undef X
        SCOPE_FAILURE_MAX
};

/* The label of <f>, e.g. "unknown_kid"; "unknown" past the list. */
const char *scope_failure_label(enum scope_failure f);

/* What a route's scope: {jwt: {...}} says (doc/configuration.md, Scope). */
struct scope_jwt_config {
    const char *header;        /* the token's header: Authorization ("Bearer <token>") */
    const char *keys_file;     /* keys: a JWKS or PEM public keys; or */
    const char *keys_url;      /* keys-url: a JWKS fetched and refreshed; or */
    const char *secret_file;   /* secret-file: HS256, its first line (at least 32 bytes) */
    const char *issuer;        /* iss must be this (required) */
    const char *audience;      /* aud must be or hold this; NULL: not checked */
    const char *const *claims; /* the claims that, with iss, are the principal (default sub) */
    size_t nclaims;
    uint64_t leeway_s; /* exp and nbf are checked this loosely */
};

/* At most this many trusted networks in scope: {header, trusted}. */
#define SCOPE_TRUSTED_MAX CONFIG_MAX_LIST

struct scope;

/* A scope from a verified bearer token: its keys are read now (keys,
 * secret-file) or fetched now and then every 5 minutes (keys-url). Returns
 * 0, or -EINVAL with <why> saying what is wrong (a file that does not load,
 * no issuer, a URL that is not https:// or loopback http://), or -ENOMEM. A
 * keys-url that cannot be fetched is not an error: it is logged, its tokens
 * are refused (keys_unavailable) and it is tried again. */
int scope_jwt_new(const struct scope_jwt_config *c, struct scope **ret, char *why, size_t whylen);

/* A scope from header <header>, honoured from a peer in one of the <n>
 * networks <cidrs> ("10.0.0.0/8", "::1/128", an address alone) and ignored
 * from any other. Returns 0, -EINVAL (<why>: a network that does not parse)
 * or -ENOMEM. */
int scope_trusted_new(const char *header, const char *const *cidrs, size_t n, struct scope **ret,
                      char *why, size_t whylen);

struct scope *scope_ref(struct scope *s);

/* Drops a reference; the last one frees <s>. NULL-safe. */
void scope_unref(struct scope *s);

/* The header a principal of <s> comes from (a token's, or the trusted one). */
const char *scope_header(const struct scope *s);

/* The values a principal hashes: its kind's tag, the issuer, and each of
 * up to CONFIG_MAX_LIST claims' name and value (or a trusted header's name
 * and value); and a place for the caller's key source tag. */
#define SCOPE_VALUES_MAX (2 * CONFIG_MAX_LIST + 3)

/* The principal of a request: the values its scope hashes (idemkey_scope()),
 * in <owned>. <n> 0: it has none. */
struct scope_principal {
    struct span values[SCOPE_VALUES_MAX];
    size_t n;
    char *owned;
};

/* The principal of <rq> under <s> at <now_s> (seconds since the epoch).
 * Returns 0 (<p> filled: n 0 when the request carries none: no token, or a
 * trusted header absent or from an untrusted peer), 1 with <why> (a token
 * that does not verify), or -ENOMEM. */
int scope_eval(const struct scope *s, const struct request *rq, uint64_t now_s,
               struct scope_principal *p, enum scope_failure *why);

/* Frees what <p> owns. */
void scope_principal_done(struct scope_principal *p);

/* Whether a token of <s> refused for an unknown kid may verify once the key
 * set is fetched again: <s> takes its keys from a keys-url. */
bool scope_can_wait(const struct scope *s);

/* Someone waiting for a keys-url's refetch. */
struct scope_waiter {
    void (*fn)(void *ctx);
    void *ctx;
    struct scope_waiter *next; /* the source's */
};

/* Registers <w> to run once the refetch of <s>'s keys that an unknown kid
 * asked for is done (or failed), on the thread that fetched them. Returns 0,
 * or -EALREADY when none is coming (one ran less than 30 s ago): <w> never
 * runs. */
int scope_wait_keys(const struct scope *s, struct scope_waiter *w);

/* Stops the thread that refreshes keys-url key sets (at exit, once every
 * scope is gone). Idempotent. */
void scope_shutdown(void);

#endif
