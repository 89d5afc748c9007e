/* SPDX-License-Identifier: MIT */
/* A route's reconcile: block, pure (reconcile.h): the probe's target and
 * what its answer proves. */
#include "idemproxy/reconcile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "idemproxy/buf.h"
#include "idemproxy/keysource.h"
#include "idemproxy/record.h"

void reconcile_config_init(struct reconcile_config *c)
{
    *c = (struct reconcile_config){ .answer_status = 200,
                                    .settle_ms = RECONCILE_SETTLE_MS,
                                    .every_ms = RECONCILE_EVERY_MS,
                                    .attempts = RECONCILE_ATTEMPTS };
}

void reconcile_config_done(struct reconcile_config *c)
{
    if (!c)
        return;
    free(c->method);
    free(c->target);
    for (size_t i = 0; i < c->nheaders; i++)
        free(c->headers[i]);
    free(c->found.pointer);
    free(c->absent.pointer);
    reconcile_config_init(c);
}

#define BODY_TAG "{body:"

/* The length of the placeholder at <p> ('{'), or 0 when it is not one;
 * <ptr> and <ptr_len> get a {body:} one's pointer. */
static size_t placeholder(const char *p, const char **ptr, size_t *ptr_len)
{
    const char *end = strchr(p, '}');

    *ptr = NULL;
    *ptr_len = 0;
    if (!end)
        return 0;
    if (strncmp(p, "{key}", 5) == 0)
        return 5;
    if (strncmp(p, BODY_TAG, strlen(BODY_TAG)) != 0)
        return 0;
    *ptr = p + strlen(BODY_TAG);
    *ptr_len = (size_t)(end - *ptr);
    if (memchr(*ptr, '{', *ptr_len))
        return 0;
    return (size_t)(end - p) + 1;
}

int reconcile_target_check(const char *tmpl, char *why, size_t whylen)
{
    if (tmpl[0] != '/') {
        snprintf(why, whylen,
                 "'%.200s' does not begin with '/' (a target such as "
                 "/v1/payments?client_reference={key})",
                 tmpl);
        return -EINVAL;
    }
    for (const char *p = tmpl; *p;) {
        const char *ptr;
        size_t ptr_len, n;

        if ((unsigned char)*p < 0x21 || (unsigned char)*p > 0x7e || *p == '#' || *p == '}') {
            snprintf(why, whylen, "'%.200s' holds '%c' (0x%02x) where a target cannot", tmpl,
                     (unsigned char)*p > 0x20 && (unsigned char)*p < 0x7f ? *p : '?',
                     (unsigned char)*p);
            return -EINVAL;
        }
        if (*p != '{') {
            p++;
            continue;
        }
        n = placeholder(p, &ptr, &ptr_len);
        if (n && ptr) {
            char buf[256];

            if (ptr_len >= sizeof(buf))
                n = 0;
            else {
                memcpy(buf, ptr, ptr_len);
                buf[ptr_len] = '\0';
                if (!buf[0] || keysource_pointer_check(buf) < 0)
                    n = 0;
            }
        }
        if (!n) {
            snprintf(why, whylen, "'%.200s': a '{' opens {key} or {body:/pointer} only", tmpl);
            return -EINVAL;
        }
        p += n;
    }
    return 0;
}

bool reconcile_target_reads(const char *tmpl, const char *pointer)
{
    size_t n = strlen(pointer);

    for (const char *p = strchr(tmpl, '{'); p; p = strchr(p + 1, '{')) {
        const char *ptr;
        size_t ptr_len;

        if (placeholder(p, &ptr, &ptr_len) && ptr && ptr_len >= n &&
            strncmp(ptr, pointer, n) == 0 && (ptr_len == n || ptr[n] == '/'))
            return true;
    }
    return false;
}

/* Appends <v> to <out>, percent-encoded but for RFC 3986's unreserved bytes. */
static int append_encoded(struct buf *out, struct span v)
{
    static const char hex[] = "0123456789ABCDEF";

    for (size_t i = 0; i < v.len; i++) {
        unsigned char c = (unsigned char)v.base[i];
        char enc[3] = { '%', hex[c >> 4], hex[c & 15] };
        bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '.' || c == '_' || c == '~';
        int err = plain ? buf_append(out, (const char *)&c, 1) : buf_append(out, enc, 3);

        if (err < 0)
            return err;
    }
    return 0;
}

/* The string at the pointer <ptr> (<len> bytes) of <body>, appended encoded. */
static int append_body(struct buf *out, json_t **doc, struct span body, const char *ptr, size_t len,
                       const char **why)
{
    char pointer[256];
    json_t *v;

    if (!*doc)
        *doc = json_loadb(body.base, body.len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, NULL);
    if (!*doc) {
        *why = "the request body is not JSON, so {body:} finds nothing";
        return -ENOENT;
    }
    memcpy(pointer, ptr, len); /* checked: shorter than the buffer */
    pointer[len] = '\0';
    v = keysource_pointer_find(*doc, pointer);
    if (!v || !json_is_string(v)) {
        *why = "the request body holds no string at a {body:} pointer";
        return -ENOENT;
    }
    return append_encoded(out, (struct span){ json_string_value(v), json_string_length(v) });
}

