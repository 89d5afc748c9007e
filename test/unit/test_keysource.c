/* SPDX-License-Identifier: MIT */
#include <stdlib.h>

#include "check.h"
#include "idemproxy/keysource.h"
#include "idemproxy/request.h"

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

/* ---- the kinds of key source ---- */

static struct request *request_with(const char *const *headers)
{
    struct request *rq = request_new("/pay");

    CHECK(rq != NULL);
    for (; headers && *headers; headers++) {
        const char *colon = strchr(*headers, ':');

        CHECK_EQ_INT(request_add_header(rq, (struct span){ *headers, (size_t)(colon - *headers) },
                                        span_from_cstr(colon + 2)),
                     0);
    }
    return rq;
}

static int set1(struct keysource *ks, const char *name, const char *v, char *why, size_t len)
{
    return keysource_set(ks, name, &v, 1, false, why, len);
}

static void test_keysource_kinds_are_set_by_name(void)
{
    struct keysource ks = { 0 };
    const char *pair[] = { "ce-source", "ce-id" };
    char why[256];

    CHECK_EQ_INT(keysource_set_default(&ks, "Idempotency-Key"), 0);
    CHECK_EQ_STR(keysource_name(&ks), "header");
    CHECK_EQ_STR(ks.names[0], "Idempotency-Key");
    keysource_done(&ks);
    CHECK_EQ_INT(keysource_set(&ks, "headers", pair, 2, true, why, sizeof(why)), 0);
    CHECK_EQ_STR(keysource_name(&ks), "headers");
    CHECK_EQ_INT(keysource_set_default(&ks, "Idempotency-Key"), 0); /* given: kept */
    CHECK_EQ_INT(ks.nnames, 2);
    CHECK_EQ_INT(set1(&ks, "json", "/id", why, sizeof(why)), -EINVAL);
    CHECK_EQ_STR(why, "key: one source only (header, headers or json)");
    CHECK_EQ_INT(set1(&ks, "fallback", "fingerprint", why, sizeof(why)), 0);
    CHECK(ks.fallback);
    keysource_done(&ks);
    keysource_done(&ks); /* idempotent */

    CHECK_EQ_INT(set1(&ks, "json", "id", why, sizeof(why)), -EINVAL);
    CHECK(strncmp(why, "key.json: 'id' is not a JSON pointer", 36) == 0);
    CHECK_EQ_INT(set1(&ks, "header", "a b", why, sizeof(why)), -EINVAL);
    CHECK_EQ_STR(why, "key.header: 'a b' is not a header name");
    CHECK_EQ_INT(set1(&ks, "headers", "one", why, sizeof(why)), -EINVAL); /* not a list */
    CHECK_EQ_INT(set1(&ks, "fallback", "body", why, sizeof(why)), -EINVAL);
    CHECK_EQ_INT(set1(&ks, "colour", "red", why, sizeof(why)), -ENOENT);
    CHECK(ks.kind == NULL && !ks.fallback); /* nothing was set */
}

