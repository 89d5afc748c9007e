/* SPDX-License-Identifier: MIT */
/* Key sources: the JSON pointer and composite-key helpers, then the table of
 * kinds that a route's `key` names. */
#include "idemproxy/keysource.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "idemproxy/http.h"
#include "idemproxy/request.h"

/* A key is 1-IDEMKEY_MAX bytes of 0x21-0x7E, wherever it comes from (README.md, What
 * it does with each request; doc/configuration.md, Key sources). */
static bool is_key(struct span s) { return http_is_visible(s, IDEMKEY_MAX); }

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

json_t *keysource_pointer_find(json_t *doc, const char *pointer)
{
    char *tok = malloc(strlen(pointer) + 1);
    json_t *v;

    assert(keysource_pointer_check(pointer) == 0);
    if (!tok)
        return NULL;
    v = walk(doc, pointer, tok);
    free(tok);
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

/* ---- the kinds of key source ---- */

/* The names of a source, set once: a problem says why in <why> as
 * "key.<kind>: ...". */
static int set_names(struct keysource *ks, const struct keysource_kind *kind,
                     const char *const *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        ks->names[i] = strdup(items[i]);
        if (!ks->names[i])
            return -ENOMEM;
        ks->nnames = i + 1;
    }
    ks->kind = kind;
    return 0;
}

static int parse_header(struct keysource *ks, const struct keysource_kind *kind,
                        const char *const *items, size_t n, bool is_list, char *why, size_t whylen)
{
    if (is_list || n != 1 || !http_is_token(span_from_cstr(items[0]))) {
        snprintf(why, whylen, "key.header: '%s' is not a header name",
                 is_list ? "a list" : items[0]);
        return -EINVAL;
    }
    return set_names(ks, kind, items, 1);
}

static int parse_headers(struct keysource *ks, const struct keysource_kind *kind,
                         const char *const *items, size_t n, bool is_list, char *why, size_t whylen)
{
    if (!is_list || n == 0) {
        snprintf(why, whylen,
                 "key.headers: a list of one or more header names, e.g. "
                 "[ce-source, ce-id]");
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (!http_is_token(span_from_cstr(items[i]))) {
            snprintf(why, whylen, "key.headers: '%s' is not a header name", items[i]);
            return -EINVAL;
        }
    }
    return set_names(ks, kind, items, n);
}

static int parse_json(struct keysource *ks, const struct keysource_kind *kind,
                      const char *const *items, size_t n, bool is_list, char *why, size_t whylen)
{
    if (is_list || n != 1 || keysource_pointer_check(items[0]) < 0) {
        snprintf(why, whylen,
                 "key.json: '%s' is not a JSON pointer (RFC 6901: \"\" or /member/0/..., ~0 "
                 "for ~ and ~1 for /), e.g. /id",
                 is_list ? "a list" : items[0]);
        return -EINVAL;
    }
    return set_names(ks, kind, items, 1);
}

/* One header, as an Idempotency-Key: a token or an sf-string (README.md, What
 * it does with each request). */
static int read_header(const struct keysource *ks, const struct request *rq,
                       struct keysource_key *ret, char *detail, size_t detaillen)
{
    const char *name = ks->names[0];
    const struct span *v;
    size_t n;

    v = request_header(rq, span_from_cstr(name), &n);
    if (n == 0)
        return KEYSOURCE_MISSING;
    ret->sent = *v; /* for the access line, even when it is refused */
    if (n > 1) {
        snprintf(detail, detaillen, "Send exactly one %s header.", name);
        return KEYSOURCE_INVALID;
    }
    if (idemkey_parse(*v, &ret->parsed) < 0) {
        snprintf(detail, detaillen,
                 "The key of the %s header is 1-255 visible ASCII characters (0x21-0x7E), bare "
                 "or as a quoted sf-string; a bare key may not hold , \" or \\.",
                 name);
        return KEYSOURCE_INVALID;
    }
    ret->key = idemkey_span(&ret->parsed);
    return KEYSOURCE_FOUND;
}

