/* SPDX-License-Identifier: MIT */
#include <stdlib.h>

#include "check.h"
#include "idemproxy/idemkey.h"

/* Parses <v> and checks it yields the key <want>. */
static void expect_key(struct span v, const char *want)
{
    struct idemkey k = { .len = 0 };
    size_t n = strlen(want);

    CHECK_EQ_INT(idemkey_parse(v, &k), 0);
    CHECK_EQ_INT(k.len, n);
    if (k.len == n)
        CHECK_EQ_MEM(k.buf, want, n);
}

/* Parses <v>, checks -EINVAL and that the out param was not touched. */
static int expect_invalid(struct span v)
{
    struct idemkey k = { .len = 77 };

    k.buf[0] = '#';
    int r = idemkey_parse(v, &k);

    CHECK_EQ_INT(k.len, 77);
    CHECK_EQ_INT(k.buf[0], '#');
    return r;
}

static void test_idemkey_parses_bare_token(void)
{
    expect_key(SPAN_LIT("abc"), "abc");
    expect_key(SPAN_LIT("8e03978e-40d5-43e8-bc93-6894a57f9324"),
               "8e03978e-40d5-43e8-bc93-6894a57f9324");
    expect_key(SPAN_LIT("a"), "a");
    expect_key(SPAN_LIT("!#$%&'()*+-./:;<=>?@[]^_`{|}~"), "!#$%&'()*+-./:;<=>?@[]^_`{|}~");
}

static void test_idemkey_parses_sf_string(void)
{
    expect_key(SPAN_LIT("\"abc\""), "abc");
    expect_key(SPAN_LIT("\"a,b\""), "a,b"); /* a comma is fine inside quotes */
    expect_key(SPAN_LIT("\"a\\\"b\""), "a\"b");
    expect_key(SPAN_LIT("\"a\\\\b\""), "a\\b");
    expect_key(SPAN_LIT("\"\\\"\""), "\"");
    expect_key(SPAN_LIT("\"\\\\\""), "\\");
    expect_key(SPAN_LIT("\"x\""), "x");
}

static void test_idemkey_both_forms_are_the_same_key(void)
{
    struct idemkey a = { .len = 0 }, b = { .len = 1 };

    CHECK_EQ_INT(idemkey_parse(SPAN_LIT("\"key-123\""), &a), 0);
    CHECK_EQ_INT(idemkey_parse(SPAN_LIT("key-123"), &b), 0);
    CHECK_EQ_INT(a.len, b.len);
    CHECK_EQ_MEM(a.buf, b.buf, a.len);
}

static void test_idemkey_rejects_empty(void)
{
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"\"")), -EINVAL);
    CHECK_EQ_INT(expect_invalid((struct span){ .base = NULL, .len = 0 }), -EINVAL);
}

static void test_idemkey_rejects_bad_sf_strings(void)
{
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"")), -EINVAL);           /* lone quote */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"abc")), -EINVAL);        /* unterminated */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"a\\\"")), -EINVAL);      /* "a\" : escaped close */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"a\\x\"")), -EINVAL);     /* unknown escape */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"a\\n\"")), -EINVAL);     /* unknown escape */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"a\\")), -EINVAL);        /* dangling backslash */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"a\"b\"")), -EINVAL);     /* inner unescaped quote */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"a\"x")), -EINVAL);       /* bytes after the close */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"a\", \"b\"")), -EINVAL); /* two merged keys */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"a b\"")), -EINVAL);      /* space after unquoting */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\" a\"")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"a\tb\"")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\"caf\xc3\xa9\"")), -EINVAL); /* obs-text */
}

static void test_idemkey_rejects_bad_bare_tokens(void)
{
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("a,b")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("a, b")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT(",")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("a\"b")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("abc\"")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("a\\b")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("a b")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("a\tb")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT(" abc")), -EINVAL); /* OWS left by the HTTP layer */
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("abc ")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\tabc")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("ab\x7f")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("ab\x01")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("\x80")), -EINVAL);
    CHECK_EQ_INT(expect_invalid(SPAN_LIT("caf\xc3\xa9")), -EINVAL);
    CHECK_EQ_INT(expect_invalid((struct span){ .base = "a\0b", .len = 3 }), -EINVAL);
}

