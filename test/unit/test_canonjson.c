/* SPDX-License-Identifier: MIT */
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "idemproxy/buf.h"
#include "idemproxy/canonjson.h"

#define DEPTH 64

static char result[1 << 16];

/* canonjson_write() of the <len> bytes at <body> (an exact-size heap copy,
 * so that ASan sees a read past it) with <ignore>: the canonical form, or
 * "EINVAL", "E2BIG", "ENOMEM". A form is checked to be canonical of itself. */
static const char *canon_n(const char *body, size_t len, const char *const *ignore, size_t n,
                           size_t max_depth, size_t limit)
{
    char *copy = malloc(len ? len : 1);
    struct buf out = BUF_INIT(limit), again = BUF_INIT(limit);
    int r;

    if (len)
        memcpy(copy, body, len);
    CHECK_EQ_INT(buf_append(&out, "#", 1), 0); /* appended after what is there */
    r = canonjson_write((struct span){ .base = copy, .len = len }, ignore, n, max_depth, &out);
    CHECK(len == 0 || memcmp(copy, body, len) == 0);
    free(copy);
    if (r < 0) {
        CHECK_EQ_INT(out.len, 1); /* untouched */
        snprintf(result, sizeof(result), "%s",
                 r == -EINVAL   ? "EINVAL"
                 : r == -E2BIG  ? "E2BIG"
                 : r == -ENOMEM ? "ENOMEM"
                                : "?");
    } else {
        CHECK_EQ_INT(r, 0);
        CHECK(out.len - 1 < sizeof(result));
        memcpy(result, out.data + 1, out.len - 1);
        result[out.len - 1] = '\0';
        /* Canonical of canonical is itself (the removed parts are gone already). */
        CHECK_EQ_INT(canonjson_write((struct span){ .base = out.data + 1, .len = out.len - 1 },
                                     NULL, 0, max_depth, &again),
                     out.len == 1 ? -EINVAL : 0);
        CHECK(again.len == out.len - 1 &&
              (again.len == 0 || memcmp(again.data, out.data + 1, again.len) == 0));
    }
    buf_done(&out);
    buf_done(&again);
    return result;
}

static const char *canon(const char *body)
{
    return canon_n(body, strlen(body), NULL, 0, DEPTH, 1 << 20);
}

static const char *canon_ignoring(const char *body, const char *const *ignore, size_t n)
{
    return canon_n(body, strlen(body), ignore, n, DEPTH, 1 << 20);
}

#define EXPECT(body, want) CHECK_EQ_STR(canon(body), want)

/* RFC 8785 §3.2.2's sample; its first number is the one it would change
 * (333333333.33333329 is read as the double 333333333.3333333) and this
 * scheme keeps. Written with that double's own text, the sample gives the
 * RFC's bytes. */
static void test_canonjson_rfc8785_sample(void)
{
    static const char tail[] =
        "1E30, 4.50, 2e-3, 0.000000000000000000000000001],\n"
        "  \"string\": \"\\u20ac$\\u000F\\u000aA'\\u0042\\u0022\\u005c\\\\\\\"\\/\",\n"
        "  \"literals\": [null, true, false]\n}";
    static const char want_tail[] = "1e+30,4.5,0.002,1e-27],\"string\":\"\xe2\x82\xac$\\u000f\\nA'B"
                                    "\\\"\\\\\\\\\\\"/\"}";
    char body[512], want[512];

    snprintf(body, sizeof(body), "{\n  \"numbers\": [333333333.33333329, %s", tail);
    snprintf(want, sizeof(want),
             "{\"literals\":[null,true,false],\"numbers\":[333333333.33333329,%s", want_tail);
    EXPECT(body, want);
    snprintf(body, sizeof(body), "{\n  \"numbers\": [333333333.3333333, %s", tail);
    snprintf(want, sizeof(want),
             "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,%s", want_tail);
    EXPECT(body, want);
}

