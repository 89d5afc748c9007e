/* SPDX-License-Identifier: MIT */
/* The framed, incremental SHA-256 of a request (fingerprint.h). */
#include "idemproxy/fingerprint.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/digest.h"
#include "idemproxy/http.h"

static int feed_len(EVP_MD_CTX *md, uint64_t n)
{
    uint8_t len[8];

    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (56 - 8 * i));
    return EVP_DigestUpdate(md, len, sizeof(len)) == 1 ? 0 : -EIO;
}

/* Feeds <s> after its length, so ("POS", "T/a") and ("POST", "/a") differ. */
static int feed_framed(EVP_MD_CTX *md, struct span s)
{
    if (feed_len(md, s.len) < 0)
        return -EIO;
    if (s.len > 0 && EVP_DigestUpdate(md, s.base, s.len) != 1)
        return -EIO;
    return 0;
}

static struct span trim_ows(struct span v)
{
    while (v.len > 0 && (v.base[0] == ' ' || v.base[0] == '\t')) {
        v.base++;
        v.len--;
    }
    while (v.len > 0 && (v.base[v.len - 1] == ' ' || v.base[v.len - 1] == '\t'))
        v.len--;
    return v;
}

int fingerprint_add_field(struct fingerprint *fp, struct span name,
                          const struct http_header *fields, size_t n)
{
    uint64_t joined = 0;
    size_t found = 0;
    int r;

    if (!fp->md)
        return -EIO;
    for (size_t i = 0; i < n; i++) {
        if (span_eq_nocase(fields[i].name, name))
            joined += (found++ ? 2 : 0) + trim_ows(fields[i].value).len;
    }
    r = feed_framed(fp->md, name);
    if (r == 0)
        r = feed_len(fp->md, found > 0); /* absent is not empty */
    if (r == 0)
        r = feed_len(fp->md, joined);
    for (size_t i = 0, k = 0; r == 0 && i < n; i++) {
        struct span v = trim_ows(fields[i].value);

        if (!span_eq_nocase(fields[i].name, name))
            continue;
        if ((k++ > 0 && EVP_DigestUpdate(fp->md, ", ", 2) != 1) ||
            (v.len > 0 && EVP_DigestUpdate(fp->md, v.base, v.len) != 1))
            r = -EIO;
    }
    return r;
}

/* Orders two parameters by name (up to the first '='), then whole. */
static int param_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    const char *xe = memchr(x->base, '=', x->len), *ye = memchr(y->base, '=', y->len);
    size_t xn = xe ? (size_t)(xe - x->base) : x->len, yn = ye ? (size_t)(ye - y->base) : y->len;
    int c = memcmp(x->base, y->base, xn < yn ? xn : yn);

    if (c == 0 && xn != yn)
        return xn < yn ? -1 : 1;
    if (c == 0)
        c = memcmp(x->base, y->base, x->len < y->len ? x->len : y->len);
    if (c == 0 && x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return c;
}

int fingerprint_sort_query(struct span target, char **ret, size_t *ret_len)
{
    const char *q = memchr(target.base, '?', target.len);
    size_t path_len = q ? (size_t)(q - target.base) + 1 : target.len, n = 1, at;
    struct span *params;
    char *out = malloc(target.len + 1);

    if (!out)
        return -ENOMEM;
    memcpy(out, target.base, path_len);
    at = path_len;
    if (q) {
        struct span rest = { q + 1, target.len - path_len };

        for (size_t i = 0; i < rest.len; i++)
            n += rest.base[i] == '&';
        if (!(params = calloc(n, sizeof(*params)))) {
            free(out);
            return -ENOMEM;
        }
        for (size_t i = 0, start = 0, k = 0; i <= rest.len; i++) {
            if (i == rest.len || rest.base[i] == '&') {
                params[k++] = (struct span){ rest.base + start, i - start };
                start = i + 1;
            }
        }
        qsort(params, n, sizeof(*params), param_cmp);
        for (size_t k = 0; k < n; k++) {
            if (k > 0)
                out[at++] = '&';
            if (params[k].len)
                memcpy(out + at, params[k].base, params[k].len);
            at += params[k].len;
        }
        free(params);
    }
    out[at] = '\0';
    *ret = out;
    *ret_len = at;
    return 0;
}

int fingerprint_init(struct fingerprint *fp, struct span method, struct span target)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int r;

    if (!md)
        return -ENOMEM;
    if (EVP_DigestInit_ex(md, digest_sha256(), NULL) != 1) {
        r = -EIO;
        goto fail;
    }
    r = feed_framed(md, method);
    if (r < 0)
        goto fail;
    r = feed_framed(md, target);
    if (r < 0)
        goto fail;
    fp->md = md;
    return 0;

fail:
    EVP_MD_CTX_free(md);
    return r;
}

/* The body goes last, unframed: one EVP_DigestUpdate() per MHD chunk, no copy. */
int fingerprint_update(struct fingerprint *fp, const void *p, size_t n)
{
    if (!fp->md)
        return -EIO;
    if (n == 0)
        return 0;
    if (EVP_DigestUpdate(fp->md, p, n) != 1)
        return -EIO;
    return 0;
}

int fingerprint_final(struct fingerprint *fp, uint8_t ret[FINGERPRINT_LEN])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    int r = 0;

    if (!fp->md)
        return -EIO;
    if (EVP_DigestFinal_ex(fp->md, md, &len) != 1 || len != FINGERPRINT_LEN)
        r = -EIO;
    else
        memcpy(ret, md, FINGERPRINT_LEN);
    fingerprint_done(fp);
    return r;
}

void fingerprint_done(struct fingerprint *fp)
{
    if (!fp)
        return;
    EVP_MD_CTX_free(fp->md);
    fp->md = NULL;
}

void fingerprint_hex(const uint8_t fp[FINGERPRINT_LEN], char ret[FINGERPRINT_HEX + 1])
{
    hex_encode(fp, FINGERPRINT_LEN, ret);
}