/* A composite of several headers' values, each present once. */
static int read_headers(const struct keysource *ks, const struct request *rq,
                        struct keysource_key *ret, char *detail, size_t detaillen)
{
    struct span values[KEYSOURCE_MAX_NAMES];
    const struct span *v;
    size_t n, len;
    char *text;
    int err;

    for (size_t i = 0; i < ks->nnames; i++) {
        v = request_header(rq, span_from_cstr(ks->names[i]), &n);
        if (n != 1)
            return KEYSOURCE_MISSING;
        values[i] = *v;
    }
    err = keysource_composite(values, ks->nnames, &text, &len);
    if (err == -EINVAL) {
        snprintf(detail, detaillen,
                 "Each key header's value is 1-255 visible ASCII characters "
                 "(0x21-0x7E).");
        return KEYSOURCE_INVALID;
    }
    if (err < 0)
        return err;
    ret->derived = text;
    ret->key = ret->sent = (struct span){ text, len };
    return KEYSOURCE_FOUND;
}

static int read_in_body(const struct keysource *ks, const struct request *rq,
                        struct keysource_key *ret, char *detail, size_t detaillen)
{
    (void)ks, (void)rq, (void)ret, (void)detail, (void)detaillen;
    return KEYSOURCE_IN_BODY;
}

/* An RFC 6901 pointer into a JSON body. */
static int read_json(const struct keysource *ks, struct span body, struct keysource_key *ret,
                     char *detail, size_t detaillen)
{
    int err = keysource_json(body, ks->names[0], &ret->parsed);

    if (err == -ENOENT)
        return KEYSOURCE_MISSING;
    if (err == -EINVAL) {
        snprintf(detail, detaillen,
                 "The key in the JSON body is not a string of 1-255 visible "
                 "ASCII characters (0x21-0x7E) or an integer.");
        return KEYSOURCE_INVALID;
    }
    if (err < 0)
        return err;
    ret->derived = strndup(ret->parsed.buf, ret->parsed.len);
    if (!ret->derived)
        return -ENOMEM;
    ret->key = ret->sent = (struct span){ ret->derived, ret->parsed.len };
    return KEYSOURCE_FOUND;
}

static void describe_header(const struct keysource *ks, char *out, size_t outlen)
{
    snprintf(out, outlen, "This request must carry an %s header.", ks->names[0]);
}

static void describe_headers(const struct keysource *ks, char *out, size_t outlen)
{
    size_t used = (size_t)snprintf(out, outlen, "This request must carry the headers");

    for (size_t i = 0; i < ks->nnames && used < outlen; i++)
        used += (size_t)snprintf(out + used, outlen - used, "%s %s", i ? "," : "", ks->names[i]);
    if (used < outlen)
        snprintf(out + used, outlen - used, ", each once.");
}

static void describe_json(const struct keysource *ks, char *out, size_t outlen)
{
    snprintf(out, outlen,
             "This request must carry a JSON body with its idempotency key at %s (a string or "
             "an integer).",
             ks->names[0][0] ? ks->names[0] : "the top level");
}

/* Keys of different sources never share a store key (doc/configuration.md, Key
 * sources): each source but the key header hashes a tag of its own into the
 * scope, a tag no header value can equal (it holds a NUL). */
#define TAG(s)                                                                                     \
    {                                                                                              \
        .base = s, .len = sizeof(s) - 1                                                            \
    }

struct keysource_kind {
    const char *name; /* the `key` mapping's key */
    int (*parse)(struct keysource *ks, const struct keysource_kind *kind, const char *const *items,
                 size_t n, bool is_list, char *why, size_t whylen);
    int (*read)(const struct keysource *ks, const struct request *rq, struct keysource_key *ret,
                char *detail, size_t detaillen);
    /* NULL: the key is in the header section */
    int (*read_body)(const struct keysource *ks, struct span body, struct keysource_key *ret,
                     char *detail, size_t detaillen);
    void (*describe)(const struct keysource *ks, char *out, size_t outlen);
    struct span tag;
};

