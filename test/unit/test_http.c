/* SPDX-License-Identifier: MIT */
/* The HTTP grammar of what clients send: tokens, field values, authorities,
 * request-target forms, and the header sections refused before anything runs. */
#include "check.h"
#include "idemproxy/http.h"

#define H(n, v)                                                                                    \
    {                                                                                              \
        .name = SPAN_LIT(n), .value = SPAN_LIT(v)                                                  \
    }

static struct span mem(const char *p, size_t n) { return (struct span){ .base = p, .len = n }; }

static void check_fields(const struct http_header *h, size_t n, unsigned want)
{
    unsigned status = 0;
    const char *why = http_check_fields(h, n, false, &status);

    if (!want) {
        CHECK(why == NULL);
        return;
    }
    CHECK(why != NULL);
    CHECK_EQ_INT(status, want);
}

static void test_http_framing_clear(void)
{
    const struct http_header none[] = { H("Host", "t") };
    const struct http_header cl[] = { H("Host", "t"), H("content-length", "35") };
    const struct http_header same_twice[] = { H("Content-Length", "7"), H("Content-Length", "7") };
    const struct http_header te[] = { H("Transfer-Encoding", "CHUNKED") };
    const struct http_header symbols[] = { H("X-!#$%&'*+-.^_`|~", "v") };

    check_fields(none, ARRAY_SIZE(none), 0);
    check_fields(cl, ARRAY_SIZE(cl), 0);
    check_fields(same_twice, ARRAY_SIZE(same_twice), 0);
    check_fields(te, ARRAY_SIZE(te), 0);
    check_fields(symbols, ARRAY_SIZE(symbols), 0);
    check_fields(NULL, 0, 0);
}

static void test_http_framing_refused(void)
{
    const struct http_header both[] = { H("Content-Length", "3"),
                                        H("Transfer-Encoding", "chunked") };
    const struct http_header two_cl[] = { H("Content-Length", "0"), H("content-length", "35") };
    const struct http_header cl_list[] = { H("Content-Length", "0, 35") };
    const struct http_header cl_sign[] = { H("Content-Length", "+3") };
    const struct http_header cl_empty[] = { H("Content-Length", "") };
    const struct http_header two_te[] = { H("Transfer-Encoding", "chunked"),
                                          H("Transfer-Encoding", "chunked") };
    const struct http_header space_name[] = { H("Transfer-Encoding ", "chunked") };
    const struct http_header colon_name[] = { H("Content-Length:0", "35") };
    const struct http_header empty_name[] = { H("", "v") };
    const struct http_header te_list[] = { H("Transfer-Encoding", "chunked, identity") };
    const struct http_header te_gzip[] = { H("Transfer-Encoding", "gzip, chunked") };
    const struct http_header te_x[] = { H("Transfer-Encoding", "xchunked") };

    check_fields(both, ARRAY_SIZE(both), 400);
    check_fields(two_cl, ARRAY_SIZE(two_cl), 400);
    check_fields(cl_list, ARRAY_SIZE(cl_list), 400);
    check_fields(cl_sign, ARRAY_SIZE(cl_sign), 400);
    check_fields(cl_empty, ARRAY_SIZE(cl_empty), 400);
    check_fields(two_te, ARRAY_SIZE(two_te), 400);
    check_fields(space_name, ARRAY_SIZE(space_name), 400);
    check_fields(colon_name, ARRAY_SIZE(colon_name), 400);
    check_fields(empty_name, ARRAY_SIZE(empty_name), 400);
    check_fields(te_list, ARRAY_SIZE(te_list), 501);
    check_fields(te_gzip, ARRAY_SIZE(te_gzip), 501);
    check_fields(te_x, ARRAY_SIZE(te_x), 501);
}

/* Every control byte but HTAB, and DEL, in any value: 400 before anything
 * runs; HTAB and 8-bit bytes are field content. */
static void test_http_field_bytes(void)
{
    unsigned status = 0;
    char v[8];

    for (unsigned c = 0; c < 256; c++) {
        struct http_header h = { .name = SPAN_LIT("X"), .value = mem(v, 3) };
        bool bad = (c < 0x20 && c != '\t') || c == 0x7f;

        memcpy(v, "a?b", 3);
        v[1] = (char)c;
        CHECK(http_is_field_value(h.value) == !bad);
        CHECK((http_check_fields(&h, 1, false, &status) != NULL) == bad);
    }
    CHECK(http_is_field_value(SPAN_LIT("")));
    CHECK(!http_is_field_value(SPAN_LIT("a\rTransfer-Encoding: chunked")));
    CHECK(!http_is_field_value(mem("abc\0zzz", 7)));
}

