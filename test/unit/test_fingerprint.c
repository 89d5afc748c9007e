/* SPDX-License-Identifier: MIT */
#include <openssl/evp.h>

#include "check.h"
#include "idemproxy/fingerprint.h"
#include "idemproxy/http.h"

/* The fingerprint of one request, body fed in one update (or none if empty). */
static void fp_of(const char *method, const char *target, const char *body, size_t body_len,
                  uint8_t ret[FINGERPRINT_LEN])
{
    struct fingerprint fp = { .md = NULL };

    CHECK_EQ_INT(fingerprint_init(&fp, span_from_cstr(method), span_from_cstr(target)), 0);
    CHECK(fp.md != NULL);
    CHECK_EQ_INT(fingerprint_update(&fp, body, body_len), 0);
    CHECK_EQ_INT(fingerprint_final(&fp, ret), 0);
    CHECK(fp.md == NULL); /* final releases the context */
}

static void test_fingerprint_known_answer(void)
{
    uint8_t d[FINGERPRINT_LEN];
    char hex[FINGERPRINT_HEX + 1];

    /* SHA-256(be64(4) "POST" be64(6) "/a?x=1" "{\"n\":1}"), computed in Python. */
    fp_of("POST", "/a?x=1", "{\"n\":1}", 7, d);
    fingerprint_hex(d, hex);
    CHECK_EQ_STR(hex, "2271f7361f5b0226f2b4e1da9809b03257104d1ae8f9e5354d0659732e5ae59f");
    CHECK_EQ_INT(strlen(hex), FINGERPRINT_HEX);
}

/* The framed input (README.md, What it does with each request: The
 * fingerprint), built here byte by byte and hashed in one call of OpenSSL's:
 * what fingerprint_* computes incrementally must be the same. */
static void framed_sha256(const char *method, const char *target, const char *body, size_t n,
                          uint8_t ret[FINGERPRINT_LEN])
{
    unsigned char in[512];
    size_t len = 0;
    const char *parts[] = { method, target };

    for (size_t p = 0; p < 2; p++) {
        uint64_t l = strlen(parts[p]);

        for (int i = 0; i < 8; i++)
            in[len++] = (unsigned char)(l >> (56 - 8 * i));
        memcpy(in + len, parts[p], l);
        len += l;
    }
    memcpy(in + len, body, n);
    len += n;
    CHECK(EVP_Digest(in, len, ret, NULL, EVP_sha256(), NULL) == 1);
}

static void test_fingerprint_is_the_framed_sha256(void)
{
    static const struct {
        const char *method, *target, *body;
        size_t n;
    } cases[] = {
        { "PUT", "/orders/1", "body", 4 },
        { "POST", "/", "", 0 },
        { "PATCH", "/a?b=%20c", "\0\1\2", 3 },
        { "X", "*", "x", 1 },
    };

    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        uint8_t got[FINGERPRINT_LEN], want[FINGERPRINT_LEN];

        fp_of(cases[i].method, cases[i].target, cases[i].body, cases[i].n, got);
        framed_sha256(cases[i].method, cases[i].target, cases[i].body, cases[i].n, want);
        CHECK_EQ_MEM(got, want, FINGERPRINT_LEN);
    }
}

static void test_fingerprint_method_target_body_each_change_it(void)
{
    uint8_t base[FINGERPRINT_LEN], d[FINGERPRINT_LEN];

    fp_of("POST", "/pay", "amount=10", 9, base);
    fp_of("PUT", "/pay", "amount=10", 9, d);
    CHECK(memcmp(base, d, FINGERPRINT_LEN) != 0);
    fp_of("post", "/pay", "amount=10", 9, d); /* the method is case-sensitive */
    CHECK(memcmp(base, d, FINGERPRINT_LEN) != 0);
    fp_of("POST", "/pay?x=1", "amount=10", 9, d);
    CHECK(memcmp(base, d, FINGERPRINT_LEN) != 0);
    fp_of("POST", "/p%61y", "amount=10", 9, d); /* raw target: not decoded */
    CHECK(memcmp(base, d, FINGERPRINT_LEN) != 0);
    fp_of("POST", "/pay", "amount=11", 9, d);
    CHECK(memcmp(base, d, FINGERPRINT_LEN) != 0);
    fp_of("POST", "/pay", "amount=10\0", 10, d); /* a trailing NUL counts */
    CHECK(memcmp(base, d, FINGERPRINT_LEN) != 0);
    fp_of("POST", "/pay", "", 0, d);
    CHECK(memcmp(base, d, FINGERPRINT_LEN) != 0);
}