static void test_keysource_reads_each_kind_with_its_own_tag(void)
{
    struct keysource header = { 0 }, headers = { 0 }, json = { 0 };
    const char *pair[] = { "ce-source", "ce-id" };
    struct request *rq = request_with((const char *const[]){
        "Idempotency-Key: \"k1\"", "ce-source: /src", "ce-id: 7", NULL });
    struct keysource_key k = { 0 }, c = { 0 }, j = { 0 }, f = { 0 };
    char why[256], detail[512];
    uint8_t digest[4] = { 0xde, 0xad, 0xbe, 0xef };

    CHECK_EQ_INT(keysource_set_default(&header, "Idempotency-Key"), 0);
    CHECK_EQ_INT(keysource_set(&headers, "headers", pair, 2, true, why, sizeof(why)), 0);
    CHECK_EQ_INT(set1(&json, "json", "/id", why, sizeof(why)), 0);

    CHECK_EQ_INT(keysource_read(&header, rq, &k, detail, sizeof(detail)), KEYSOURCE_FOUND);
    CHECK(span_eq(k.key, SPAN_LIT("k1")));        /* the sf-string unquoted */
    CHECK(span_eq(k.sent, SPAN_LIT("\"k1\""))); /* as sent, for the log */
    CHECK(k.derived == NULL && keysource_tag(&header, &k).base == NULL);

    CHECK_EQ_INT(keysource_read(&headers, rq, &c, detail, sizeof(detail)), KEYSOURCE_FOUND);
    CHECK_EQ_STR(c.derived, "/src 7");
    CHECK(keysource_tag(&headers, &c).len > 0);

    CHECK_EQ_INT(keysource_read(&json, rq, &j, detail, sizeof(detail)), KEYSOURCE_IN_BODY);
    CHECK_EQ_INT(keysource_read_body(&json, SPAN_LIT("{\"id\": \"evt_1\"}"), &j, detail,
                                     sizeof(detail)),
                 KEYSOURCE_FOUND);
    CHECK_EQ_STR(j.derived, "evt_1");
    CHECK_EQ_INT(keysource_read_body(&header, SPAN_LIT("{}"), &f, detail, sizeof(detail)),
                 KEYSOURCE_MISSING); /* a header source reads no body */
    CHECK_EQ_INT(keysource_fingerprint(digest, sizeof(digest), &f), KEYSOURCE_FOUND);
    CHECK_EQ_STR(f.derived, "deadbeef");

    /* no two sources share a tag, and the client's own key header has none */
    CHECK(!span_eq(keysource_tag(&headers, &c), keysource_tag(&json, &j)));
    CHECK(!span_eq(keysource_tag(&json, &j), keysource_tag(&header, &f)));
    CHECK(keysource_tag(&header, &f).len > 0); /* a fingerprint, whatever the source */
    keysource_key_done(&k);
    keysource_key_done(&c);
    keysource_key_done(&j);
    keysource_key_done(&f);
    keysource_done(&header);
    keysource_done(&headers);
    keysource_done(&json);
    request_free(rq);
}

static void test_keysource_missing_invalid_and_described(void)
{
    struct keysource header = { 0 }, headers = { 0 }, json = { 0 };
    const char *pair[] = { "a", "b" };
    struct request *twice = request_with((const char *const[]){ "K: x", "K: y", "a: 1", NULL });
    struct request *bad = request_with((const char *const[]){ "K: a,b", "a: 1", "b: \x01", NULL });
    struct keysource_key k = { 0 };
    char why[256], detail[512];

    CHECK_EQ_INT(keysource_set_default(&header, "K"), 0);
    CHECK_EQ_INT(keysource_set(&headers, "headers", pair, 2, true, why, sizeof(why)), 0);
    CHECK_EQ_INT(set1(&json, "json", "", why, sizeof(why)), 0);
    CHECK_EQ_INT(keysource_read(&header, twice, &k, detail, sizeof(detail)), KEYSOURCE_INVALID);
    CHECK_EQ_STR(detail, "Send exactly one K header.");
    CHECK_EQ_INT(keysource_read(&header, bad, &k, detail, sizeof(detail)), KEYSOURCE_INVALID);
    CHECK(span_eq(k.sent, SPAN_LIT("a,b"))); /* still logged as sent */
    CHECK_EQ_INT(keysource_read(&headers, twice, &k, detail, sizeof(detail)), KEYSOURCE_MISSING);
    CHECK_EQ_INT(keysource_read(&headers, bad, &k, detail, sizeof(detail)), KEYSOURCE_INVALID);
    CHECK_EQ_INT(keysource_read_body(&json, SPAN_LIT("not json"), &k, detail, sizeof(detail)),
                 KEYSOURCE_MISSING);
    CHECK_EQ_INT(keysource_read_body(&json, SPAN_LIT("1.5"), &k, detail, sizeof(detail)),
                 KEYSOURCE_INVALID);
    CHECK(k.derived == NULL);

    keysource_describe(&header, detail, sizeof(detail));
    CHECK_EQ_STR(detail, "This request must carry an K header.");
    keysource_describe(&headers, detail, sizeof(detail));
    CHECK_EQ_STR(detail, "This request must carry the headers a, b, each once.");
    keysource_describe(&json, detail, sizeof(detail));
    CHECK_EQ_STR(detail, "This request must carry a JSON body with its idempotency key at the "
                         "top level (a string or an integer).");
    CHECK(span_eq(keysource_sent(&header, twice), SPAN_LIT("x")));
    CHECK(keysource_sent(&headers, twice).base == NULL);
    keysource_done(&header);
    keysource_done(&headers);
    keysource_done(&json);
    request_free(twice);
    request_free(bad);
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
          test_keysource_composite_refuses_bad_values, test_keysource_kinds_are_set_by_name,
          test_keysource_reads_each_kind_with_its_own_tag,
          test_keysource_missing_invalid_and_described)
