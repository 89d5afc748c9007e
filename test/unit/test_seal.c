/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "idemproxy/record.h"
#include "idemproxy/seal.h"

#define S(s) span_from_cstr(s)

/* Three keys (base64 of 32 bytes: 0x01.., 0x02.., 0x03..). */
#define K1 "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="
#define K2 "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI="
#define K3 "AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM="

static struct seal_keys *keys(const char *text)
{
    struct seal_keys *k = NULL;
    char why[256] = "";

    CHECK_EQ_INT(seal_keys_parse(S(text), &k, why, sizeof(why)), 0);
    if (!k) {
        fprintf(stderr, "keys: %s\n", why);
        abort();
    }
    return k;
}

/* The error of parsing <text>, whose message must hold <says>. */
static void check_refused(const char *text, const char *says)
{
    struct seal_keys *k = NULL;
    char why[256] = "";

    CHECK_EQ_INT(seal_keys_parse(S(text), &k, why, sizeof(why)), -EINVAL);
    CHECK(k == NULL);
    CHECK(strstr(why, says) != NULL);
    if (!strstr(why, says))
        fprintf(stderr, "  '%s' said: %s\n", text, why);
    /* No key byte is ever echoed. */
    CHECK(strstr(why, "AQEBAQ") == NULL);
}

static void test_seal_keys_parse(void)
{
    struct seal_keys *k = keys("# rotated 2026-11\nnew:" K2 "\r\n\nold-1.a_b:" K1 "\n");

    CHECK_EQ_INT(k->n, 2);
    CHECK_EQ_STR(k->keys[0].id, "new");
    CHECK_EQ_STR(k->keys[1].id, "old-1.a_b");
    CHECK_EQ_INT(k->keys[0].key[0], 2);
    CHECK_EQ_INT(k->keys[0].key[31], 2);
    CHECK_EQ_INT(k->keys[1].key[31], 1);
    seal_keys_free(k);
    k = keys("a:" K3); /* no final newline */
    CHECK_EQ_INT(k->n, 1);
    CHECK_EQ_INT(k->keys[0].key[5], 3);
    seal_keys_free(k);
}

static void test_seal_keys_refuse(void)
{
    check_refused("", "no key");
    check_refused("# only a comment\n\n", "no key");
    check_refused("k1 " K1 "\n", "line 1: not ID:KEY");
    check_refused("\n:" K1 "\n", "line 2: the key id is empty");
    check_refused("abcdefghijabcdefghijabcdefghijabc:" K1, "too long");
    check_refused("a b:" K1, "letters, digits");
    check_refused("k:" K1 "\nk:" K2, "line 2: the key id 'k' is given twice");
    check_refused("k:AQEB", "line 1: the key is not 32 bytes");
    check_refused("k:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEB", "not 32 bytes"); /* no '=' */
    check_refused("k:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQ==", "not 32 bytes"); /* 31 bytes */
    check_refused("k:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQ!=", "not 32 bytes");
    check_refused("k:" K1 " ", "not 32 bytes");
    {
        char text[SEAL_FILE_MAX + 2];

        memset(text, '#', sizeof(text) - 1);
        text[sizeof(text) - 1] = '\0';
        check_refused(text, "larger than");
    }
    {
        char text[(SEAL_KEYS_MAX + 1) * 56] = "";

        for (int i = 0; i <= SEAL_KEYS_MAX; i++)
            snprintf(text + strlen(text), sizeof(text) - strlen(text), "k%d:%s\n", i, K1);
        check_refused(text, "more than 64 keys");
    }
}