/* RFC 8785 §3.2.3: names sort as UTF-16 code units. */
static void test_canonjson_rfc8785_sort_order(void)
{
    EXPECT("{\"\\u20ac\":\"Euro Sign\",\"\\r\":\"Carriage Return\",\"\\ufb33\":\"Hebrew Letter "
           "Dalet With Dagesh\",\"1\":\"One\",\"\\ud83d\\ude00\":\"Emoji: Grinning Face\","
           "\"\\u0080\":\"Control\",\"\\u00f6\":\"Latin Small Letter O With Diaeresis\"}",
           "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\xc2\x80\":\"Control\",\"\xc3\xb6\":"
           "\"Latin Small Letter O With Diaeresis\",\"\xe2\x82\xac\":\"Euro Sign\",\"\xf0\x9f\x98"
           "\x80\":\"Emoji: Grinning Face\",\"\xef\xac\xb3\":\"Hebrew Letter Dalet With Dagesh\"}");
    /* U+1F600 (D83D DE00) before U+E000, though its UTF-8 (F0..) is after EE..;
     * raw UTF-8 and escapes sort alike. */
    EXPECT("{\"\xee\x80\x80\":1,\"\\ud83d\\ude00\":2}",
           "{\"\xf0\x9f\x98\x80\":2,\"\xee\x80\x80\":1}");
    EXPECT("{\"\\ue000\":1,\"\xf0\x9f\x98\x80\":2}", "{\"\xf0\x9f\x98\x80\":2,\"\xee\x80\x80\":1}");
    /* A prefix first; two astral characters with one high surrogate. */
    EXPECT("{\"ab\":1,\"a\":2,\"\":3,\"\\ud83d\\ude01\":4,\"\\ud83d\\ude00\":5}",
           "{\"\":3,\"a\":2,\"ab\":1,\"\xf0\x9f\x98\x80\":5,\"\xf0\x9f\x98\x81\":4}");
    EXPECT("{\"b\":[{\"z\":1,\"y\":2}],\"a\":{\"d\":{},\"c\":[]}}",
           "{\"a\":{\"c\":[],\"d\":{}},\"b\":[{\"y\":2,\"z\":1}]}");
}

static double from_bits(uint64_t bits)
{
    double d;

    memcpy(&d, &bits, sizeof(d));
    return d;
}

/* canonjson_format_double() of <d>, its length checked. */
static const char *format(double d)
{
    static char text[CANONJSON_DOUBLE_MAX];

    CHECK_EQ_INT(canonjson_format_double(d, text), (int)strlen(text));
    return text;
}

