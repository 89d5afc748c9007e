/* SPDX-License-Identifier: MIT */
/* The raw request target as forwarded upstream: whether it goes into the
 * request line verbatim, the URL composed from the base URL and it (then
 * parsed by libcurl's URL API, as the transfer does), and the request
 * fingerprint over method, target and body.
 *
 * Input: one selector byte, then "<method> <target>" (no space: the method is
 * POST and all of it is the target). A selector with bit 7 set takes the base
 * URL from the input too, up to the first '\n'. */
#include <stdlib.h>

#include <curl/curl.h>

#include "fuzz.h"
#include "idemproxy/buf.h"
#include "idemproxy/fingerprint.h"
#include "idemproxy/upstream.h"

static const char *const bases[] = {
    "http://127.0.0.1:8080",        "http://127.0.0.1:3000/api",
    "https://api.example.com/v1/x", "http://[::1]:9000",
    "http://user:pw@host:80/p",     "http://h",
    "https://h:443/a%20b/c.d/",     "http://h/", /* a trailing '/' is stripped before, not here */
};

/* The bytes that end or split a request line's target: SP, the controls
 * (NUL included) and DEL. A target goes out verbatim exactly when it is in
 * origin-form and holds none of them (8-bit bytes do go out as received). */
static bool splits_request_line(struct span t)
{
    static const char splitters[] = "\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c\r\x0e\x0f"
                                    "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c"
                                    "\x1d\x1e\x1f \x7f";

    for (size_t i = 0; i < t.len; i++) {
        if (t.base[i] == '\0' || strchr(splitters, t.base[i]))
            return true;
    }
    return false;
}

static void check_compose(struct span base, struct span target)
{
    struct buf url = BUF_INIT(1 << 20), small = BUF_INIT(base.len + target.len);
    size_t at = 123;
    bool verbatim = upstream_target_verbatim(target);

    FUZZ_CHECK(verbatim ==
               (target.len > 0 && target.base[0] == '/' && !splits_request_line(target)));
    FUZZ_CHECK(buf_append(&url, "x", 1) == 0); /* it appends: offsets count from the start */
    FUZZ_CHECK(upstream_compose_url(base, upstream_prefix_at(base), target, &url, &at) == 0);
    FUZZ_CHECK(url.len == 1 + base.len + target.len + 1 && url.data[url.len - 1] == '\0');
    FUZZ_CHECK(!base.len || memcmp(url.data + 1, base.base, base.len) == 0);
    FUZZ_CHECK(!target.len || memcmp(url.data + 1 + base.len, target.base, target.len) == 0);
    if (!verbatim) {
        FUZZ_CHECK(at == SIZE_MAX);
    } else {
        /* The request line gets the base URL's path prefix, then the target:
         * the prefix as upstream_new() found it before the factoring. */
        FUZZ_CHECK(at >= 1 && at <= 1 + base.len && url.data[at] == '/');
        if (!memchr(base.base, '\0', base.len)) {
            char *copy = fuzz_strdup(base);
            const char *prefix = strstr(copy, "://");

            prefix = prefix ? prefix + 3 : copy;
            prefix += strcspn(prefix, "/");
            FUZZ_CHECK(at - 1 == (size_t)(prefix - copy));
            free(copy);
        }
    }
    /* One byte short of room: refused, nothing appended, <at> untouched. */
    at = 7;
    FUZZ_CHECK(upstream_compose_url(base, upstream_prefix_at(base), target, &small, &at) == -E2BIG);
    FUZZ_CHECK(small.len == 0 && at == 7);
    buf_done(&small);

    /* libcurl's URL parser reads it as the transfer's CURLOPT_URL does. */
    if (!memchr(url.data + 1, '\0', url.len - 1 - 1)) {
        CURLU *u = curl_url();
        char *s = NULL;

        FUZZ_CHECK(u != NULL);
        if (curl_url_set(u, CURLUPART_URL, url.data + 1, CURLU_PATH_AS_IS) == CURLUE_OK) {
            if (curl_url_get(u, CURLUPART_URL, &s, 0) == CURLUE_OK)
                curl_free(s);
            s = NULL;
            if (curl_url_get(u, CURLUPART_PATH, &s, 0) == CURLUE_OK)
                curl_free(s);
            s = NULL;
            if (curl_url_get(u, CURLUPART_QUERY, &s, 0) == CURLUE_OK)
                curl_free(s);
        }
        curl_url_cleanup(u);
    }
    buf_done(&url);
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
    struct span base, method = SPAN_LIT("POST"), target;
    const char *sp, *nl;

    if (size == 0)
        return 0;
    if (data[0] & 0x80) {
        nl = memchr(in.base, '\n', in.len);
        if (!nl)
            return 0;
        base = (struct span){ .base = in.base, .len = (size_t)(nl - in.base) };
        in.len -= base.len + 1;
        in.base = nl + 1;
    } else {
        base = span_from_cstr(bases[data[0] % ARRAY_SIZE(bases)]);
    }
    sp = in.len ? memchr(in.base, ' ', in.len) : NULL;
    if (sp) {
        method = (struct span){ .base = in.base, .len = (size_t)(sp - in.base) };
        target = (struct span){ .base = sp + 1, .len = in.len - method.len - 1 };
    } else {
        target = in;
    }
    check_compose(base, target);
    check_fingerprint(method, target);
    return 0;
}
