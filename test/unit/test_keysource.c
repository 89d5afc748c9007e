/* SPDX-License-Identifier: MIT */
#include <stdlib.h>

#include "check.h"
#include "idemproxy/keysource.h"

/* The key at <pointer> in <body> must be <want>. */
static void expect_json_key(const char *body, const char *pointer, const char *want)
{
    struct idemkey k = { .len = 0 };
    size_t n = strlen(want);

    CHECK_EQ_INT(keysource_json(span_from_cstr(body), pointer, &k), 0);
    CHECK_EQ_INT(k.len, n);
    if (k.len == n)
        CHECK_EQ_MEM(k.buf, want, n);
}

/* keysource_json() on <body> and <pointer>, checking that <ret> was not touched. */
static int json_fails(struct span body, const char *pointer)
{
    struct idemkey k = { .len = 77 };
    int r;

    k.buf[0] = '#';
    r = keysource_json(body, pointer, &k);
    CHECK_EQ_INT(k.len, 77);
    CHECK_EQ_INT(k.buf[0], '#');
    return r;
}

#define JSON_FAILS(body, pointer) json_fails(span_from_cstr(body), (pointer))

/* keysource_composite() on <values>, checking that <ret> was not touched. */
static int composite_fails(const struct span *values, size_t n)
{
    char *keep = (char *)"untouched", *s = keep;
    size_t len = 99;
    int r = keysource_composite(values, n, &s, &len);

    CHECK(s == keep);
    CHECK_EQ_INT(len, 99);
    return r;
}

static void test_keysource_pointer_check_accepts_rfc6901(void)
{
    CHECK_EQ_INT(keysource_pointer_check(""), 0);
    CHECK_EQ_INT(keysource_pointer_check("/id"), 0);
    CHECK_EQ_INT(keysource_pointer_check("/a~0b/c~1d"), 0);
    CHECK_EQ_INT(keysource_pointer_check("/"), 0);
    CHECK_EQ_INT(keysource_pointer_check("/0"), 0);
    CHECK_EQ_INT(keysource_pointer_check("//"), 0);
    CHECK_EQ_INT(keysource_pointer_check("/~01"), 0);
    CHECK_EQ_INT(keysource_pointer_check("/data/object/id"), 0);
}

static void test_keysource_pointer_check_refuses_bad_pointers(void)
{
    CHECK_EQ_INT(keysource_pointer_check("id"), -EINVAL); /* no leading '/' */
    CHECK_EQ_INT(keysource_pointer_check("/a~2"), -EINVAL);
    CHECK_EQ_INT(keysource_pointer_check("/a~"), -EINVAL);
    CHECK_EQ_INT(keysource_pointer_check("~0"), -EINVAL);
    CHECK_EQ_INT(keysource_pointer_check("/a~/b"), -EINVAL);
    CHECK_EQ_INT(keysource_pointer_check("#/id"), -EINVAL); /* URI fragment form */
    CHECK_EQ_INT(keysource_pointer_check(NULL), -EINVAL);
}

static void test_keysource_json_finds_stripe_event_id(void)
{
    expect_json_key("{\"id\":\"evt_123\",\"object\":\"event\"}", "/id", "evt_123");
    expect_json_key(" {\"object\":\"event\", \"id\" : \"evt_123\"} \n", "/id", "evt_123");
    expect_json_key("{\"data\":{\"object\":{\"id\":\"pi_42\",\"amount\":5}},\"id\":\"evt_1\"}",
                    "/data/object/id", "pi_42");
    expect_json_key("{\"id\":\"\\u0041\\/b\"}", "/id", "A/b"); /* JSON escapes decoded */
}