/* RFC 8785 Appendix B: IEEE 754 doubles and ECMAScript's text of each. */
static void test_canonjson_rfc8785_number_table(void)
{
    static const struct {
        uint64_t bits;
        const char *text;
    } table[] = {
        { 0x0000000000000000, "0" },
        { 0x8000000000000000, "0" },
        { 0x0000000000000001, "5e-324" },
        { 0x8000000000000001, "-5e-324" },
        { 0x7fefffffffffffff, "1.7976931348623157e+308" },
        { 0xffefffffffffffff, "-1.7976931348623157e+308" },
        { 0x4340000000000000, "9007199254740992" },
        { 0xc340000000000000, "-9007199254740992" },
        { 0x4430000000000000, "295147905179352830000" },
        { 0x44b52d02c7e14af5, "9.999999999999997e+22" },
        { 0x44b52d02c7e14af6, "1e+23" },
        { 0x44b52d02c7e14af7, "1.0000000000000001e+23" },
        { 0x444b1ae4d6e2ef4e, "999999999999999700000" },
        { 0x444b1ae4d6e2ef4f, "999999999999999900000" },
        { 0x444b1ae4d6e2ef50, "1e+21" },
        { 0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7" },
        { 0x3eb0c6f7a0b5ed8d, "0.000001" },
        { 0x41b3de4355555553, "333333333.3333332" },
        { 0x41b3de4355555554, "333333333.33333325" },
        { 0x41b3de4355555555, "333333333.3333333" },
        { 0x41b3de4355555556, "333333333.3333334" },
        { 0x41b3de4355555557, "333333333.33333343" },
        { 0xbecbf647612f3696, "-0.0000033333333333333333" },
        { 0x43143ff3c1cb0959, "1424953923781206.2" }, /* round to even */
    };
    char text[CANONJSON_DOUBLE_MAX], body[64];

    for (size_t i = 0; i < ARRAY_SIZE(table); i++) {
        CHECK_EQ_INT(canonjson_format_double(from_bits(table[i].bits), text),
                     (int)strlen(table[i].text));
        CHECK_EQ_STR(text, table[i].text);
        /* Each text, as a literal with a fraction, is its own canonical form. */
        snprintf(body, sizeof(body), "%s%s", table[i].text,
                 strpbrk(table[i].text, ".e") ? "" : ".0");
        EXPECT(body, table[i].text);
    }
    CHECK_EQ_INT(canonjson_format_double(NAN, text), -EINVAL);
    CHECK_EQ_INT(canonjson_format_double(INFINITY, text), -EINVAL);
    CHECK_EQ_INT(canonjson_format_double(-INFINITY, text), -EINVAL);
    /* Powers of two: the shortest text may lie above the nearest one. */
    for (int e = -1074; e <= 1023; e++) {
        double d = ldexp(1.0, e);

        CHECK(canonjson_format_double(d, text) > 0 && strtod(text, NULL) == d);
    }
    CHECK_EQ_STR(format(ldexp(1.0, -1074)), "5e-324");
    CHECK_EQ_STR(format(ldexp(1.0, 1023)), "8.98846567431158e+307");
    CHECK_EQ_STR(format(0.1), "0.1");
    CHECK_EQ_STR(format(1e21), "1e+21");
    CHECK_EQ_STR(format(1e20), "100000000000000000000");
    CHECK_EQ_STR(format(1.5e-7), "1.5e-7");
    CHECK_EQ_STR(format(-123.456), "-123.456");
}

/* doc/configuration.md, Fingerprint: two different amounts never fingerprint alike. */
static void test_canonjson_numbers_keep_their_amount(void)
{
    /* Integer literals keep their digits, however many. */
    EXPECT("[0,-0,7,-12,9007199254740993,-9007199254740993]",
           "[0,0,7,-12,9007199254740993,-9007199254740993]");
    EXPECT("123456789012345678901234567890", "123456789012345678901234567890");
    EXPECT("1000000000000000000000", "1000000000000000000000");
    /* Others: the double's text when it is the literal's very value. */
    EXPECT("[1.0,1e2,1E2,1e+2,4.50,2e-3,1E30,-1.50,123e-2,0.00001,1E-7,2.5E+1]",
           "[1,100,100,100,4.5,0.002,1e+30,-1.5,1.23,0.00001,1e-7,25]");
    EXPECT("[100000000000000000000.0,1e21,1e-6,1e-7,0.30000000000000004,5e-324]",
           "[100000000000000000000,1e+21,0.000001,1e-7,0.30000000000000004,5e-324]");
    EXPECT("[-0.0,0.0,0e10,-0E-10,0.000e+999999999999]", "[0,0,0,0,0]");
    EXPECT("1.7976931348623157e308", "1.7976931348623157e+308");
    EXPECT("0.000000000000000000000000001", "1e-27");
    EXPECT("1000000000000000000000000000000000000000000000000000.0", "1e+51");
    /* Else the literal as written. */
    EXPECT("0.1000000000000000055511151231257827", "0.1000000000000000055511151231257827");
    EXPECT("[0.1,0.10000000000000000555]", "[0.1,0.10000000000000000555]");
    EXPECT("[1e400,1E400,-1e400,1e-400,4.9e-324]", "[1e400,1E400,-1e400,1e-400,4.9e-324]");
    EXPECT("1.7976931348623159e308", "1.7976931348623159e308"); /* no double */
    EXPECT("0.3000000000000000444", "0.3000000000000000444");
    EXPECT("333333333.33333329", "333333333.33333329");
    EXPECT("123456789012345678901234567890.0", "123456789012345678901234567890.0");
    EXPECT("1e99999999999999999999999999", "1e99999999999999999999999999");
    EXPECT("1.00000000000000000000000000000000000000001",
           "1.00000000000000000000000000000000000000001");
    /* 17 significant digits past leading and before trailing zeros. */
    EXPECT("0.0000123456789012345680000", "0.000012345678901234568");
    EXPECT("0.000012345678901234567", "0.000012345678901234567"); /* read as ...568 */
    EXPECT("0.00001234567890123456780000", "0.00001234567890123456780000");
}

static void test_canonjson_strings_are_escaped_minimally(void)
{
    EXPECT("\"\\b\\t\\n\\f\\r\\\"\\\\\\/\"", "\"\\b\\t\\n\\f\\r\\\"\\\\/\"");
    EXPECT("\"\\u0000\\u0001\\u001F\\u000b\\u0008\\u0009\\u000A\\u000c\\u000D\"",
           "\"\\u0000\\u0001\\u001f\\u000b\\b\\t\\n\\f\\r\"");
    /* DEL, C1 controls, U+2028/U+2029 and '/' are written as they are. */
    EXPECT("\"\\u007f\\u0080\\u2028\\u2029\\u002F\"", "\"\x7f\xc2\x80\xe2\x80\xa8\xe2\x80\xa9/\"");
    EXPECT("\"\x7f\xe2\x80\xa8/\"", "\"\x7f\xe2\x80\xa8/\"");
    EXPECT("\"\\u0041\\u00E9\\u20AC\\uD83D\\uDE00\\udbff\\udfff\"",
           "\"A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\"");
    EXPECT("\"caf\xc3\xa9 \xf0\x9f\x98\x80\"", "\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");
    EXPECT("\"\\uFFFF\\uFDD0\"", "\"\xef\xbf\xbf\xef\xb7\x90\""); /* noncharacters: kept */
    EXPECT("[\"\",\"\\\\u0041\"]", "[\"\",\"\\\\u0041\"]");
    EXPECT(" \t\n\r{ \"a\" : [ 1 , true , false , null , \"x\" ] } \n",
           "{\"a\":[1,true,false,null,\"x\"]}");
    EXPECT("\"top\"", "\"top\"");
    EXPECT("null", "null");
}

static void test_canonjson_removes_what_the_pointers_find(void)
{
    static const char doc[] = "{\"a\":{\"b\":1,\"c\":2},\"d\":[10,11,12],\"a/b\":3,\"m~n\":4,"
                              "\"\":5,\"e\":{\"\":{\"\":6,\"f\":7}}}";
    static const char *const nested[] = { "/a/b" }, *const index[] = { "/d/1" },
                             *const two[] = { "/d/0", "/d/1" },
                             *const escaped[] = { "/a~1b", "/m~0n" }, *const empty[] = { "/" },
                             *const deep[] = { "/e//" }, *const none[] = { "/d/01",  "/d/-",
                                                                           "/d/3",   "/zz",
                                                                           "/a/b/c", "/d/x",
                                                                           "/a~01" },
                             *const whole[] = { "" }, *const all[] = { "/a",    "/d", "/a~1b",
                                                                       "/m~0n", "/",  "/e" };

    CHECK_EQ_STR(canon_ignoring(doc, nested, 1),
                 "{\"\":5,\"a\":{\"c\":2},\"a/b\":3,\"d\":[10,11,12],\"e\":{\"\":{\"\":6,\"f\":7}},"
                 "\"m~n\":4}");
    CHECK_EQ_STR(
        canon_ignoring(doc, index, 1),
        "{\"\":5,\"a\":{\"b\":1,\"c\":2},\"a/b\":3,\"d\":[10,12],\"e\":{\"\":{\"\":6,\"f\":"
        "7}},\"m~n\":4}");
    /* Indices are the body's: /d/0 and /d/1 are 10 and 11. */
    CHECK_EQ_STR(
        canon_ignoring(doc, two, 2),
        "{\"\":5,\"a\":{\"b\":1,\"c\":2},\"a/b\":3,\"d\":[12],\"e\":{\"\":{\"\":6,\"f\":7}},"
        "\"m~n\":4}");
    CHECK_EQ_STR(canon_ignoring(doc, escaped, 2),
                 "{\"\":5,\"a\":{\"b\":1,\"c\":2},\"d\":[10,11,12],\"e\":{\"\":{\"\":6,\"f\":7}}}");
    CHECK_EQ_STR(
        canon_ignoring(doc, empty, 1),
        "{\"a\":{\"b\":1,\"c\":2},\"a/b\":3,\"d\":[10,11,12],\"e\":{\"\":{\"\":6,\"f\":7}},"
        "\"m~n\":4}");
    CHECK_EQ_STR(
        canon_ignoring(doc, deep, 1),
        "{\"\":5,\"a\":{\"b\":1,\"c\":2},\"a/b\":3,\"d\":[10,11,12],\"e\":{\"\":{\"f\":7}},"
        "\"m~n\":4}");
    CHECK_EQ_STR(canon_ignoring(doc, none, ARRAY_SIZE(none)), canon(doc));
    CHECK_EQ_STR(canon_ignoring(doc, all, ARRAY_SIZE(all)), "{}");
    CHECK_EQ_STR(canon_ignoring(doc, whole, 1), "");
    /* Names match once unescaped; the first and last elements; a scalar. */
    static const char *const a[] = { "/a" }, *const first_last[] = { "/0", "/2" },
                             *const euro[] = { "/\xe2\x82\xac/0" };
    CHECK_EQ_STR(canon_ignoring("{\"\\u0061\":1,\"b\":2}", a, 1), "{\"b\":2}");
    CHECK_EQ_STR(canon_ignoring("[1,[2],{\"a\":3}]", first_last, 2), "[[2]]");
    CHECK_EQ_STR(canon_ignoring("{\"\\u20ac\":[1,2],\"\xe2\x82\xac\\u0000\":3}", euro, 1),
                 "{\"\xe2\x82\xac\":[2],\"\xe2\x82\xac\\u0000\":3}");
    CHECK_EQ_STR(canon_ignoring("7", a, 1), "7");
    /* What is removed is still checked. */
    CHECK_EQ_STR(canon_ignoring("{\"a\":{\"x\":1,\"x\":2},\"b\":1}", a, 1), "EINVAL");
    CHECK_EQ_STR(canon_ignoring("{\"a\":\"\\ud800\",\"b\":1}", a, 1), "EINVAL");
    CHECK_EQ_STR(canon_ignoring("{\"a\":[1,{\"y\":1,\"y\":1}]}", whole, 1), "EINVAL");
}

static void test_canonjson_refuses_what_is_not_i_json(void)
{
    static const char *const bad[] = {
        "",
        " ",
        "{",
        "}",
        "[",
        "[1,]",
        "[,1]",
        "{\"a\":1,}",
        "{,}",
        "{\"a\" 1}",
        "{\"a\":}",
        "{1:2}",
        "{'a':1}",
        "[1 2]",
        "{} {}",
        "[]]",
        "01",
        "-01",
        "1.",
        ".5",
        "+1",
        "-",
        "1e",
        "1e+",
        "1.e3",
        "0x10",
        "NaN",
        "Infinity",
        "-Infinity",
        "tru",
        "nul",
        "True",
        "falsey",
        "\"abc",
        "\"a\x01\"",
        "\"a\tb\"",
        "\"\\x\"",
        "\"\\u12\"",
        "\"\\u12G4\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\ud800\\u0041\"",
        "\"\\ud800x\"",
        "\"\\ud800\\ud800\"",
        "\"\\udfff\\ud800\"",
        "\"\xff\"",
        "\"\xc0\xaf\"",
        "\"\xc1\xbf\"",
        "\"\xe0\x80\xaf\"",
        "\"\xed\xa0\x80\"",
        "\"\xf0\x80\x80\xaf\"",
        "\"\xf4\x90\x80\x80\"",
        "\"\xf5\x80\x80\x80\"",
        "\"\xe2\x82\"",
        "\"\x80\"",
        "\xef\xbb\xbf{}",
        "{\"a\":1,\"a\":2}",
        "{\"a\":1,\"\\u0061\":2}",
        "{\"\\ud83d\\ude00\":1,\"\xf0\x9f\x98\x80\":2}",
        "[{\"b\":[{\"x\":1,\"y\":2,\"x\":3}]}]",
        "// c\n1",
        "[1]/* */",
        "\"\\'\"",
    };

    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        const char *got = canon(bad[i]);

        if (strcmp(got, "EINVAL") != 0)
            fprintf(stderr, "accepted: '%s' as '%s'\n", bad[i], got);
        CHECK_EQ_STR(got, "EINVAL");
    }
    /* A NUL: inside a string, after the text. */
    CHECK_EQ_STR(canon_n("\"a\0b\"", 5, NULL, 0, DEPTH, 1 << 20), "EINVAL");
    CHECK_EQ_STR(canon_n("[1]\0", 4, NULL, 0, DEPTH, 1 << 20), "EINVAL");
    CHECK_EQ_STR(canon_n("[1]", 2, NULL, 0, DEPTH, 1 << 20), "EINVAL"); /* reads body.len only */
    {
        struct buf out = BUF_INIT(16);

        CHECK_EQ_INT(canonjson_write((struct span){ .base = NULL, .len = 0 }, NULL, 0, DEPTH, &out),
                     -EINVAL);
        CHECK_EQ_INT(out.len, 0);
    }
}

