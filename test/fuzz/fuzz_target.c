/* SPDX-License-Identifier: MIT */
/* The request target, from the client's bytes to where the request goes:
 * http_check_request_line() (which forms are accepted, and what of them is
 * forwarded), upstream_base_parse() (the fixed origin and path prefix of
 * --upstream) and upstream_request_target() (the request line's target).
 *
 * The property of doc/guarantees.md (Threat model), for every input: whatever
 * the method and target, the connection goes to the --upstream origin and
 * nowhere else, with no user info, and the request line's target starts with
 * the upstream's path prefix and holds nothing that splits a request line. The
 * origin is checked as libcurl's URL API reads it back, and so is the origin
 * with the request target glued to it (what the old code handed to curl).
 * Also: the fingerprint does not depend on how the body is chunked, and its
 * framing keeps method and target apart.
 *
 * Input: one selector byte, then "<method> <target>" (no space: the method is
 * POST and all of it is the target). A selector with bit 7 set takes the base
 * URL from the input too, up to the first '\n'. */
#include <stdlib.h>
#include <strings.h>

#include <curl/curl.h>

#include "fuzz.h"
#include "idemproxy/buf.h"
#include "idemproxy/fingerprint.h"
#include "idemproxy/http.h"
#include "idemproxy/upstream.h"

static const char *const bases[] = {
    "http://127.0.0.1:8080",        "http://127.0.0.1:3000/api",
    "https://api.example.com/v1/x", "http://[::1]:9000",
    "http://localhost:6101",        "http://h",
    "https://h:443/a%20b/c.d/",     "http://h/",
};

/* Where a URL goes, as libcurl's URL API reads it. */
struct dest {
    char *scheme, *host, *port, *user, *password;
};

static void dest_done(struct dest *d)
{
    curl_free(d->scheme);
    curl_free(d->host);
    curl_free(d->port);
    curl_free(d->user);
    curl_free(d->password);
}

static int dest_parse(const char *url, struct dest *ret)
{
    CURLU *u = curl_url();
    int r = -EINVAL;

    FUZZ_CHECK(u != NULL);
    *ret = (struct dest){ .scheme = NULL };
    if (curl_url_set(u, CURLUPART_URL, url, CURLU_PATH_AS_IS) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &ret->scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &ret->host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &ret->port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
        (void)curl_url_get(u, CURLUPART_USER, &ret->user, 0);
        (void)curl_url_get(u, CURLUPART_PASSWORD, &ret->password, 0);
        r = 0;
    }
    curl_url_cleanup(u);
    return r;
}

static bool same_dest(const struct dest *a, const struct dest *b)
{
    return strcmp(a->scheme, b->scheme) == 0 && strcasecmp(a->host, b->host) == 0 &&
           strcmp(a->port, b->port) == 0;
}

static bool splits_request_line(struct span t)
{
    for (size_t i = 0; i < t.len; i++) {
        unsigned char c = (unsigned char)t.base[i];

        if (c <= 0x20 || c == 0x7f)
            return true;
    }
    return false;
}

static bool span_is(struct span s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.base, lit, s.len) == 0;
}

/* What the proxy forwards for an accepted target: its path, "/" first when
 * the absolute-form had none. */
static char *forwarded(const struct http_target *t)
{
    char *p = malloc(t->path.len + 2);

    FUZZ_CHECK(p != NULL);
    p[0] = '/';
    memcpy(p + (t->needs_slash ? 1 : 0), t->path.base, t->path.len);
    p[t->path.len + (t->needs_slash ? 1 : 0)] = '\0';
    return p;
}

/* The accepted forms are exactly what doc/guarantees.md (Threat model) names. */
static void check_form(struct span method, struct span target, const struct http_target *t)
{
    FUZZ_CHECK(!span_is(method, "CONNECT"));
    FUZZ_CHECK(http_is_token(method));
    switch (t->form) {
    case HTTP_TARGET_ORIGIN:
        FUZZ_CHECK(t->path.base == target.base && t->path.len == target.len);
        FUZZ_CHECK(http_is_origin_form(target));
        break;
    case HTTP_TARGET_ASTERISK:
        FUZZ_CHECK(span_is(method, "OPTIONS") && span_is(target, "*"));
        break;
    case HTTP_TARGET_ABSOLUTE:
        FUZZ_CHECK(strncasecmp(target.base, "http://", target.len < 7 ? target.len : 7) == 0 ||
                   strncasecmp(target.base, "https://", target.len < 8 ? target.len : 8) == 0);
        FUZZ_CHECK(t->authority.len > 0 && !memchr(t->authority.base, '@', t->authority.len));
        FUZZ_CHECK(http_is_authority(t->authority, false));
        FUZZ_CHECK(t->path.base + t->path.len == target.base + target.len);
        FUZZ_CHECK(t->needs_slash == (t->path.len == 0 || t->path.base[0] != '/'));
        break;
    }
    FUZZ_CHECK(!splits_request_line(t->path) && !memchr(t->path.base, '#', t->path.len));
}

