/* SPDX-License-Identifier: MIT */
/* What the scope module's files share: a scope (scope.c), the key sets it
 * verifies tokens with, read from files or fetched from a URL
 * (scope_keys.c), and the verification of a token (scope_jwt.c). */
#ifndef IDEMPROXY_SCOPE_IMPL_H
#define IDEMPROXY_SCOPE_IMPL_H

#include <cjose/cjose.h>
#include <jansson.h>
#include <stdatomic.h>

#include "idemproxy/scope.h"

/* The kinds of key a token may be verified with, each with its algorithms:
 * RS256 and PS256 (RSA, 2048 bits or more), ES256 (EC on P-256), HS256 (a
 * secret-file's octets). No other algorithm is taken. */
enum scope_key_kind {
    SCOPE_KEY_RSA,
    SCOPE_KEY_EC256,
    SCOPE_KEY_OCT,
};

struct scope_key {
    cjose_jwk_t *jwk;
    char *kid; /* owned; NULL: none (a PEM key, a secret, a JWK without one) */
    char *alg; /* owned: the JWK's "alg"; NULL: any of its kind's */
    enum scope_key_kind kind;
};

/* A key set: never changed once made, shared by reference. */
struct scope_keyset {
    atomic_int refs;
    size_t n;
    struct scope_key keys[];
};

/* The key set of a JWKS document (RFC 7517: {"keys": [...]}): its RSA and
 * P-256 public keys for signatures; a key for encryption ("use": "enc"),
 * a symmetric or private one, or of another kind or curve is left out.
 * Returns 0, -EINVAL (<why>: not a JWKS, or no key left) or -ENOMEM. */
int scope_keyset_from_jwks(const char *json, size_t len, struct scope_keyset **ret, char *why,
                           size_t whylen);

/* The key set of file <path>: a JWKS, or PEM public keys ("BEGIN PUBLIC
 * KEY", one or more). Returns 0, -EINVAL (<why>) or -ENOMEM. */
int scope_keyset_from_file(const char *path, struct scope_keyset **ret, char *why, size_t whylen);

/* The HS256 key of secret file <path>: its first line, at least 32 bytes.
 * Returns 0, -EINVAL (<why>) or -ENOMEM. */
int scope_keyset_from_secret(const char *path, struct scope_keyset **ret, char *why, size_t whylen);

struct scope_keyset *scope_keyset_ref(struct scope_keyset *ks);
void scope_keyset_unref(struct scope_keyset *ks);

/* A JWKS URL's key set, shared by every scope naming that URL (across
 * reloads): fetched when first asked for, then every SCOPE_REFRESH_MS, and
 * again on an unknown kid at most once per SCOPE_KID_REFETCH_MS; a fetch
 * that fails keeps the set it had (and is tried again after
 * SCOPE_KID_REFETCH_MS). */
#define SCOPE_REFRESH_MS (5u * 60 * 1000)
#define SCOPE_KID_REFETCH_MS (30u * 1000)
#define SCOPE_FETCH_TIMEOUT_MS 5000
#define SCOPE_JWKS_MAX (1u << 20) /* the largest JWKS document read */

struct scope_source;

/* The source of <url> (a new one is fetched once before this returns).
 * Returns 0, -EINVAL (<why>: not https://, or http:// to other than a
 * loopback address) or -ENOMEM. */
int scope_source_get(const char *url, struct scope_source **ret, char *why, size_t whylen);

void scope_source_unref(struct scope_source *src);

/* The key set <src> has now, a reference; NULL when none was ever fetched. */
struct scope_keyset *scope_source_keys(struct scope_source *src);

/* A token named a kid that <src>'s set lacks: a refetch, unless one was
 * asked for less than SCOPE_KID_REFETCH_MS before <now> (monotonic ms). */
void scope_source_kid_missed(struct scope_source *src, uint64_t now);

/* Registers <w> for the end of <src>'s refetch asked for or running.
 * Returns 0, or -EALREADY when none is. */
int scope_source_wait(struct scope_source *src, struct scope_waiter *w);

struct scope {
    atomic_int refs;
    bool jwt; /* else a trusted header */
    char *header;
    /* jwt */
    struct scope_keyset *keys;   /* keys or secret-file; NULL: from <source> */
    struct scope_source *source; /* keys-url */
    char *issuer, *audience;
    char *claims[CONFIG_MAX_LIST];
    size_t nclaims;
    uint64_t leeway_s;
    /* a trusted header: the networks it is honoured from */
    struct scope_net {
        int family; /* AF_INET or AF_INET6 */
        uint8_t addr[16];
        unsigned bits;
    } nets[SCOPE_TRUSTED_MAX];
    size_t nnets;
};

/* Verifies <token> (a JWS in compact form) under <s> at <now_s>: its
 * algorithm and key, its signature, then exp, nbf (with the leeway), iss,
 * aud and the named claims. Returns 0 with its claims in <ret> (a new
 * reference), 1 with <why>, or -ENOMEM. */
int scope_jwt_verify(const struct scope *s, struct span token, uint64_t now_s, json_t **ret,
                     enum scope_failure *why);

#endif