static void test_seal_keys_load(void)
{
    char path[] = "/tmp/test_seal_XXXXXX", why[512] = "";
    struct seal_keys *k = NULL;
    int fd = mkstemp(path);

    CHECK(fd >= 0);
    CHECK_EQ_INT(write(fd, "x:" K1 "\n", 47), 47);
    close(fd);
    CHECK_EQ_INT(seal_keys_load(path, &k, why, sizeof(why)), 0);
    CHECK(k && k->n == 1);
    seal_keys_free(k);
    k = NULL;
    fd = open(path, O_WRONLY | O_TRUNC);
    CHECK_EQ_INT(write(fd, "x-" K1 "\n", 47), 47);
    close(fd);
    CHECK_EQ_INT(seal_keys_load(path, &k, why, sizeof(why)), -EINVAL);
    CHECK(strstr(why, path) && strstr(why, "line 1"));
    unlink(path);
    CHECK_EQ_INT(seal_keys_load(path, &k, why, sizeof(why)), -EINVAL);
    CHECK(strstr(why, "cannot read it"));
    CHECK_EQ_INT(seal_keys_load("/tmp", &k, why, sizeof(why)), -EINVAL);
    CHECK(strstr(why, "not a file"));
    CHECK(k == NULL);
}

static struct record *answer(void)
{
    struct record *rec = record_new(1 << 20);

    rec->status = 201;
    CHECK_EQ_INT(record_add_header(rec, S("Set-Cookie"), S("session=SECRETCOOKIE")), 0);
    CHECK_EQ_INT(record_add_header(rec, S("Set-Cookie"), S("b=2")), 0);
    CHECK_EQ_INT(buf_append(&rec->body, "{\"card\":\"4242424242424242\"}", 27), 0);
    return rec;
}

static void check_same(const struct record *a, const struct record *b)
{
    CHECK_EQ_INT(a->status, b->status);
    CHECK_EQ_INT(a->too_large, b->too_large);
    CHECK(!b->sealed);
    CHECK_EQ_INT(a->nheaders, b->nheaders);
    for (size_t i = 0; i < a->nheaders && i < b->nheaders; i++) {
        CHECK_EQ_STR(a->headers[i].name, b->headers[i].name);
        CHECK_EQ_STR(a->headers[i].value, b->headers[i].value);
    }
    CHECK_EQ_INT(a->body.len, b->body.len);
    if (a->body.len == b->body.len)
        CHECK(a->body.len == 0 || !memcmp(a->body.data, b->body.data, a->body.len));
}

/* <rec> does not open for <store_key> under <k>, for <why>. */
static void check_closed(const struct seal_keys *k, const char *store_key, struct record *rec,
                         enum seal_failure why)
{
    struct record *out = NULL;
    enum seal_failure f = SEAL_OK;
    char id[SEAL_ID_MAX + 1];

    CHECK_EQ_INT(seal_open(k, S(store_key), rec, &out, &f, id), -EBADMSG);
    CHECK(out == NULL);
    CHECK_EQ_INT(f, why);
    CHECK(strlen(seal_failure_text(f)) > 10);
}

static bool holds(const struct record *rec, const char *s)
{
    return memmem(rec->body.data, rec->body.len, s, strlen(s)) != NULL;
}