static void test_canonjson_depth_is_bounded(void)
{
    size_t n = CANONJSON_DEPTH_MAX + 1;
    char *deep = malloc(2 * n + 1), *inner = malloc(2 * n);

    CHECK_EQ_STR(canon_n("[[1]]", 5, NULL, 0, 2, 1 << 20), "[[1]]");
    CHECK_EQ_STR(canon_n("[[[1]]]", 7, NULL, 0, 2, 1 << 20), "EINVAL");
    CHECK_EQ_STR(canon_n("{\"a\":{\"b\":1}}", 13, NULL, 0, 2, 1 << 20), "{\"a\":{\"b\":1}}");
    CHECK_EQ_STR(canon_n("{\"a\":[{}]}", 10, NULL, 0, 2, 1 << 20), "EINVAL");
    CHECK_EQ_STR(canon_n("1", 1, NULL, 0, 0, 1 << 20), "1");
    CHECK_EQ_STR(canon_n("[]", 2, NULL, 0, 0, 1 << 20), "EINVAL");
    /* Whatever the caller asks, CANONJSON_DEPTH_MAX at most. */
    for (size_t i = 0; i < n; i++) {
        deep[i] = '[';
        deep[2 * n - 1 - i] = ']';
    }
    deep[2 * n] = '\0';
    memcpy(inner, deep + 1, 2 * n - 2);
    inner[2 * n - 2] = '\0';
    CHECK_EQ_STR(canon_n(deep, 2 * n, NULL, 0, SIZE_MAX, 1 << 20), "EINVAL");
    CHECK_EQ_STR(canon_n(inner, 2 * n - 2, NULL, 0, SIZE_MAX, 1 << 20), inner);
    free(deep);
    free(inner);
}