static void test_idemkey_length_limit(void)
{
    char v[IDEMKEY_MAX + 3];
    struct idemkey k = { .len = 0 };

    memset(v, 'k', sizeof(v));
    CHECK_EQ_INT(idemkey_parse((struct span){ .base = v, .len = IDEMKEY_MAX }, &k), 0);
    CHECK_EQ_INT(k.len, IDEMKEY_MAX);
    CHECK_EQ_INT(expect_invalid((struct span){ .base = v, .len = IDEMKEY_MAX + 1 }), -EINVAL);

    /* The limit applies after unquoting: 255 bytes in quotes is fine. */
    v[0] = '"';
    v[IDEMKEY_MAX + 1] = '"';
    CHECK_EQ_INT(idemkey_parse((struct span){ .base = v, .len = IDEMKEY_MAX + 2 }, &k), 0);
    CHECK_EQ_INT(k.len, IDEMKEY_MAX);
    v[IDEMKEY_MAX + 1] = 'k';
    v[IDEMKEY_MAX + 2] = '"';
    CHECK_EQ_INT(expect_invalid((struct span){ .base = v, .len = IDEMKEY_MAX + 3 }), -EINVAL);

    /* 255 escaped bytes take 512 bytes on the wire and are still valid. */
    char esc[2 * IDEMKEY_MAX + 2];

    esc[0] = '"';
    for (size_t i = 0; i < IDEMKEY_MAX; i++) {
        esc[1 + 2 * i] = '\\';
        esc[2 + 2 * i] = '"';
    }
    esc[2 * IDEMKEY_MAX + 1] = '"';
    CHECK_EQ_INT(idemkey_parse((struct span){ .base = esc, .len = sizeof(esc) }, &k), 0);
    CHECK_EQ_INT(k.len, IDEMKEY_MAX);
    CHECK_EQ_INT(k.buf[0], '"');
    CHECK_EQ_INT(k.buf[IDEMKEY_MAX - 1], '"');
}

static void test_idemkey_scope_known_answers(void)
{
    char s[IDEMKEY_SCOPE_HEX + 1];
    struct span one = SPAN_LIT("Bearer abc");
    struct span absent = { .base = NULL, .len = 0 };
    struct span empty = { .base = "", .len = 0 };
    struct span two[] = { SPAN_LIT("ab"), SPAN_LIT("c") };

    /* Expected values: SHA-256 of the framing, computed independently in Python. */
    CHECK_EQ_INT(idemkey_scope(&one, 1, s), 0);
    CHECK_EQ_STR(s, "a06dc034dfb0dc0941e25c3ef79d166e");
    CHECK_EQ_INT(idemkey_scope(NULL, 0, s), 0);
    CHECK_EQ_STR(s, "e3b0c44298fc1c149afbf4c8996fb924");
    CHECK_EQ_INT(idemkey_scope(&absent, 1, s), 0);
    CHECK_EQ_STR(s, "6e340b9cffb37a989ca544e6bb780a2c");
    CHECK_EQ_INT(idemkey_scope(&empty, 1, s), 0);
    CHECK_EQ_STR(s, "a536aa3cede6ea3c1f3e0357c3c60e0f");
    CHECK_EQ_INT(idemkey_scope(two, 2, s), 0);
    CHECK_EQ_STR(s, "dd6ebd20e120d352082cdd552622abb7");
    CHECK_EQ_INT(strlen(s), IDEMKEY_SCOPE_HEX);
}