static void test_http_host_field(void)
{
    const struct http_header two[] = { H("Host", "a"), H("host", "b") };
    const struct http_header bad[] = { H("Host", "a b") };
    const struct http_header userinfo[] = { H("Host", "u@h") };
    const struct http_header slash[] = { H("Host", "h/x") };
    const struct http_header port[] = { H("Host", "h:80x") };
    const struct http_header good[] = { H("Host", "api.example.com:8443") };
    const struct http_header v6[] = { H("Host", "[::1]:8080") };
    const struct http_header empty[] = { H("Host", "") };
    unsigned status = 0;

    check_fields(two, ARRAY_SIZE(two), 400);
    check_fields(bad, ARRAY_SIZE(bad), 400);
    check_fields(userinfo, ARRAY_SIZE(userinfo), 400);
    check_fields(slash, ARRAY_SIZE(slash), 400);
    check_fields(port, ARRAY_SIZE(port), 400);
    check_fields(good, ARRAY_SIZE(good), 0);
    check_fields(v6, ARRAY_SIZE(v6), 0);
    check_fields(empty, ARRAY_SIZE(empty), 0);
    /* HTTP/1.1 requires one */
    CHECK(http_check_fields(NULL, 0, true, &status) != NULL);
    CHECK_EQ_INT(status, 400);
    CHECK(http_check_fields(good, 1, true, &status) == NULL);
}

static void test_http_authority(void)
{
    CHECK(http_is_authority(SPAN_LIT("127.0.0.1:8080"), false));
    CHECK(http_is_authority(SPAN_LIT("a-b.example"), false));
    CHECK(http_is_authority(SPAN_LIT("[2001:db8::1]"), false));
    CHECK(http_is_authority(SPAN_LIT("h:"), false));
    CHECK(http_is_authority(SPAN_LIT("%41"), false));
    CHECK(!http_is_authority(SPAN_LIT(""), false));
    CHECK(http_is_authority(SPAN_LIT(""), true));
    CHECK(!http_is_authority(SPAN_LIT("user@host"), false));
    CHECK(!http_is_authority(SPAN_LIT("user:pw@host"), false));
    CHECK(!http_is_authority(SPAN_LIT("[::1"), false));
    CHECK(!http_is_authority(SPAN_LIT("[]"), false));
    CHECK(!http_is_authority(SPAN_LIT("[::1]x"), false));
    CHECK(!http_is_authority(SPAN_LIT("h:1:2"), false));
    CHECK(!http_is_authority(SPAN_LIT("%4"), false));
    CHECK(!http_is_authority(SPAN_LIT("h\r\nX: y"), false));
}

/* Returns the status the request line gets (0: accepted, <ret> filled). */
static unsigned line(const char *method, struct span target, struct http_target *ret)
{
    unsigned status = 0;
    struct http_target t = { .form = HTTP_TARGET_ASTERISK };

    if (!http_check_request_line(span_from_cstr(method), target, &t, &status)) {
        *ret = t;
        return 0;
    }
    CHECK(t.form == HTTP_TARGET_ASTERISK); /* untouched on refusal */
    return status;
}

static bool span_is(struct span s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.base, lit, s.len) == 0;
}

static void test_http_target_forms(void)
{
    struct http_target t;

    CHECK_EQ_INT(line("POST", SPAN_LIT("/pay?x=1&y=%20"), &t), 0);
    CHECK(t.form == HTTP_TARGET_ORIGIN && span_is(t.path, "/pay?x=1&y=%20") && !t.needs_slash);
    CHECK_EQ_INT(line("GET", SPAN_LIT("//127.0.0.1:6202/x"), &t), 0); /* a path, nothing else */
    CHECK(t.form == HTTP_TARGET_ORIGIN);
    CHECK_EQ_INT(line("GET", SPAN_LIT("/caf\xc3\xa9"), &t), 0); /* 8-bit bytes go on as sent */

    CHECK_EQ_INT(line("POST", SPAN_LIT("http://api.example:8080/v1/p?q=1"), &t), 0);
    CHECK(t.form == HTTP_TARGET_ABSOLUTE && span_is(t.path, "/v1/p?q=1") && !t.needs_slash);
    CHECK(span_is(t.authority, "api.example:8080"));
    CHECK_EQ_INT(line("GET", SPAN_LIT("HTTPS://h"), &t), 0);
    CHECK(t.form == HTTP_TARGET_ABSOLUTE && t.path.len == 0 && t.needs_slash);
    CHECK(span_is(t.authority, "h"));
    CHECK_EQ_INT(line("GET", SPAN_LIT("http://h?q"), &t), 0);
    CHECK(span_is(t.path, "?q") && t.needs_slash);
    CHECK_EQ_INT(line("GET", SPAN_LIT("http://[::1]:1/"), &t), 0);
    CHECK(span_is(t.authority, "[::1]:1"));

    CHECK_EQ_INT(line("OPTIONS", SPAN_LIT("*"), &t), 0);
    CHECK(t.form == HTTP_TARGET_ASTERISK && span_is(t.path, "*"));
    CHECK_EQ_INT(line("GET", SPAN_LIT("*"), &t), 400);
    CHECK_EQ_INT(line("OPTIONS", SPAN_LIT("**"), &t), 400);
}

