/* SPDX-License-Identifier: MIT */
/* A route's reconcile: block, pure (reconcile.h; doc/configuration.md,
 * Reconcile): target templates checked and expanded with every byte of a
 * client's key or body value as data, and what a probe's answer proves. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "idemproxy/buf.h"
#include "idemproxy/http.h"
#include "idemproxy/reconcile.h"
#include "idemproxy/record.h"

static const char *expand(const char *tmpl, const char *key, const char *body, int *ret)
{
    static char out[RECONCILE_TARGET_MAX + 64];
    struct buf b = BUF_INIT(SIZE_MAX);
    const char *why;

    *ret = reconcile_target_expand(tmpl, span_from_cstr(key), span_from_cstr(body), &b, &why);
    snprintf(out, sizeof(out), "%.*s", (int)b.len, b.data ? b.data : "");
    buf_done(&b);
    return out;
}

static void test_reconcile_target_check(void)
{
    static const char *const good[] = { "/v1/payments?client_reference={key}",
                                        "/v1/orders/{body:/order/id}",
                                        "/p?a={key}&b={body:/a~1b}&c=%20", "/plain" };
    static const char *const bad[] = { "v1/p?{key}",    "/p?{kee}",    "/p?{key",
                                       "/p?key}",       "/p#{key}",    "/p {key}",
                                       "/p?{body:}",    "/p?{body:x}", "/p?{body:/a{b}",
                                       "/p?{body:/a~2}" };
    char why[256];

    for (size_t i = 0; i < ARRAY_SIZE(good); i++)
        CHECK_EQ_INT(reconcile_target_check(good[i], why, sizeof(why)), 0);
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        why[0] = '\0';
        CHECK_EQ_INT(reconcile_target_check(bad[i], why, sizeof(why)), -EINVAL);
        CHECK(why[0] != '\0');
    }
}

static void test_reconcile_target_reads(void)
{
    const char *t = "/o/{body:/order/id}?k={key}";

    CHECK(reconcile_target_reads(t, "/order/id"));
    CHECK(reconcile_target_reads(t, "/order"));
    CHECK(reconcile_target_reads(t, ""));
    CHECK(!reconcile_target_reads(t, "/ord"));
    CHECK(!reconcile_target_reads(t, "/order/id2"));
    CHECK(!reconcile_target_reads("/p?k={key}", ""));
}

static void test_reconcile_target_expand(void)
{
    int r;

    CHECK_EQ_STR(expand("/v1/p?ref={key}", "order-1", "", &r), "/v1/p?ref=order-1");
    CHECK_EQ_INT(r, 0);
    /* a client's '/', '?', '#', '&', '=', '%', '+' are data */
    CHECK_EQ_STR(expand("/v1/p?ref={key}&x=1", "a/../b?c=d&e#f%25+", "", &r),
                 "/v1/p?ref=a%2F..%2Fb%3Fc%3Dd%26e%23f%2525%2B&x=1");
    CHECK_EQ_STR(expand("/o/{body:/order/id}", "k", "{\"order\": {\"id\": \"x y/\\u00e9\"}}", &r),
                 "/o/x%20y%2F%C3%A9");
    CHECK_EQ_INT(r, 0);
    CHECK_EQ_STR(expand("/o/{body:/a~1b}/{key}", "k~", "{\"a/b\": \"v\"}", &r), "/o/v/k~");
    /* a pointer that finds no string: no target, never a guess */
    expand("/o/{body:/id}", "k", "{\"id\": 7}", &r);
    CHECK_EQ_INT(r, -ENOENT);
    expand("/o/{body:/id}", "k", "{\"other\": \"x\"}", &r);
    CHECK_EQ_INT(r, -ENOENT);
    expand("/o/{body:/id}", "k", "not json", &r);
    CHECK_EQ_INT(r, -ENOENT);
    {
        char *big = malloc(4000);

        memset(big, 'x', 3999);
        big[3999] = '\0';
        expand("/o/{key}/{key}/{key}", big, "", &r);
        CHECK_EQ_INT(r, -E2BIG);
        free(big);
    }
}

/* Every byte of a key, encoded, is one RFC 3986 unreserved byte or a %XX,
 * the expansion is in origin-form, and decoding it gives the key back. */