static void test_idemkey_scope_separates_lists(void)
{
    char a[IDEMKEY_SCOPE_HEX + 1], b[IDEMKEY_SCOPE_HEX + 1];
    struct span absent = { .base = NULL, .len = 0 }, empty = { .base = "", .len = 0 };
    struct span ab_c[] = { SPAN_LIT("ab"), SPAN_LIT("c") };
    struct span a_bc[] = { SPAN_LIT("a"), SPAN_LIT("bc") };
    struct span abc = SPAN_LIT("abc");
    struct span x_absent[] = { SPAN_LIT("x"), { NULL, 0 } };
    struct span absent_x[] = { { NULL, 0 }, SPAN_LIT("x") };
    struct span alice = SPAN_LIT("Bearer alice"), bob = SPAN_LIT("Bearer bob");

    CHECK_EQ_INT(idemkey_scope(&absent, 1, a), 0);
    CHECK_EQ_INT(idemkey_scope(&empty, 1, b), 0);
    CHECK(strcmp(a, b) != 0); /* absent differs from empty */
    CHECK_EQ_INT(idemkey_scope(ab_c, 2, a), 0);
    CHECK_EQ_INT(idemkey_scope(a_bc, 2, b), 0);
    CHECK(strcmp(a, b) != 0);
    CHECK_EQ_INT(idemkey_scope(&abc, 1, b), 0);
    CHECK(strcmp(a, b) != 0);
    CHECK_EQ_INT(idemkey_scope(x_absent, 2, a), 0);
    CHECK_EQ_INT(idemkey_scope(absent_x, 2, b), 0);
    CHECK(strcmp(a, b) != 0); /* order matters */
    CHECK_EQ_INT(idemkey_scope(&alice, 1, a), 0);
    CHECK_EQ_INT(idemkey_scope(&bob, 1, b), 0);
    CHECK(strcmp(a, b) != 0);
    CHECK_EQ_INT(idemkey_scope(&alice, 1, b), 0);
    CHECK_EQ_STR(a, b); /* deterministic */
    CHECK_EQ_INT(idemkey_scope(NULL, 0, a), 0);
    CHECK_EQ_INT(idemkey_scope(&absent, 1, b), 0);
    CHECK(strcmp(a, b) != 0); /* no headers configured vs one absent */
    for (size_t i = 0; i < IDEMKEY_SCOPE_HEX; i++)
        CHECK((a[i] >= '0' && a[i] <= '9') || (a[i] >= 'a' && a[i] <= 'f'));
    CHECK(strstr(a, "alice") == NULL);
}

static void test_idemkey_store_key_joins_parts(void)
{
    struct idemkey k = { .len = 0 };
    char *s = NULL, *keep = (char *)"untouched";

    CHECK_EQ_INT(idemkey_parse(SPAN_LIT("\"a\\\"b\""), &k), 0);
    CHECK_EQ_INT(idemkey_store_key(SPAN_LIT("idem:"), "0123456789abcdef0123456789abcdef",
                                   idemkey_span(&k), &s),
                 0);
    CHECK_EQ_STR(s, "idem:0123456789abcdef0123456789abcdef:a\"b");
    free(s);
    s = keep;
    CHECK_EQ_INT(idemkey_store_key((struct span){ NULL, 0 }, "ff", idemkey_span(&k), &s), 0);
    CHECK_EQ_STR(s, "ff:a\"b"); /* empty prefix */
    CHECK(s != keep);
    free(s);

    /* The longest key fits in full. */
    char v[IDEMKEY_MAX];

    memset(v, 'z', sizeof(v));
    CHECK_EQ_INT(idemkey_parse((struct span){ .base = v, .len = sizeof(v) }, &k), 0);
    CHECK_EQ_INT(idemkey_store_key(SPAN_LIT("p:"), "s", idemkey_span(&k), &s), 0);
    CHECK_EQ_INT(strlen(s), 2 + 1 + 1 + IDEMKEY_MAX);
    CHECK_EQ_MEM(s, "p:s:zzz", 7);
    CHECK_EQ_INT(s[strlen(s) - 1], 'z');
    free(s);
}

/* The layout idemkey_store_key() writes is the one the stores and /keys
 * read back. */