static void check_destination(const char *base_url, struct span method, struct span target)
{
    struct upstream_base base;
    struct http_target t;
    struct dest want, got;
    struct buf line = BUF_INIT(1 << 20), small;
    unsigned status = 0;
    const char *why;
    char *fwd, *glued;
    size_t plen;

    why = http_check_request_line(method, target, &t, &status);
    if (why) {
        FUZZ_CHECK(status == 400 || status == 501);
        FUZZ_CHECK((status == 501) == span_is(method, "CONNECT"));
        FUZZ_CHECK(*why);
    } else {
        check_form(method, target, &t);
    }
    if (upstream_base_parse(base_url, &base) < 0)
        return; /* start-up refuses it: nothing is ever forwarded there */
    /* the origin is the base's, and carries no user info, path or query */
    FUZZ_CHECK(dest_parse(base_url, &want) == 0);
    FUZZ_CHECK(!want.user && !want.password);
    FUZZ_CHECK(dest_parse(base.origin, &got) == 0);
    FUZZ_CHECK(same_dest(&want, &got) && !got.user && !got.password);
    dest_done(&got);
    plen = strlen(base.origin);
    FUZZ_CHECK(plen > 0 && base.origin[plen - 1] == '/' && !strchr(base.origin, '?'));
    FUZZ_CHECK(strstr(base_url, base.prefix) != NULL);
    FUZZ_CHECK(!*base.prefix || base.prefix[strlen(base.prefix) - 1] != '/');

    if (!why) {
        fwd = t.form == HTTP_TARGET_ASTERISK ? strdup("*") : forwarded(&t);
        FUZZ_CHECK(fwd != NULL);
        FUZZ_CHECK(upstream_request_target(span_from_cstr(base.prefix), span_from_cstr(fwd),
                                           &line) == 0);
        FUZZ_CHECK(line.len >= 1 && line.data[line.len - 1] == '\0');
        FUZZ_CHECK(strncmp(line.data, base.prefix, strlen(base.prefix)) == 0);
        FUZZ_CHECK(!splits_request_line((struct span){ line.data, line.len - 1 }));
        if (strcmp(fwd, "*") == 0 && !*base.prefix)
            FUZZ_CHECK(strcmp(line.data, "*") == 0);
        else
            FUZZ_CHECK(line.data[0] == '/');
        if (line.data[0] == '/') {
            /* even glued to the origin, the target cannot name another place */
            glued = malloc(plen + line.len);
            FUZZ_CHECK(glued != NULL);
            memcpy(glued, base.origin, plen - 1);
            memcpy(glued + plen - 1, line.data, line.len);
            if (dest_parse(glued, &got) == 0) {
                FUZZ_CHECK(same_dest(&want, &got) && !got.user && !got.password);
                dest_done(&got);
            }
            free(glued);
        }
        /* one byte short of room: refused, nothing appended */
        small = BUF_INIT(line.len - 1);
        FUZZ_CHECK(upstream_request_target(span_from_cstr(base.prefix), span_from_cstr(fwd),
                                           &small) == -E2BIG);
        FUZZ_CHECK(small.len == 0);
        buf_done(&small);
        free(fwd);
    }
    /* what is not "*" nor origin-form never reaches the request line */
    if (!http_is_origin_form(target) && !span_is(target, "*")) {
        size_t before = line.len;

        FUZZ_CHECK(upstream_request_target(span_from_cstr(base.prefix), target, &line) == -EINVAL);
        FUZZ_CHECK(line.len == before);
    }
    dest_done(&want);
    buf_done(&line);
    upstream_base_done(&base);
}

static void digest(struct span method, struct span target, struct span body, size_t chunk,
                   uint8_t ret[FINGERPRINT_LEN])
{
    struct fingerprint fp = { .md = NULL };

    FUZZ_CHECK(fingerprint_init(&fp, method, target) == 0);
    for (size_t off = 0; off < body.len; off += chunk) {
        size_t n = body.len - off < chunk ? body.len - off : chunk;

        FUZZ_CHECK(fingerprint_update(&fp, body.base + off, n) == 0);
    }
    FUZZ_CHECK(fingerprint_final(&fp, ret) == 0);
    fingerprint_done(&fp);
}

/* Chunking the body changes nothing; moving a byte from the target to the
 * method changes the fingerprint (each is framed with its length). */
static void check_fingerprint(struct span method, struct span target)
{
    uint8_t a[FINGERPRINT_LEN], b[FINGERPRINT_LEN];
    char hex[FINGERPRINT_HEX + 1];

    digest(method, target, target, target.len ? target.len : 1, a);
    digest(method, target, target, 3, b);
    FUZZ_CHECK(memcmp(a, b, sizeof(a)) == 0);
    fingerprint_hex(a, hex);
    FUZZ_CHECK(strlen(hex) == FINGERPRINT_HEX);
    if (target.len > 0 && method.base + method.len + 1 == target.base) {
        /* method and target are adjacent in the input around one space */
        struct span m2 = { .base = method.base, .len = method.len + 1 };
        struct span t2 = { .base = target.base, .len = target.len };

        digest(m2, t2, target, 7, b);
        FUZZ_CHECK(memcmp(a, b, sizeof(a)) != 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct span in = { .base = (const char *)data + 1, .len = size ? size - 1 : 0 };
    struct span method = SPAN_LIT("POST"), target;
    const char *sp, *nl;
    char *base;

    if (size == 0)
        return 0;
    if (data[0] & 0x80) {
        nl = memchr(in.base, '\n', in.len);
        if (!nl)
            return 0;
        base = fuzz_strdup((struct span){ .base = in.base, .len = (size_t)(nl - in.base) });
        in.len -= (size_t)(nl - in.base) + 1;
        in.base = nl + 1;
    } else {
        struct upstream_base listed;

        base = strdup(bases[data[0] % ARRAY_SIZE(bases)]);
        FUZZ_CHECK(base != NULL);
        FUZZ_CHECK(upstream_base_parse(base, &listed) == 0); /* a valid --upstream */
        upstream_base_done(&listed);
    }
    sp = in.len ? memchr(in.base, ' ', in.len) : NULL;
    if (sp) {
        method = (struct span){ .base = in.base, .len = (size_t)(sp - in.base) };
        target = (struct span){ .base = sp + 1, .len = in.len - method.len - 1 };
    } else {
        target = in;
    }
    check_destination(base, method, target);
    check_fingerprint(method, target);
    free(base);
    return 0;
}