static void test_keysource_json_indexes_arrays(void)
{
    static const char body[] = "{\"items\":[{\"id\":\"first\"},{\"id\":\"second\"}]}";

    expect_json_key(body, "/items/0/id", "first");
    expect_json_key(body, "/items/1/id", "second");
    expect_json_key("[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\"]", "/10",
                    "k");
    CHECK_EQ_INT(JSON_FAILS(body, "/items/01"), -ENOENT); /* leading zero */
    CHECK_EQ_INT(JSON_FAILS(body, "/items/-"), -ENOENT);  /* past the end */
    CHECK_EQ_INT(JSON_FAILS(body, "/items/2"), -ENOENT);  /* out of range */
    CHECK_EQ_INT(JSON_FAILS(body, "/items/1a"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS(body, "/items/+1"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS(body, "/items/"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS(body, "/items/99999999999999999999999999"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("[]", "/0"), -ENOENT);
}

static void test_keysource_json_unescapes_member_names(void)
{
    static const char body[] = "{\"a/b\":\"slash\",\"m~n\":\"tilde\",\"~1\":\"literal\","
                               "\"\":\"empty\",\"x\":{\"\":{\"\":\"deep\"}}}";

    expect_json_key(body, "/a~1b", "slash");
    expect_json_key(body, "/m~0n", "tilde");
    expect_json_key(body, "/~01", "literal"); /* ~01 is ~1, not / */
    expect_json_key(body, "/", "empty");      /* "/" is the member named "" */
    expect_json_key(body, "/x//", "deep");
    CHECK_EQ_INT(JSON_FAILS(body, "/a/b"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS(body, "/m~1n"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS(body, "/A~1B"), -ENOENT); /* names are case-sensitive */
}

static void test_keysource_json_finds_nothing(void)
{
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a\"}", "/ID"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a\"}", "/id/0"), -ENOENT); /* a string has no members */
    CHECK_EQ_INT(JSON_FAILS("{\"id\":{\"x\":1}}", "/id/y"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{\"n\":1}", "/n/0"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a\"}", "/id/"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{}", "/"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{\"0\":\"zero\"}", "/00"), -ENOENT);
    expect_json_key("{\"0\":\"zero\",\"01\":\"one\"}", "/01", "one"); /* on an object, a name */
}

static void test_keysource_json_integers_are_decimal_text(void)
{
    expect_json_key("{\"id\":42}", "/id", "42");
    expect_json_key("{\"id\":-12}", "/id", "-12");
    expect_json_key("{\"id\":0}", "/id", "0");
    expect_json_key("{\"id\":9007199254740993}", "/id", "9007199254740993");
    expect_json_key("{\"id\":9223372036854775807}", "/id", "9223372036854775807");
    expect_json_key("{\"id\":-9223372036854775808}", "/id", "-9223372036854775808");
    expect_json_key("7", "", "7");
    /* Out of json_int_t: jansson refuses the whole text, so no key. */
    CHECK_EQ_INT(JSON_FAILS("{\"id\":9223372036854775808}", "/id"), -ENOENT);
}

static void test_keysource_json_refuses_other_types(void)
{
    static const char body[] = "{\"r\":1.5,\"e\":1e3,\"t\":true,\"f\":false,\"n\":null,"
                               "\"o\":{\"id\":\"x\"},\"a\":[\"x\"]}";
    static const char *const pointers[] = { "/r", "/e", "/t", "/f", "/n", "/o", "/a", "" };

    for (size_t i = 0; i < ARRAY_SIZE(pointers); i++)
        CHECK_EQ_INT(JSON_FAILS(body, pointers[i]), -EINVAL);
    CHECK_EQ_INT(JSON_FAILS("null", ""), -EINVAL);
}

static void test_keysource_json_refuses_invalid_key_strings(void)
{
    char body[IDEMKEY_MAX + 16], want[IDEMKEY_MAX + 1];

    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"\"}", "/id"), -EINVAL);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a b\"}", "/id"), -EINVAL);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a\\tb\"}", "/id"), -EINVAL);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"caf\xc3\xa9\"}", "/id"), -EINVAL); /* non-ASCII */
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"caf\\u00e9\"}", "/id"), -EINVAL);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a\\u007fb\"}", "/id"), -EINVAL);

    /* 255 bytes are a key, 256 are not. */
    memset(want, 'k', IDEMKEY_MAX);
    want[IDEMKEY_MAX] = '\0';
    snprintf(body, sizeof(body), "{\"id\":\"%s\"}", want);
    expect_json_key(body, "/id", want);
    snprintf(body, sizeof(body), "{\"id\":\"%sk\"}", want);
    CHECK_EQ_INT(JSON_FAILS(body, "/id"), -EINVAL);
}

