/* SPDX-License-Identifier: MIT */
/* Idempotency-Key values, scopes and the layout of store keys (idemkey.h). */
#include "idemproxy/idemkey.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/digest.h"

static bool key_byte_ok(unsigned char c) { return c >= 0x21 && c <= 0x7e; }

/* An RFC 8941 sf-string: <v> starts with '"' and must end with the one
 * unescaped '"' that closes it. Only \" and \\ are escapes. */
static int parse_quoted(struct span v, struct idemkey *k)
{
    size_t i = 1;

    for (;;) {
        unsigned char c;

        if (i == v.len)
            return -EINVAL; /* unterminated */
        c = (unsigned char)v.base[i++];
        if (c == '"')
            break;
        if (c == '\\') {
            if (i == v.len || (v.base[i] != '"' && v.base[i] != '\\'))
                return -EINVAL; /* dangling or unknown escape */
            c = (unsigned char)v.base[i++];
        }
        if (!key_byte_ok(c) || k->len == IDEMKEY_MAX)
            return -EINVAL;
        k->buf[k->len++] = (char)c;
    }
    if (i != v.len)
        return -EINVAL; /* bytes after the closing quote */
    return 0;
}

static int parse_bare(struct span v, struct idemkey *k)
{
    for (size_t i = 0; i < v.len; i++) {
        unsigned char c = (unsigned char)v.base[i];

        /* A bare comma usually means two key headers were merged. */
        if (!key_byte_ok(c) || c == ',' || c == '"' || c == '\\' || k->len == IDEMKEY_MAX)
            return -EINVAL;
        k->buf[k->len++] = (char)c;
    }
    return 0;
}

int idemkey_parse(struct span v, struct idemkey *ret)
{
    struct idemkey k = { .len = 0 };
    int r;

    if (v.len == 0 || !v.base)
        return -EINVAL;
    r = v.base[0] == '"' ? parse_quoted(v, &k) : parse_bare(v, &k);
    if (r < 0)
        return r;
    if (k.len == 0)
        return -EINVAL; /* "" */
    *ret = k;
    return 0;
}

int idemkey_scope(const struct span *values, size_t n, char ret[IDEMKEY_SCOPE_HEX + 1])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestInit_ex(ctx, digest_sha256(), NULL) == 1;

    for (size_t i = 0; ok && i < n; i++) {
        uint8_t present = values[i].base != NULL;
        uint8_t len[8];

        ok = EVP_DigestUpdate(ctx, &present, 1) == 1;
        if (!ok || !present)
            continue;
        for (int j = 0; j < 8; j++)
            len[j] = (uint8_t)((uint64_t)values[i].len >> (56 - 8 * j));
        ok = EVP_DigestUpdate(ctx, len, sizeof(len)) == 1;
        if (ok && values[i].len > 0)
            ok = EVP_DigestUpdate(ctx, values[i].base, values[i].len) == 1;
    }
    ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) == 1 && mdlen >= IDEMKEY_SCOPE_HEX / 2;
    EVP_MD_CTX_free(ctx);
    if (!ok)
        return -ENOMEM; /* a failed allocation: no scope is safe to use instead */
    hex_encode(md, IDEMKEY_SCOPE_HEX / 2, ret);
    return 0;
}

bool idemkey_is_scope(struct span s)
{
    if (s.len != IDEMKEY_SCOPE_HEX)
        return false;
    for (size_t i = 0; i < s.len; i++) {
        char c = s.base[i];

        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return true;
}

bool idemkey_store_key_matches(struct span s, struct span prefix, struct span key)
{
    size_t head = prefix.len + IDEMKEY_SCOPE_HEX + 1;

    return s.len == head + key.len && memcmp(s.base, prefix.base, prefix.len) == 0 &&
           idemkey_is_scope(
               (struct span){ .base = s.base + prefix.len, .len = IDEMKEY_SCOPE_HEX }) &&
           s.base[head - 1] == ':' && memcmp(s.base + head, key.base, key.len) == 0;
}

bool idemkey_store_key_is_under(struct span s, struct span prefix)
{
    size_t head = prefix.len + IDEMKEY_SCOPE_HEX + 1;

    return s.len > head &&
           idemkey_store_key_matches((struct span){ s.base, head }, prefix, (struct span){ "", 0 });
}

struct span idemkey_store_key_key(struct span s, struct span prefix)
{
    size_t head = prefix.len + IDEMKEY_SCOPE_HEX + 1;

    if (!idemkey_store_key_is_under(s, prefix))
        return (struct span){ NULL, 0 };
    return (struct span){ s.base + head, s.len - head };
}

/* <prefix><mark><scope>:<tail> of the store key <store_key>. */
static int marked_key(struct span store_key, size_t prefix_len, const char *marker,
                      struct span tail, char **ret)
{
    size_t mark = strlen(marker), n;
    char *s;

    if (store_key.len < prefix_len + IDEMKEY_SCOPE_HEX + 1 ||
        !idemkey_is_scope((struct span){ store_key.base + prefix_len, IDEMKEY_SCOPE_HEX }) ||
        store_key.base[prefix_len + IDEMKEY_SCOPE_HEX] != ':')
        return -EINVAL;
    n = prefix_len + mark + IDEMKEY_SCOPE_HEX + 1 + tail.len;
    if (!(s = malloc(n + 1)))
        return -ENOMEM;
    memcpy(s, store_key.base, prefix_len);
    memcpy(s + prefix_len, marker, mark);
    memcpy(s + prefix_len + mark, store_key.base + prefix_len, IDEMKEY_SCOPE_HEX + 1);
    if (tail.len)
        memcpy(s + n - tail.len, tail.base, tail.len);
    s[n] = '\0';
    *ret = s;
    return 0;
}

int idemkey_link_key(struct span store_key, size_t prefix_len, struct span resource, char **ret)
{
    return marked_key(store_key, prefix_len, IDEMKEY_LINK_MARK, resource, ret);
}

int idemkey_tomb_key(struct span store_key, size_t prefix_len, char **ret)
{
    size_t head = prefix_len + IDEMKEY_SCOPE_HEX + 1;

    if (store_key.len < head)
        return -EINVAL;
    return marked_key(store_key, prefix_len, IDEMKEY_TOMB_MARK,
                      (struct span){ store_key.base + head, store_key.len - head }, ret);
}

int idemkey_store_key(struct span prefix, const char *scope, struct span key, char **ret)
{
    size_t slen = strlen(scope);
    char *s = malloc(prefix.len + slen + 1 + key.len + 1), *p;

    if (!s)
        return -ENOMEM;
    p = s;
    if (prefix.len) {
        memcpy(p, prefix.base, prefix.len);
        p += prefix.len;
    }
    memcpy(p, scope, slen);
    p += slen;
    *p++ = ':';
    if (key.len)
        memcpy(p, key.base, key.len);
    p += key.len;
    *p = '\0';
    *ret = s;
    return 0;
}