static void test_http_target_refused(void)
{
    static const char *const bad[] = {
        "@127.0.0.1:6202/x", /* glued to a base URL, this was user info and another host */
        "1/x",               /* ... and this another port */
        ".other.example/x",
        ":6202/x",
        "127.0.0.1:80",  /* authority-form, for CONNECT only */
        "x",             /* a bare word */
        "",              /* nothing */
        "/a b",          /* a space the HTTP layer let into the target */
        "/a\tb",         /* ... a tab */
        "/a\rb",         /* ... a CR */
        "/a#frag",       /* a fragment is not part of a request target */
        "/a\x7f",        /* DEL */
        "ftp://h/x",     /* another scheme */
        "http://",       /* no authority */
        "http:///x",     /* no authority */
        "http://u@h/x",  /* user info */
        "http://u:p@h/", /* user info */
        "http://h:80@evil/x",
        "http://h x/",     /* a space in the authority */
        "http://h/a b",    /* a space in the path */
        "http://h/a#f",    /* a fragment */
        "http://h\\@e/x",  /* a backslash is no authority byte */
        "http:/h/x",       /* not "://" */
        "mailto:a@b",      /* not http */
        "\\\\evil\\share", /* not a path */
    };
    struct http_target t;

    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        unsigned st = line("GET", span_from_cstr(bad[i]), &t);

        if (st != 400)
            fprintf(stderr, "target '%s' got %u\n", bad[i], st);
        CHECK_EQ_INT(st, 400);
    }
    CHECK_EQ_INT(line("GET", mem("/a\0b", 4), &t), 400); /* a NUL */
    CHECK_EQ_INT(line("CONNECT", SPAN_LIT("127.0.0.1:80"), &t), 501);
    CHECK_EQ_INT(line("CONNECT", SPAN_LIT("/x"), &t), 501);
    CHECK_EQ_INT(line("G\rET", SPAN_LIT("/x"), &t), 400); /* a method that is not a token */
    CHECK_EQ_INT(line("GET /x HTTP/1.1\r\nX:", SPAN_LIT("/y"), &t), 400);
    CHECK_EQ_INT(line("", SPAN_LIT("/y"), &t), 400);
}

static void test_http_percent_decode(void)
{
    char out[32];
    size_t n = 99;

    CHECK_EQ_INT(http_percent_decode(SPAN_LIT("a%2Fb%41%7e"), out, &n), 0);
    CHECK(n == 5 && memcmp(out, "a/bA~", 5) == 0);
    CHECK_EQ_INT(http_percent_decode(SPAN_LIT("abc%00zzz"), out, &n), 0);
    CHECK(n == 7 && memcmp(out, "abc\0zzz", 7) == 0); /* the NUL is there for the caller */
    CHECK_EQ_INT(http_percent_decode(SPAN_LIT(""), out, &n), 0);
    CHECK_EQ_INT(n, 0);
    n = 99;
    CHECK_EQ_INT(http_percent_decode(SPAN_LIT("a%2"), out, &n), -EINVAL);
    CHECK_EQ_INT(http_percent_decode(SPAN_LIT("a%zz"), out, &n), -EINVAL);
    CHECK_EQ_INT(http_percent_decode(SPAN_LIT("%"), out, &n), -EINVAL);
    CHECK_EQ_INT(n, 99); /* untouched on failure */
}

/* 1 to <max> visible ASCII characters: a key, a request id, a resource id. */
static void test_http_is_visible(void)
{
    CHECK(http_is_visible(SPAN_LIT("!abc~"), 5));
    CHECK(!http_is_visible(SPAN_LIT("!abc~"), 4));
    CHECK(!http_is_visible(SPAN_LIT(""), 5));
    CHECK(!http_is_visible((struct span){ NULL, 0 }, 5));
    CHECK(!http_is_visible(SPAN_LIT("a b"), 5));
    CHECK(!http_is_visible(SPAN_LIT("a\x7f"), 5));
    CHECK(!http_is_visible(SPAN_LIT("a\x80"), 5));
    CHECK(!http_is_visible((struct span){ "a\0b", 3 }, 5));
}

TEST_MAIN(test_http_is_visible, test_http_framing_clear, test_http_framing_refused, test_http_field_bytes,
          test_http_host_field, test_http_authority, test_http_target_forms,
          test_http_target_refused, test_http_percent_decode)