static void test_keysource_json_refuses_what_is_not_one_json_text(void)
{
    CHECK_EQ_INT(JSON_FAILS("", "/id"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("id=evt_123", "/id"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"evt_123\"", "/id"), -ENOENT); /* truncated */
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"evt_1", "/id"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{}x", ""), -ENOENT); /* trailing garbage */
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a\"} {}", "/id"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a\",\"id\":\"b\"}", "/id"), -ENOENT); /* duplicates */
    CHECK_EQ_INT(JSON_FAILS("{\"x\":{\"k\":1,\"k\":2},\"id\":\"a\"}", "/id"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":'a'}", "/id"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a\",}", "/id"), -ENOENT);
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a\\u0000b\"}", "/id"), -ENOENT); /* no JSON_ALLOW_NUL */
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"\xff\"}", "/id"), -ENOENT);      /* not UTF-8 */
    CHECK_EQ_INT(json_fails((struct span){ .base = "{\"id\":\"a\0\"}", .len = 11 }, "/id"),
                 -ENOENT); /* a raw NUL */
    CHECK_EQ_INT(json_fails((struct span){ .base = NULL, .len = 0 }, "/id"), -ENOENT);
}

static void test_keysource_json_reads_only_body_len(void)
{
    /* The body is the first 12 bytes; what follows must never be read as part of it. */
    static const char buf[] = "{\"id\":\"abc\"}{\"id\":\"xyz\"}";
    static const char number[] = "12345";
    char copy[sizeof(buf)];
    struct idemkey k = { .len = 0 };

    memcpy(copy, buf, sizeof(buf));
    CHECK_EQ_INT(keysource_json((struct span){ .base = copy, .len = 12 }, "/id", &k), 0);
    CHECK_EQ_INT(k.len, 3);
    CHECK_EQ_MEM(k.buf, "abc", 3);
    CHECK_EQ_MEM(copy, buf, sizeof(buf)); /* never modified */
    CHECK_EQ_INT(json_fails((struct span){ .base = copy, .len = 11 }, "/id"), -ENOENT);

    /* A number cut short by len is the shorter number. */
    CHECK_EQ_INT(keysource_json((struct span){ .base = number, .len = 3 }, "", &k), 0);
    CHECK_EQ_INT(k.len, 3);
    CHECK_EQ_MEM(k.buf, "123", 3);

    /* A body without a NUL anywhere near: exactly len bytes on the heap. */
    char *heap = malloc(9);

    CHECK(heap != NULL);
    if (heap) {
        memcpy(heap, "{\"i\":\"z\"}", 9);
        CHECK_EQ_INT(keysource_json((struct span){ .base = heap, .len = 9 }, "/i", &k), 0);
        CHECK_EQ_INT(k.len, 1);
        CHECK_EQ_INT(k.buf[0], 'z');
        free(heap);
    }
}

static void test_keysource_json_empty_pointer_is_the_whole_document(void)
{
    expect_json_key("\"abc\"", "", "abc");
    expect_json_key(" \"evt_9\"\n", "", "evt_9");
    expect_json_key("-3", "", "-3");
    CHECK_EQ_INT(JSON_FAILS("{\"id\":\"a\"}", ""), -EINVAL); /* an object */
    CHECK_EQ_INT(JSON_FAILS("\"\"", ""), -EINVAL);
    CHECK_EQ_INT(JSON_FAILS("abc", ""), -ENOENT); /* not JSON */
}