static void test_fingerprint_framing_separates_fields(void)
{
    uint8_t a[FINGERPRINT_LEN], b[FINGERPRINT_LEN];

    fp_of("POS", "T/a", "", 0, a);
    fp_of("POST", "/a", "", 0, b);
    CHECK(memcmp(a, b, FINGERPRINT_LEN) != 0);
    fp_of("POST", "/a", "b", 1, a);
    fp_of("POST", "/ab", "", 0, b);
    CHECK(memcmp(a, b, FINGERPRINT_LEN) != 0);
    fp_of("", "POST/a", "", 0, a);
    fp_of("POST/a", "", "", 0, b);
    CHECK(memcmp(a, b, FINGERPRINT_LEN) != 0);
}

static void test_fingerprint_body_chunking_does_not_matter(void)
{
    char body[5000];
    uint8_t one[FINGERPRINT_LEN], many[FINGERPRINT_LEN];
    struct fingerprint fp = { .md = NULL };
    size_t off = 0, step = 1;

    for (size_t i = 0; i < sizeof(body); i++)
        body[i] = (char)(i * 31 + 7);
    fp_of("PATCH", "/x", body, sizeof(body), one);

    CHECK_EQ_INT(fingerprint_init(&fp, SPAN_LIT("PATCH"), SPAN_LIT("/x")), 0);
    while (off < sizeof(body)) {
        size_t n = step < sizeof(body) - off ? step : sizeof(body) - off;

        CHECK_EQ_INT(fingerprint_update(&fp, body + off, n), 0);
        CHECK_EQ_INT(fingerprint_update(&fp, NULL, 0), 0); /* empty chunks are fine */
        off += n;
        step = step * 3 + 1;
    }
    CHECK_EQ_INT(fingerprint_final(&fp, many), 0);
    CHECK_EQ_MEM(one, many, FINGERPRINT_LEN);

    /* Byte by byte too. */
    CHECK_EQ_INT(fingerprint_init(&fp, SPAN_LIT("PATCH"), SPAN_LIT("/x")), 0);
    for (size_t i = 0; i < sizeof(body); i++)
        fingerprint_update(&fp, body + i, 1);
    CHECK_EQ_INT(fingerprint_final(&fp, many), 0);
    CHECK_EQ_MEM(one, many, FINGERPRINT_LEN);
}

static void test_fingerprint_unstarted_context_fails(void)
{
    struct fingerprint fp = { .md = NULL };
    uint8_t d[FINGERPRINT_LEN];

    memset(d, 0xab, sizeof(d));
    CHECK_EQ_INT(fingerprint_update(&fp, "x", 1), -EIO);
    CHECK_EQ_INT(fingerprint_final(&fp, d), -EIO);
    CHECK_EQ_INT(d[0], 0xab); /* untouched on failure */
    CHECK_EQ_INT(d[FINGERPRINT_LEN - 1], 0xab);
    /* After final the context is gone: a second final fails. */
    fp_of("POST", "/", "", 0, d);
    CHECK_EQ_INT(fingerprint_init(&fp, SPAN_LIT("POST"), SPAN_LIT("/")), 0);
    CHECK_EQ_INT(fingerprint_final(&fp, d), 0);
    CHECK_EQ_INT(fingerprint_final(&fp, d), -EIO);
}

static void test_fingerprint_done_is_safe(void)
{
    struct fingerprint fp = { .md = NULL };
    uint8_t d[FINGERPRINT_LEN];

    fingerprint_done(NULL);
    fingerprint_done(&fp); /* never started */
    CHECK(fp.md == NULL);
    CHECK_EQ_INT(fingerprint_init(&fp, SPAN_LIT("POST"), SPAN_LIT("/abandoned")), 0);
    CHECK_EQ_INT(fingerprint_update(&fp, "partial", 7), 0);
    fingerprint_done(&fp); /* abandoned mid-body: no leak (ASan checks) */
    CHECK(fp.md == NULL);
    fingerprint_done(&fp);
    CHECK_EQ_INT(fingerprint_init(&fp, SPAN_LIT("POST"), SPAN_LIT("/")), 0); /* reusable */
    CHECK_EQ_INT(fingerprint_final(&fp, d), 0);
    fingerprint_done(&fp); /* after final */
}