static void test_canonjson_output_limit(void)
{
    static const char body[] = "{ \"b\" : 1.0 , \"a\" : [ true ] }",
                      want[] = "{\"a\":[true],\"b\":1}",
                      bad[] = "[\"aaaaaaaaaaaaaaaa\",{\"x\":1,\"x\":2}]";
    size_t n = strlen(want);

    /* canon_n() puts one byte in first. */
    CHECK_EQ_STR(canon_n(body, strlen(body), NULL, 0, DEPTH, n + 1), want);
    CHECK_EQ_STR(canon_n(body, strlen(body), NULL, 0, DEPTH, n), "E2BIG");
    CHECK_EQ_STR(canon_n(body, strlen(body), NULL, 0, DEPTH, 1), "E2BIG");
    /* A body that is not I-JSON says so, however early the output is full. */
    CHECK_EQ_STR(canon_n(bad, strlen(bad), NULL, 0, DEPTH, 4), "EINVAL");
}

/* Many members in reverse order; a long string; names that differ late. */
static void test_canonjson_large_objects(void)
{
    struct buf body = BUF_INIT(1 << 22), out = BUF_INIT(1 << 22);
    char item[64];
    int ok = 1;

    CHECK_EQ_INT(buf_append(&body, "{", 1), 0);
    for (int i = 20000; i > 0; i--) {
        int n = snprintf(item, sizeof(item), "%s\"k%06d\":%d", i == 20000 ? "" : ",", i, i);

        ok &= buf_append(&body, item, (size_t)n) == 0;
    }
    ok &= buf_append(&body, "}", 1) == 0;
    CHECK(ok);
    CHECK_EQ_INT(canonjson_write(buf_span(&body), NULL, 0, DEPTH, &out), 0);
    CHECK_EQ_INT(out.len, body.len);
    CHECK(out.len > 40 && memcmp(out.data, "{\"k000001\":1,\"k000002\":2,", 25) == 0);
    CHECK(memcmp(out.data + out.len - 16, "\"k020000\":20000}", 16) == 0);
    buf_done(&body);
    buf_done(&out);
}