static void test_keysource_composite_joins_with_one_space(void)
{
    struct span two[] = { SPAN_LIT("//example.com/source"), SPAN_LIT("A234-1234-1234") };
    struct span one = SPAN_LIT("x");
    char *s = NULL;
    size_t len = 0;

    CHECK_EQ_INT(keysource_composite(two, 2, &s, &len), 0);
    CHECK_EQ_STR(s, "//example.com/source A234-1234-1234");
    CHECK_EQ_INT(len, strlen("//example.com/source A234-1234-1234"));
    free(s);

    struct span ab[] = { SPAN_LIT("a"), SPAN_LIT("b") };

    CHECK_EQ_INT(keysource_composite(ab, 2, &s, &len), 0);
    CHECK_EQ_STR(s, "a b");
    CHECK_EQ_INT(len, 3);
    free(s);

    CHECK_EQ_INT(keysource_composite(&one, 1, &s, &len), 0);
    CHECK_EQ_STR(s, "x");
    CHECK_EQ_INT(len, 1);
    free(s);

    /* Longer than one key: three values of 255 bytes. */
    char big[IDEMKEY_MAX];
    struct span three[3];

    memset(big, 'v', sizeof(big));
    for (size_t i = 0; i < 3; i++)
        three[i] = (struct span){ .base = big, .len = sizeof(big) };
    CHECK_EQ_INT(keysource_composite(three, 3, &s, &len), 0);
    CHECK_EQ_INT(len, 3 * IDEMKEY_MAX + 2);
    CHECK(s && strlen(s) == len && s[IDEMKEY_MAX] == ' ' && s[2 * IDEMKEY_MAX + 1] == ' ');
    free(s);
}

static void test_keysource_composite_refuses_bad_values(void)
{
    char big[IDEMKEY_MAX + 1];
    struct span v[2] = { SPAN_LIT("ok"), SPAN_LIT("") };

    CHECK_EQ_INT(composite_fails(v, 2), -EINVAL); /* empty */
    v[1] = SPAN_LIT("a b");
    CHECK_EQ_INT(composite_fails(v, 2), -EINVAL);
    v[1] = SPAN_LIT("a\x7f");
    CHECK_EQ_INT(composite_fails(v, 2), -EINVAL);
    v[1] = SPAN_LIT("caf\xc3\xa9");
    CHECK_EQ_INT(composite_fails(v, 2), -EINVAL);
    v[1] = (struct span){ .base = "a\0b", .len = 3 };
    CHECK_EQ_INT(composite_fails(v, 2), -EINVAL);
    v[1] = (struct span){ .base = NULL, .len = 0 }; /* an absent header */
    CHECK_EQ_INT(composite_fails(v, 2), -EINVAL);
    memset(big, 'b', sizeof(big));
    v[1] = (struct span){ .base = big, .len = IDEMKEY_MAX + 1 };
    CHECK_EQ_INT(composite_fails(v, 2), -EINVAL);
    v[0] = v[1];
    v[1] = SPAN_LIT("ok");
    CHECK_EQ_INT(composite_fails(v, 2), -EINVAL); /* the first value too */
    CHECK_EQ_INT(composite_fails(v + 1, 0), -EINVAL);
}

TEST_MAIN(test_keysource_pointer_check_accepts_rfc6901,
          test_keysource_pointer_check_refuses_bad_pointers,
          test_keysource_json_finds_stripe_event_id, test_keysource_json_indexes_arrays,
          test_keysource_json_unescapes_member_names, test_keysource_json_finds_nothing,
          test_keysource_json_integers_are_decimal_text, test_keysource_json_refuses_other_types,
          test_keysource_json_refuses_invalid_key_strings,
          test_keysource_json_refuses_what_is_not_one_json_text,
          test_keysource_json_reads_only_body_len,
          test_keysource_json_empty_pointer_is_the_whole_document,
          test_keysource_composite_joins_with_one_space,
          test_keysource_composite_refuses_bad_values)