static void test_seal_round_trip_and_failures(void)
{
    struct seal_keys *k = keys("new:" K2 "\nold:" K1), *old = keys("old:" K1),
                     *only_new = keys("new:" K2), *evil = keys("new:" K3);
    struct record *rec = answer(), *sealed = NULL, *again = NULL, *out = NULL;
    enum seal_failure f;
    struct buf head = BUF_INIT(1 << 20);
    char id[SEAL_ID_MAX + 1];

    CHECK_EQ_INT(seal_record(old, S("idem:s:k1"), rec, &sealed), 0);
    CHECK(sealed->sealed && sealed->status == 0 && sealed->nheaders == 0);
    CHECK(!holds(sealed, "SECRETCOOKIE") && !holds(sealed, "4242") && !holds(sealed, "Set-Cookie"));
    /* A fresh nonce each time: the same answer seals to other bytes. */
    CHECK_EQ_INT(seal_record(old, S("idem:s:k1"), rec, &again), 0);
    CHECK(again->body.len == sealed->body.len &&
          memcmp(again->body.data, sealed->body.data, sealed->body.len));
    /* Rotation: "old" still opens under a file that seals with "new". */
    CHECK_EQ_INT(seal_open(k, S("idem:s:k1"), sealed, &out, &f, id), 0);
    CHECK_EQ_INT(f, SEAL_OK);
    CHECK_EQ_STR(id, "old");
    check_same(rec, out);
    record_unref(out);
    out = NULL;
    check_closed(only_new, "idem:s:k1", sealed, SEAL_UNKNOWN_KEY);
    check_closed(NULL, "idem:s:k1", sealed, SEAL_NO_KEYS);
    check_closed(k, "idem:s:k2", sealed, SEAL_TAMPERED); /* moved to another key */
    check_closed(k, "", sealed, SEAL_TAMPERED);
    check_closed(k, "idem:s:k1", rec, SEAL_CLEAR);
    /* Same id, another key: the tag fails. */
    record_unref(again);
    CHECK_EQ_INT(seal_record(evil, S("idem:s:k1"), rec, &again), 0);
    check_closed(k, "idem:s:k1", again, SEAL_TAMPERED);
    /* Every single flipped bit is caught. */
    for (size_t i = 0; i < sealed->body.len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            enum seal_failure g = SEAL_OK;

            sealed->body.data[i] ^= (char)(1 << bit);
            CHECK_EQ_INT(seal_open(k, S("idem:s:k1"), sealed, &out, &g, id), -EBADMSG);
            CHECK(g != SEAL_OK);
            sealed->body.data[i] ^= (char)(1 << bit);
        }
    }
    /* Cut short anywhere: refused. */
    for (size_t n = 0; n < sealed->body.len; n++) {
        size_t len = sealed->body.len;

        sealed->body.len = n;
        CHECK_EQ_INT(seal_open(k, S("idem:s:k1"), sealed, &out, &f, id), -EBADMSG);
        sealed->body.len = len;
    }
    /* Without keys, a clear record is itself. */
    CHECK_EQ_INT(seal_open(NULL, S("idem:s:k1"), rec, &out, &f, id), 0);
    CHECK(out == rec);
    record_unref(out);
    /* The sealed record survives the stores' codec. */
    CHECK_EQ_INT(record_encode_head(sealed, &head), 0);
    record_unref(again);
    again = NULL;
    CHECK_EQ_INT(record_decode(buf_span(&head), buf_span(&sealed->body), &again), 0);
    CHECK(again && again->sealed);
    CHECK_EQ_INT(seal_open(k, S("idem:s:k1"), again, &out, &f, id), 0);
    check_same(rec, out);
    record_unref(out);
    buf_done(&head);
    record_unref(again);
    record_unref(sealed);
    record_unref(rec);
    seal_keys_free(k);
    seal_keys_free(old);
    seal_keys_free(only_new);
    seal_keys_free(evil);
}

static void test_seal_markers_and_empty_bodies(void)
{
    struct seal_keys *k = keys("a:" K1);
    struct record *marker = record_new_too_large(201), *empty = record_new(0), *s = NULL,
                  *out = NULL;
    enum seal_failure f;
    char id[SEAL_ID_MAX + 1];

    empty->status = 204;
    CHECK_EQ_INT(seal_record(k, S("idem:x:y"), marker, &s), 0);
    CHECK_EQ_INT(seal_open(k, S("idem:x:y"), s, &out, &f, id), 0);
    CHECK(out && out->too_large && out->status == 201);
    record_unref(out);
    record_unref(s);
    CHECK_EQ_INT(seal_record(k, S("idem:x:y"), empty, &s), 0);
    CHECK_EQ_INT(seal_open(k, S("idem:x:y"), s, &out, &f, id), 0);
    check_same(empty, out);
    record_unref(out);
    record_unref(s);
    record_unref(marker);
    record_unref(empty);
    seal_keys_free(k);
}

TEST_MAIN(test_seal_keys_parse, test_seal_keys_refuse, test_seal_keys_load,
          test_seal_round_trip_and_failures, test_seal_markers_and_empty_bodies)