static void test_idemkey_store_key_matches_its_own_layout(void)
{
    static const char scope[] = "0123456789abcdef0123456789abcdef";
    struct idemkey k = { .len = 3, .buf = "a:b" };
    char *sk = NULL;

    CHECK(idemkey_is_scope(SPAN_LIT("0123456789abcdef0123456789abcdef")));
    CHECK(!idemkey_is_scope(SPAN_LIT("0123456789ABCDEF0123456789abcdef")));
    CHECK(!idemkey_is_scope(SPAN_LIT("0123456789abcdef0123456789abcde")));
    CHECK(!idemkey_is_scope(SPAN_LIT("0123456789abcdef0123456789abcdeg")));
    CHECK_EQ_INT(idemkey_store_key(SPAN_LIT("idem:"), scope, idemkey_span(&k), &sk), 0);
    CHECK(sk && idemkey_store_key_matches(span_from_cstr(sk), SPAN_LIT("idem:"), SPAN_LIT("a:b")));
    CHECK(sk && !idemkey_store_key_matches(span_from_cstr(sk), SPAN_LIT("idem:"), SPAN_LIT("a")));
    CHECK(sk && !idemkey_store_key_matches(span_from_cstr(sk), SPAN_LIT("idex:"), SPAN_LIT("a:b")));
    CHECK(
        !idemkey_store_key_matches(SPAN_LIT("idem:0123:a:b"), SPAN_LIT("idem:"), SPAN_LIT("a:b")));
    /* any key under the prefix, and the key read back */
    CHECK(sk && idemkey_store_key_is_under(span_from_cstr(sk), SPAN_LIT("idem:")));
    CHECK(sk && !idemkey_store_key_is_under(span_from_cstr(sk), SPAN_LIT("idex:")));
    CHECK(!idemkey_store_key_is_under(SPAN_LIT("idem:0123456789abcdef0123456789abcdef:"),
                                      SPAN_LIT("idem:")));
    CHECK(sk && span_eq(idemkey_store_key_key(span_from_cstr(sk), SPAN_LIT("idem:")),
                        SPAN_LIT("a:b")));
    CHECK(idemkey_store_key_key(SPAN_LIT("idem:0123:a:b"), SPAN_LIT("idem:")).base == NULL);
    free(sk);
}

/* A resource link's key: beside the record's, under its prefix and scope,
 * and never a store key (its scope would be "r:..."), for a store key only. */
static void test_idemkey_link_key_layout(void)
{
    const char *sk = "idem:0123456789abcdef0123456789abcdef:order-1";
    char *k = NULL;

    CHECK_EQ_INT(idemkey_link_key(span_from_cstr(sk), 5, SPAN_LIT("pay_1"), &k), 0);
    CHECK_EQ_STR(k, "idem:r:0123456789abcdef0123456789abcdef:pay_1");
    CHECK(k && !idemkey_store_key_is_under(span_from_cstr(k), SPAN_LIT("idem:")));
    free(k);
    k = NULL;
    CHECK_EQ_INT(idemkey_link_key(span_from_cstr(sk), 4, SPAN_LIT("x"), &k), -EINVAL);
    CHECK_EQ_INT(idemkey_link_key(SPAN_LIT("idem:0123:order"), 5, SPAN_LIT("x"), &k), -EINVAL);
    CHECK_EQ_INT(idemkey_link_key(SPAN_LIT("idem:0123456789ABCDEF0123456789abcdef:o"), 5,
                                  SPAN_LIT("x"), &k),
                 -EINVAL);
    CHECK(k == NULL);
}

TEST_MAIN(test_idemkey_parses_bare_token, test_idemkey_parses_sf_string,
          test_idemkey_both_forms_are_the_same_key, test_idemkey_rejects_empty,
          test_idemkey_rejects_bad_sf_strings, test_idemkey_rejects_bad_bare_tokens,
          test_idemkey_length_limit, test_idemkey_scope_known_answers,
          test_idemkey_scope_separates_lists, test_idemkey_store_key_joins_parts,
          test_idemkey_store_key_matches_its_own_layout, test_idemkey_link_key_layout)