static void test_fingerprint_hex_is_lowercase(void)
{
    uint8_t d[FINGERPRINT_LEN];
    char hex[FINGERPRINT_HEX + 1];

    for (size_t i = 0; i < FINGERPRINT_LEN; i++)
        d[i] = (uint8_t)(i * 8 + 0x0f);
    memset(hex, 'X', sizeof(hex));
    fingerprint_hex(d, hex);
    CHECK_EQ_INT(hex[FINGERPRINT_HEX], '\0');
    CHECK_EQ_MEM(hex, "0f171f272f373f47", 16);
    CHECK_EQ_MEM(hex + 48, "cfd7dfe7eff7ff07", 16); /* 0x107 wraps to 07 */
    CHECK_EQ_MEM(hex + 60, "ff07", 4);
    memset(d, 0xff, sizeof(d));
    fingerprint_hex(d, hex);
    CHECK_EQ_STR(hex, "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff");
}

static void check_sorted(const char *in, const char *want)
{
    char *out = NULL;
    size_t n = 0;

    CHECK_EQ_INT(fingerprint_sort_query(span_from_cstr(in), &out, &n), 0);
    CHECK_EQ_STR(out, want);
    CHECK_EQ_INT(n, strlen(want));
    free(out);
}

/* query: sorted: parameters by name, then whole; bytes as received. */
static void test_fingerprint_sort_query(void)
{
    check_sorted("/p", "/p");
    check_sorted("/p?", "/p?");
    check_sorted("/p?b=2&a=1", "/p?a=1&b=2");
    check_sorted("/p?a=2&a=1&a", "/p?a&a=1&a=2");
    check_sorted("/p?ab=1&a=2", "/p?a=2&ab=1"); /* by name first: "a" before "ab" */
    check_sorted("/p?b&&a", "/p?&a&b");
    check_sorted("/p?%62=1&a=%20", "/p?%62=1&a=%20"); /* '%' sorts before 'a': not decoded */
}

static void digest_with(const struct http_header *fields, size_t n, uint8_t out[FINGERPRINT_LEN])
{
    struct fingerprint fp = { 0 };

    CHECK_EQ_INT(fingerprint_init(&fp, SPAN_LIT("POST"), SPAN_LIT("/p")), 0);
    CHECK_EQ_INT(fingerprint_add_field(&fp, SPAN_LIT("v"), fields, n), 0);
    CHECK_EQ_INT(fingerprint_update(&fp, "x", 1), 0);
    CHECK_EQ_INT(fingerprint_final(&fp, out), 0);
}

#define H(n, v)                                                                                    \
    {                                                                                              \
        SPAN_LIT(n), SPAN_LIT(v)                                                                   \
    }

/* A header's values join trimmed with ", ", whatever lies between them;
 * absent and empty differ; names are case-insensitive. */
static void test_fingerprint_fields(void)
{
    const struct http_header one[] = { H("X", "1"), H("V", " a, b\t") },
                             two[] = { H("v", "a"), H("X", "b"), H("V", " b") },
                             other[] = { H("v", "a"), H("V", "c"), H("X", "b") },
                             none[] = { H("X", "a") }, empty[] = { H("V", "") };
    uint8_t d1[FINGERPRINT_LEN], d2[FINGERPRINT_LEN], d3[FINGERPRINT_LEN], d4[FINGERPRINT_LEN],
        d5[FINGERPRINT_LEN];

    digest_with(one, ARRAY_SIZE(one), d1);
    digest_with(two, ARRAY_SIZE(two), d2);
    CHECK_EQ_MEM(d1, d2, FINGERPRINT_LEN); /* one field "a, b" is the two fields a and b */
    digest_with(other, ARRAY_SIZE(other), d3);
    CHECK(memcmp(d2, d3, FINGERPRINT_LEN) != 0); /* the second value counts, not what follows */
    digest_with(none, ARRAY_SIZE(none), d4);
    digest_with(empty, ARRAY_SIZE(empty), d5);
    CHECK(memcmp(d4, d5, FINGERPRINT_LEN) != 0);
    digest_with(NULL, 0, d5);
    CHECK_EQ_MEM(d4, d5, FINGERPRINT_LEN); /* absent, whatever other fields there are */
}

TEST_MAIN(test_fingerprint_known_answer, test_fingerprint_is_the_framed_sha256,
          test_fingerprint_method_target_body_each_change_it,
          test_fingerprint_framing_separates_fields, test_fingerprint_body_chunking_does_not_matter,
          test_fingerprint_unstarted_context_fails, test_fingerprint_done_is_safe,
          test_fingerprint_hex_is_lowercase, test_fingerprint_sort_query, test_fingerprint_fields)