/* Literals of at most 15 significant digits in the normal range are written
 * from their own digits, with no double made: the same text as the shortest
 * form of their double, for 200,000 random ones (1 to 15 digits, a fraction
 * or an exponent, each sign). */
static void test_canonjson_short_literals_are_their_double_s_text(void)
{
    unsigned long long x = 88172645463325252ull;
    unsigned bad = 0;

    for (int i = 0; i < 200000; i++) {
        char lit[64], want[CANONJSON_DOUBLE_MAX + 8], d[16];
        int n, e, point;

        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        n = 1 + (int)(x % 15);
        for (int k = 0; k < n; k++)
            d[k] = (char)('0' + (x >> (4 * k)) % 10); /* k < 15: shifts of at most 56 */
        d[0] = d[0] == '0' ? '7' : d[0];
        d[n] = '\0';
        e = (int)((x >> 40) % 601) - 300 - n;
        point = (int)((x >> 52) % (unsigned)(n + 1));
        if (x & 1)
            snprintf(lit, sizeof(lit), "[%s%.*s.%s0]", (x & 2) ? "-" : "", point ? point : 1, d,
                     point ? d + point : d + 1);
        else
            snprintf(lit, sizeof(lit), "[%s%se%d]", (x & 2) ? "-" : "", d, e);
        snprintf(want, sizeof(want), "[%s]", format(strtod(lit + 1, NULL)));
        if (strcmp(canon(lit), want) != 0 && bad++ < 5)
            fprintf(stderr, "  %s: %s, its double's text %s\n", lit, result, want);
    }
    CHECK_EQ_INT(bad, 0);
}

TEST_MAIN(test_canonjson_rfc8785_sample, test_canonjson_rfc8785_sort_order,
          test_canonjson_rfc8785_number_table, test_canonjson_numbers_keep_their_amount,
          test_canonjson_strings_are_escaped_minimally,
          test_canonjson_removes_what_the_pointers_find, test_canonjson_refuses_what_is_not_i_json,
          test_canonjson_depth_is_bounded, test_canonjson_output_limit,
          test_canonjson_large_objects, test_canonjson_short_literals_are_their_double_s_text)