static const struct keysource_kind kinds[] = {
    { "header", parse_header, read_header, NULL, describe_header, { NULL, 0 } },
    { "headers", parse_headers, read_headers, NULL, describe_headers, TAG("\0idemproxy:headers") },
    { "json", parse_json, read_in_body, read_json, describe_json, TAG("\0idemproxy:json") },
};

static const struct span fingerprint_tag = TAG("\0idemproxy:fingerprint");

int keysource_set(struct keysource *ks, const char *name, const char *const *items, size_t n,
                  bool is_list, char *why, size_t whylen)
{
    if (strcmp(name, "fallback") == 0) {
        if (is_list || n != 1 || strcmp(items[0], "fingerprint") != 0) {
            snprintf(why, whylen, "key.fallback: '%s' is not a fallback (use fingerprint)",
                     is_list ? "a list" : items[0]);
            return -EINVAL;
        }
        ks->fallback = true;
        return 0;
    }
    for (size_t i = 0; i < ARRAY_SIZE(kinds); i++) {
        if (strcmp(name, kinds[i].name) != 0)
            continue;
        if (ks->kind) {
            snprintf(why, whylen, "key: one source only (header, headers or json)");
            return -EINVAL;
        }
        return kinds[i].parse(ks, &kinds[i], items, n, is_list, why, whylen);
    }
    snprintf(why, whylen, "key: unknown key '%s' (use header, headers or json, and fallback)",
             name);
    return -ENOENT;
}

int keysource_set_default(struct keysource *ks, const char *key_header)
{
    return ks->kind ? 0 : set_names(ks, &kinds[0], &key_header, 1);
}

const char *keysource_name(const struct keysource *ks)
{
    return ks->kind ? ks->kind->name : "header";
}

int keysource_read(const struct keysource *ks, const struct request *rq, struct keysource_key *ret,
                   char *detail, size_t detaillen)
{
    return ks->kind->read(ks, rq, ret, detail, detaillen);
}

int keysource_read_body(const struct keysource *ks, struct span body, struct keysource_key *ret,
                        char *detail, size_t detaillen)
{
    if (!ks->kind->read_body)
        return KEYSOURCE_MISSING;
    return ks->kind->read_body(ks, body, ret, detail, detaillen);
}

struct span keysource_tag(const struct keysource *ks, const struct keysource_key *k)
{
    return k->fingerprint ? fingerprint_tag : ks->kind->tag;
}

int keysource_fingerprint(const uint8_t *digest, size_t len, struct keysource_key *ret)
{
    char *hex = malloc(2 * len + 1);

    if (!hex)
        return -ENOMEM;
    for (size_t i = 0; i < len; i++)
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    free(ret->derived);
    ret->derived = hex;
    ret->key = ret->sent = (struct span){ hex, 2 * len };
    ret->fingerprint = true;
    return KEYSOURCE_FOUND;
}

struct span keysource_sent(const struct keysource *ks, const struct request *rq)
{
    const struct span *v;

    if (ks->kind != &kinds[0])
        return (struct span){ NULL, 0 };
    v = request_header(rq, span_from_cstr(ks->names[0]), NULL);
    return v ? *v : (struct span){ NULL, 0 };
}

void keysource_describe(const struct keysource *ks, char *out, size_t outlen)
{
    ks->kind->describe(ks, out, outlen);
}

void keysource_key_done(struct keysource_key *k)
{
    free(k->derived);
    k->derived = NULL;
}

void keysource_done(struct keysource *ks)
{
    if (!ks)
        return;
    for (size_t i = 0; i < ks->nnames; i++)
        free(ks->names[i]);
    ks->nnames = 0;
    ks->kind = NULL;
    ks->fallback = false;
}
