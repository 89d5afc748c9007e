/* SPDX-License-Identifier: MIT */
#include "idemproxy/keysource.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

/* A key is 1-IDEMKEY_MAX bytes of 0x21-0x7E, wherever it comes from (SPEC §1, §6). */
static bool is_key(struct span s)
{
    if (!s.base || s.len == 0 || s.len > IDEMKEY_MAX)
        return false;
    for (size_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)s.base[i];

        if (c < 0x21 || c > 0x7e)
            return false;
    }
    return true;
}

int keysource_pointer_check(const char *pointer)
{
    if (!pointer || (pointer[0] != '\0' && pointer[0] != '/'))
        return -EINVAL;
    for (const char *p = pointer; *p; p++) {
        if (*p == '~' && p[1] != '0' && p[1] != '1')
            return -EINVAL; /* p[1] is at worst the NUL */
    }
    return 0;
}

/* RFC 6901 §4: on an array a token is "0" or a decimal without leading zeros;
 * "-" (past the end) and anything else find nothing. */
static bool array_index(const char *t, size_t len, size_t size, size_t *ret)
{
    size_t i = 0;

    if (len == 0 || (t[0] == '0' && len > 1))
        return false;
    for (size_t k = 0; k < len; k++) {
        if (t[k] < '0' || t[k] > '9')
            return false;
        i = i * 10 + (size_t)(t[k] - '0');
        if (i >= size)
            return false; /* and so i * 10 never wraps: size is far below SIZE_MAX / 10 */
    }
    *ret = i;
    return true;
}

/* The value the token <t> (<len> bytes, unescaped) designates in <v>, or NULL. */
static json_t *step(json_t *v, const char *t, size_t len)
{
    size_t i;

    if (json_is_object(v))
        return json_object_getn(v, t, len); /* names compare byte for byte, by length */
    if (json_is_array(v) && array_index(t, len, json_array_size(v), &i))
        return json_array_get(v, i);
    return NULL;
}

/* Walks the checked <pointer> from <doc>, each token unescaped into <tok>
 * (as long as the pointer: a token only shrinks). Iterative: the depth is the
 * pointer's, and jansson already bounds the document's. */
static json_t *walk(json_t *doc, const char *pointer, char *tok)
{
    json_t *v = doc;
    const char *p = pointer;

    while (v && *p == '/') {
        size_t n = 0;

        for (p++; *p && *p != '/'; p++) {
            if (*p == '~') {
                p++; /* RFC 6901 §4: ~1 then ~0, so "~01" is "~1" */
                tok[n++] = *p == '1' ? '/' : '~';
            } else {
                tok[n++] = *p;
            }
        }
        v = step(v, tok, n);
    }
    return v;
}

/* The key a found value makes: a valid key string, or an integer's decimal text. */
static int key_of(const json_t *v, struct idemkey *ret)
{
    struct idemkey k = { .len = 0 };

    if (json_is_integer(v)) {
        /* At most 20 characters ("-9223372036854775808"): k.buf has room and a NUL. */
        int n = snprintf(k.buf, sizeof(k.buf), "%" JSON_INTEGER_FORMAT, json_integer_value(v));

        if (n <= 0 || (size_t)n >= sizeof(k.buf))
            return -EINVAL;
        k.len = (size_t)n;
    } else if (json_is_string(v)) {
        struct span s = { .base = json_string_value(v), .len = json_string_length(v) };

        if (!is_key(s))
            return -EINVAL;
        memcpy(k.buf, s.base, s.len);
        k.len = s.len;
    } else {
        return -EINVAL; /* real, true, false, null, object, array */
    }
    *ret = k;
    return 0;
}

int keysource_json(struct span body, const char *pointer, struct idemkey *ret)
{
    json_error_t err;
    json_t *doc, *v;
    char *tok = NULL;
    int r;

    assert(keysource_pointer_check(pointer) == 0); /* checked when the config was read */
    if (!body.base)
        return -ENOENT;
    /* JSON_DECODE_ANY: a body that is a bare string or integer is a key for "". */
    doc = json_loadb(body.base, body.len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
    if (!doc)
        return json_error_code(&err) == json_error_out_of_memory ? -ENOMEM : -ENOENT;
    if (pointer[0] != '\0') {
        tok = malloc(strlen(pointer));
        if (!tok) {
            r = -ENOMEM;
            goto out;
        }
    }
    v = walk(doc, pointer, tok);
    r = v ? key_of(v, ret) : -ENOENT;
out:
    free(tok);
    json_decref(doc);
    return r;
}

int keysource_composite(const struct span *values, size_t n, char **ret, size_t *ret_len)
{
    size_t len = 0;
    char *s, *p;

    if (n == 0)
        return -EINVAL;
    if (n > SIZE_MAX / (IDEMKEY_MAX + 1))
        return -ENOMEM; /* no allocation could hold it; and so <len> below never wraps */
    for (size_t i = 0; i < n; i++) {
        if (!is_key(values[i]))
            return -EINVAL;
        len += values[i].len + 1; /* the value, then a space or the NUL */
    }
    s = malloc(len);
    if (!s)
        return -ENOMEM;
    p = s;
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            *p++ = ' ';
        memcpy(p, values[i].base, values[i].len);
        p += values[i].len;
    }
    *p = '\0';
    *ret = s;
    *ret_len = len - 1;
    return 0;
}