static void test_reconcile_every_key_byte_is_data(void)
{
    char key[96], dec[512];
    unsigned seed = 40;

    for (int n = 0; n < 2000; n++) {
        size_t len = 1 + (size_t)(rand_r(&seed) % 90), dlen = 0;
        const char *t;
        int r;

        for (size_t i = 0; i < len; i++)
            key[i] = (char)(0x21 + rand_r(&seed) % 94);
        key[len] = '\0';
        t = expand("/p?r={key}", key, "", &r);
        CHECK_EQ_INT(r, 0);
        CHECK(strncmp(t, "/p?r=", 5) == 0);
        CHECK(http_is_origin_form(span_from_cstr(t)));
        CHECK(strcspn(t + 5, "/?#&=+") == strlen(t + 5));
        CHECK(http_percent_decode(span_from_cstr(t + 5), dec, &dlen) == 0);
        CHECK(dlen == len && memcmp(dec, key, len) == 0);
    }
}

static struct record *answer(unsigned status, const char *body)
{
    struct record *rec = record_new(1 << 20);

    rec->status = status;
    buf_append(&rec->body, body, strlen(body));
    return rec;
}

static int judge(const struct reconcile_config *c, unsigned status, const char *body,
                 struct record **kept)
{
    struct record *a = answer(status, body);
    const char *why = NULL;
    int v = reconcile_judge(c, a, 1 << 20, kept, &why);

    CHECK(why != NULL);
    record_unref(a);
    return v;
}

static void test_reconcile_judge(void)
{
    struct reconcile_config c;
    struct record *kept = NULL;

    reconcile_config_init(&c);
    c.found = (struct reconcile_rule){ .status = { 200 }, .nstatus = 1, .pointer = "/data/0" };
    c.absent =
        (struct reconcile_rule){ .status = { 200, 404 }, .nstatus = 2, .pointer = "/data/0" };
    c.answer_status = 201;
    CHECK_EQ_INT(judge(&c, 200, "{\"data\": [{\"id\": \"pay_1\", \"n\": 1}]}", &kept),
                 RECONCILE_FOUND);
    CHECK(kept && kept->status == 201);
    if (kept) {
        CHECK_EQ_STR(record_header_get(kept, "Content-Type"), "application/json");
        CHECK_EQ_STR(record_header_get(kept, RECONCILE_HEADER), "true");
        CHECK(kept->body.len == strlen("{\"id\":\"pay_1\",\"n\":1}") &&
              memcmp(kept->body.data, "{\"id\":\"pay_1\",\"n\":1}", kept->body.len) == 0);
        record_unref(kept);
    }
    CHECK_EQ_INT(judge(&c, 200, "{\"data\": []}", &kept), RECONCILE_ABSENT);
    CHECK(!kept);
    CHECK_EQ_INT(judge(&c, 404, "{\"error\": \"none\"}", &kept), RECONCILE_ABSENT);
    CHECK_EQ_INT(judge(&c, 404, "", &kept), RECONCILE_ABSENT); /* not JSON: no pointer */
    CHECK_EQ_INT(judge(&c, 500, "{\"data\": []}", &kept), RECONCILE_FAILED); /* not listed */
    CHECK_EQ_INT(judge(&c, 401, "", &kept), RECONCILE_FAILED);
    CHECK_EQ_INT(judge(&c, 404, "{\"data\": [1]}", &kept), RECONCILE_FAILED); /* neither */
    /* JSON jansson is lenient with is JSON; JSON it cannot read proves nothing */
    CHECK_EQ_INT(
        judge(&c, 200, "{\"data\": [{\"n\": 18446744073709551616}], \"data\": [1]}", &kept),
        RECONCILE_FOUND);
    record_unref(kept);
    CHECK_EQ_INT(judge(&c, 200, "\xef\xbb\xbf {\"data\": [1], \"x\": \"\xff\"}", &kept),
                 RECONCILE_FAILED);
    CHECK_EQ_INT(judge(&c, 200, "[{\"data\": [1]", &kept), RECONCILE_FAILED);
    /* both rules match: proves nothing */
    c.absent.pointer = "/other";
    CHECK_EQ_INT(judge(&c, 200, "{\"data\": [1]}", &kept), RECONCILE_FAILED);
    CHECK(!kept);
    /* found without a pointer keeps the whole body */
    c.found.pointer = NULL;
    c.absent.nstatus = 0;
    CHECK_EQ_INT(judge(&c, 200, "{\"id\": 3}", &kept), RECONCILE_FOUND);
    CHECK(kept && kept->body.len == 9);
    record_unref(kept);
    /* larger than the route keeps: failed */
    {
        struct record *a = answer(200, "{\"id\": 3}");
        const char *why;

        CHECK_EQ_INT(reconcile_judge(&c, a, 4, &kept, &why), RECONCILE_FAILED);
        CHECK(!kept);
        record_unref(a);
    }
}

TEST_MAIN(test_reconcile_target_check, test_reconcile_target_reads, test_reconcile_target_expand,
          test_reconcile_every_key_byte_is_data, test_reconcile_judge)