int reconcile_target_expand(const char *tmpl, struct span key, struct span body, struct buf *out,
                            const char **why)
{
    size_t start = out->len;
    json_t *doc = NULL;
    int err = 0;

    *why = NULL;
    for (const char *p = tmpl; *p && err == 0;) {
        const char *ptr;
        size_t ptr_len, n = *p == '{' ? placeholder(p, &ptr, &ptr_len) : 0;

        if (!n) {
            size_t lit = strcspn(p, "{");

            err = buf_append(out, p, lit ? lit : 1);
            p += lit ? lit : 1;
            continue;
        }
        err = ptr ? append_body(out, &doc, body, ptr, ptr_len, why) : append_encoded(out, key);
        p += n;
    }
    json_decref(doc);
    if (err == 0 && out->len - start > RECONCILE_TARGET_MAX)
        err = -E2BIG;
    if (err == -E2BIG && !*why)
        *why = "the expanded target is longer than 8 KiB";
    if (err < 0)
        out->len = start;
    return err;
}

static bool status_listed(const struct reconcile_rule *r, unsigned status)
{
    for (size_t i = 0; i < r->nstatus; i++) {
        if (r->status[i] == status)
            return true;
    }
    return false;
}

/* The answer a found key keeps: <c>'s status, <v> (or the whole <ans> body
 * when NULL) as JSON. Returns 0, -E2BIG past <max_body>, or -ENOMEM. */
static int found_answer(const struct reconcile_config *c, const struct record *ans, json_t *v,
                        size_t max_body, struct record **ret)
{
    char *text = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    struct span body = v ? span_from_cstr(text ? text : "") : buf_span(&ans->body);
    struct record *rec = NULL;
    int err = v && !text ? -ENOMEM : 0;

    if (err == 0 && body.len > max_body)
        err = -E2BIG;
    if (err == 0 && !(rec = record_new(body.len ? body.len : 1)))
        err = -ENOMEM;
    if (err == 0) {
        rec->status = c->answer_status;
        err = record_add_header(rec, span_from_cstr("Content-Type"),
                                span_from_cstr("application/json"));
    }
    if (err == 0)
        err = record_add_header(rec, span_from_cstr(RECONCILE_HEADER), span_from_cstr("true"));
    if (err == 0)
        err = buf_append(&rec->body, body.base, body.len);
    free(text);
    if (err < 0) {
        record_unref(rec);
        return err;
    }
    *ret = rec;
    return 0;
}

/* The answer's body as JSON (<doc>), leniently: duplicate names, NULs in
 * strings and integers past 64 bits are JSON still. Returns false when it
 * is JSON that jansson cannot read (it begins, past any BOM and blanks, with
 * '{' or '['): that proves nothing, where a body that is not JSON at all
 * has no pointer. */
static bool parse_answer(const struct record *ans, json_t **doc)
{
    struct span b = buf_span(&ans->body);

    *doc = json_loadb(b.base ? b.base : "", b.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (!*doc) /* an integer past 64 bits, perhaps: then its integers are kept as reals */
        *doc = json_loadb(b.base ? b.base : "", b.len,
                          JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL);
    if (*doc)
        return true;
    if (b.len >= 3 && memcmp(b.base, "\xef\xbb\xbf", 3) == 0)
        b.base += 3, b.len -= 3;
    while (b.len && strchr(" \t\r\n", b.base[0]))
        b.base++, b.len--;
    return !(b.len && (b.base[0] == '{' || b.base[0] == '['));
}

int reconcile_judge(const struct reconcile_config *c, const struct record *ans, size_t max_body,
                    struct record **ret, const char **why)
{
    json_t *doc;
    bool readable = parse_answer(ans, &doc);
    json_t *at = doc && c->found.pointer ? keysource_pointer_find(doc, c->found.pointer) : NULL;
    bool found = status_listed(&c->found, ans->status) && (!c->found.pointer || at);
    bool absent = status_listed(&c->absent, ans->status) &&
                  (!c->absent.pointer || !doc || !keysource_pointer_find(doc, c->absent.pointer));
    int verdict = RECONCILE_FAILED, err;

    *ret = NULL;
    if (!readable) {
        *why = "its answer looks like JSON that does not parse";
    } else if (found && absent) {
        *why = "its answer matches both found and absent";
    } else if (absent) {
        *why = "its answer matches absent";
        verdict = RECONCILE_ABSENT;
    } else if (!found) {
        *why = "its answer matches neither found nor absent";
    } else if ((err = found_answer(c, ans, at, max_body, ret)) == 0) {
        *why = "its answer matches found";
        verdict = RECONCILE_FOUND;
    } else if (err == -E2BIG) {
        *why = "its answer matches found, but is larger than the route keeps (max-response)";
    } else {
        verdict = err;
    }
    json_decref(doc);
    return verdict;
}
