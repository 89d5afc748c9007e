/* SPDX-License-Identifier: MIT */
/* The Idempotency-Key header value, bare or sf-string (idemkey_parse), the
 * store key built from it, and the scope hash of client header values. */
#include <stdlib.h>

#include "fuzz.h"
#include "idemproxy/idemkey.h"

static bool is_hex_lower(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

/* An accepted key is what README.md says one is: 1-255 bytes of 0x21-0x7E. */
static void check_key(const struct idemkey *k)
{
    FUZZ_CHECK(k->len >= 1 && k->len <= IDEMKEY_MAX);
    for (size_t i = 0; i < k->len; i++)
        FUZZ_CHECK(k->buf[i] >= 0x21 && k->buf[i] <= 0x7e);
}

/* Writes the quoted form of <k> (its '"' and '\' escaped, in quotes) to
 * <out>, which holds 2 * IDEMKEY_MAX + 2 bytes; returns its length. */
static size_t quote_key(const struct idemkey *k, char *out)
{
    size_t n = 0;

    out[n++] = '"';
    for (size_t i = 0; i < k->len; i++) {
        if (k->buf[i] == '"' || k->buf[i] == '\\')
            out[n++] = '\\';
        out[n++] = k->buf[i];
    }
    out[n++] = '"';
    return n;
}

/* An accepted value is the canonical form of its key: bare, the key itself;
 * quoted, quote_key(). */
static void check_canonical(struct span v, const struct idemkey *k)
{
    char quoted[2 * IDEMKEY_MAX + 2];
    size_t n;

    if (v.base[0] != '"') {
        FUZZ_CHECK(v.len == k->len && memcmp(v.base, k->buf, k->len) == 0);
        FUZZ_CHECK(!memchr(k->buf, ',', k->len) && !memchr(k->buf, '"', k->len) &&
                   !memchr(k->buf, '\\', k->len));
        return;
    }
    n = quote_key(k, quoted);
    FUZZ_CHECK(v.len == n && memcmp(v.base, quoted, n) == 0);
}

static void check_store_key(const struct idemkey *k)
{
    static const struct span prefix = SPAN_LIT("idem:");
    const char *scope = "0123456789abcdef0123456789abcdef";
    char *s = NULL;

    FUZZ_CHECK(idemkey_store_key(prefix, scope, idemkey_span(k), &s) == 0 && s);
    FUZZ_CHECK(strlen(s) == prefix.len + IDEMKEY_SCOPE_HEX + 1 + k->len);
    FUZZ_CHECK(memcmp(s, "idem:", 5) == 0 && s[prefix.len + IDEMKEY_SCOPE_HEX] == ':');
    FUZZ_CHECK(memcmp(s + prefix.len + IDEMKEY_SCOPE_HEX + 1, k->buf, k->len) == 0);
    free(s);
}

static void check_scope_hex(const char *h)
{
    for (size_t i = 0; i < IDEMKEY_SCOPE_HEX; i++)
        FUZZ_CHECK(is_hex_lower(h[i]));
    FUZZ_CHECK(h[IDEMKEY_SCOPE_HEX] == '\0');
}

/* The values are the input split at '\n'; a lone "\x01" is an absent header.
 * Merging the first two values, or making one absent, changes the list, so
 * it must change the scope (the framing). */
static void check_scope(struct span in)
{
    struct span v[8];
    size_t n = fuzz_split(in, '\n', v, ARRAY_SIZE(v));
    char a[IDEMKEY_SCOPE_HEX + 1], b[IDEMKEY_SCOPE_HEX + 1];

    for (size_t i = 0; i < n; i++) {
        if (v[i].len == 1 && v[i].base[0] == '\x01')
            v[i] = (struct span){ .base = NULL, .len = 0 };
    }
    FUZZ_CHECK(idemkey_scope(v, n, a) == 0);
    check_scope_hex(a);
    FUZZ_CHECK(idemkey_scope(v, n, b) == 0 && memcmp(a, b, sizeof(a)) == 0);
    if (n >= 2 && v[0].base && v[1].base) {
        struct span merged[8];

        memcpy(merged, v + 1, (n - 1) * sizeof(*v));
        merged[0] = (struct span){ .base = v[0].base, .len = v[0].len + 1 + v[1].len };
        FUZZ_CHECK(idemkey_scope(merged, n - 1, b) == 0 && memcmp(a, b, sizeof(a)) != 0);
    }
    if (v[0].base && v[0].len == 0) {
        struct span absent = { .base = NULL, .len = 0 };

        FUZZ_CHECK(idemkey_scope(&absent, 1, b) == 0);
        FUZZ_CHECK(idemkey_scope(v, 1, a) == 0 && memcmp(a, b, sizeof(a)) != 0);
    }
}

/* The key's quoted form, and its bare form when it has one, parse back to it. */
static void check_reparse(const struct idemkey *k)
{
    char quoted[2 * IDEMKEY_MAX + 2];
    struct idemkey again = { .len = 0 };
    size_t n;

    if (!memchr(k->buf, ',', k->len) && !memchr(k->buf, '"', k->len) &&
        !memchr(k->buf, '\\', k->len)) {
        FUZZ_CHECK(idemkey_parse((struct span){ .base = k->buf, .len = k->len }, &again) == 0);
        FUZZ_CHECK(again.len == k->len && memcmp(again.buf, k->buf, k->len) == 0);
    }
    n = quote_key(k, quoted);
    again.len = 0;
    FUZZ_CHECK(idemkey_parse((struct span){ .base = quoted, .len = n }, &again) == 0);
    FUZZ_CHECK(again.len == k->len && memcmp(again.buf, k->buf, k->len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct span in = { .base = (const char *)data, .len = size };
    struct idemkey k = { .len = 0 };
    int r = idemkey_parse(in, &k);

    if (r == 0) {
        check_key(&k);
        check_canonical(in, &k);
        check_store_key(&k);
        check_reparse(&k);
    } else {
        FUZZ_CHECK(r == -EINVAL && k.len == 0); /* untouched on failure */
    }
    check_scope(in);
    return 0;
}
