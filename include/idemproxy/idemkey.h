/* SPDX-License-Identifier: MIT */
/* Idempotency-Key values (bare token or RFC 8941 sf-string), the scope hash of
 * the client's credentials, and the store key <prefix><scope>:<key>. Pure functions. */
#ifndef IDEMPROXY_IDEMKEY_H
#define IDEMPROXY_IDEMKEY_H

#include "idemproxy/common.h"

#define IDEMKEY_MAX 255
#define IDEMKEY_SCOPE_HEX 32 /* hex characters of a scope: the first 16 bytes of a SHA-256 */

struct idemkey {
    size_t len;
    char buf[IDEMKEY_MAX]; /* not NUL-terminated */
};

/* Parses an Idempotency-Key value <v>: a bare token or an RFC 8941 sf-string.
 * Returns 0 with the unquoted key in <ret>, or -EINVAL if it is empty, longer
 * than IDEMKEY_MAX, has a byte outside 0x21-0x7E after unquoting, is an
 * unterminated or badly escaped sf-string, or is bare and holds , " or \.
 * <ret> is untouched on failure. */
int idemkey_parse(struct span v, struct idemkey *ret);

/* Writes into <ret> the 32 lowercase hex characters and a NUL of the scope of
 * the <n> header values <values> (in --scope-header order). An absent header is
 * a span with base == NULL and differs from an empty one. Each value is framed
 * with its length, so no two different lists share a scope. Returns 0, or
 * -ENOMEM when the hash cannot be computed (<ret> untouched). */
int idemkey_scope(const struct span *values, size_t n, char ret[IDEMKEY_SCOPE_HEX + 1]);

/* Builds the store key "<prefix><scope>:<key>" as a new NUL-terminated heap
 * string in <ret> (the caller frees it). Returns 0 or -ENOMEM. The one place
 * the store-key layout is written; idemkey_store_key_matches() reads it. */
int idemkey_store_key(struct span prefix, const char *scope, struct span key, char **ret);

#define IDEMKEY_LINK_MARK "r:" /* what follows the prefix in a link's key */

/* Builds the key of the resource link "<prefix>r:<scope>:<resource>" of the
 * store key <store_key> (whose prefix is its first <prefix_len> bytes) as a
 * new NUL-terminated heap string in <ret> (the caller frees it): a key no
 * store key can be, as a scope is hex. Returns 0, -EINVAL when <store_key>
 * is no store key under such a prefix, or -ENOMEM. The one place the link
 * layout is written. */
int idemkey_link_key(struct span store_key, size_t prefix_len, struct span resource, char **ret);

#define IDEMKEY_TOMB_MARK "t:" /* what follows the prefix in a tombstone's key */

/* The key of the tombstone (doc/configuration.md, Tombstones) of the store
 * key <store_key>, whose prefix is <prefix_len> bytes, into <ret> (new,
 * NUL-terminated): <prefix>t:<scope>:<key>, a key no store key or link key
 * can be. Returns 0, -EINVAL when <store_key> is no store key under such a
 * prefix, or -ENOMEM. The one place the tombstone layout is written. */
int idemkey_tomb_key(struct span store_key, size_t prefix_len, char **ret);

/* The key text of <k>, borrowed. */
static inline struct span idemkey_span(const struct idemkey *k)
{
    return (struct span){ .base = k->buf, .len = k->len };
}

/* True when <s> is a scope as idemkey_scope() writes it: IDEMKEY_SCOPE_HEX
 * lowercase hex characters. */
bool idemkey_is_scope(struct span s);

/* True when <s> is a store key of the idempotency key <key> under <prefix>,
 * in any scope: <prefix>, a scope, ':', <key>. */
bool idemkey_store_key_matches(struct span s, struct span prefix, struct span key);

/* True when <s> is a store key under <prefix> of any key, in any scope. */
bool idemkey_store_key_is_under(struct span s, struct span prefix);

/* The key part of the store key <s> under <prefix> (what follows the scope
 * and ':'), borrowed from <s>; base NULL when <s> is no such store key. */
struct span idemkey_store_key_key(struct span s, struct span prefix);

#endif
