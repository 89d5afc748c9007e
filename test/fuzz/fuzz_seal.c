/* SPDX-License-Identifier: MIT */
/* Encryption at rest (doc/configuration.md): the key file, an operator's
 * file that must never leak a key into a message, and sealed records, which
 * come back from a store an attacker may write to. Input: a key file, a NUL,
 * then bytes that are both an answer's body to seal and a sealed body to
 * open. Properties: a parsed file has 1-64 keys, each id 1-32 bytes of
 * [A-Za-z0-9._-] and unique; a refusal's message never holds a line's
 * 44-byte key text; what is sealed holds no 8 bytes of its body in clear
 * after its header (whose key id is the file's), opens to the same answer,
 * and under another store key does not; bytes that open are a valid record;
 * nothing crashes or leaks. */
#define _GNU_SOURCE
#include <string.h>

#include "fuzz.h"
#include "idemproxy/record.h"
#include "idemproxy/seal.h"

#define TEST_KEYS "a:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n"

static bool is_id_byte(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
}

/* No 44-byte key text of a line of <text> is in <why>. */
static void check_no_key_in(struct span text, const char *why)
{
    struct span lines[SEAL_KEYS_MAX * 4];
    size_t n = fuzz_split(text, '\n', lines, ARRAY_SIZE(lines));

    for (size_t i = 0; i < n; i++) {
        const char *colon = memchr(lines[i].base, ':', lines[i].len);
        size_t rest = colon ? lines[i].len - (size_t)(colon + 1 - lines[i].base) : 0;

        if (rest >= 44)
            FUZZ_CHECK(!memmem(why, strlen(why), colon + 1, 44));
    }
}

static void check_keys(const struct seal_keys *k)
{
    FUZZ_CHECK(k->n >= 1 && k->n <= SEAL_KEYS_MAX);
    for (size_t i = 0; i < k->n; i++) {
        size_t len = strlen(k->keys[i].id);

        FUZZ_CHECK(len >= 1 && len <= SEAL_ID_MAX);
        for (size_t j = 0; j < len; j++)
            FUZZ_CHECK(is_id_byte(k->keys[i].id[j]));
        for (size_t j = 0; j < i; j++)
            FUZZ_CHECK(strcmp(k->keys[i].id, k->keys[j].id) != 0);
    }
}

/* Seals an answer of <body> and opens it again. */
static void check_round_trip(const struct seal_keys *k, struct span body)
{
    struct record *rec = record_new(body.len), *sealed = NULL, *out = NULL;
    enum seal_failure f;
    char id[SEAL_ID_MAX + 1];
    size_t hdr;

    FUZZ_CHECK(rec != NULL);
    rec->status = 200;
    FUZZ_CHECK(record_add_header(rec, SPAN_LIT("X-A"), SPAN_LIT("b")) == 0);
    FUZZ_CHECK(buf_append(&rec->body, body.base, body.len) == 0);
    FUZZ_CHECK(seal_record(k, SPAN_LIT("idem:s:k"), rec, &sealed) == 0);
    /* After the header (magic, key id, nonce), which the key id makes the
     * file's: no 8 bytes of the body in clear. */
    hdr = 4 + 1 + strlen(k->keys[0].id) + 12;
    FUZZ_CHECK(sealed->body.len > hdr);
    FUZZ_CHECK(body.len < 8 ||
               !memmem(sealed->body.data + hdr, sealed->body.len - hdr, body.base, body.len));
    FUZZ_CHECK(seal_open(k, SPAN_LIT("idem:s:k"), sealed, &out, &f, id) == 0);
    FUZZ_CHECK(out->status == 200 && out->nheaders == 1 && out->body.len == body.len);
    FUZZ_CHECK(body.len == 0 || !memcmp(out->body.data, body.base, body.len));
    FUZZ_CHECK(!strcmp(id, k->keys[0].id));
    record_unref(out);
    out = NULL;
    FUZZ_CHECK(seal_open(k, SPAN_LIT("idem:s:K"), sealed, &out, &f, id) == -EBADMSG);
    FUZZ_CHECK(f == SEAL_TAMPERED && out == NULL);
    record_unref(sealed);
    record_unref(rec);
}

/* Opens <bytes> as a stored sealed body: refused, or a valid record. */
static void check_open(const struct seal_keys *k, struct span bytes)
{
    struct record *rec = record_new(bytes.len), *out = NULL;
    enum seal_failure f = SEAL_OK;
    char id[SEAL_ID_MAX + 1];
    int err;

    FUZZ_CHECK(rec != NULL);
    rec->sealed = true;
    FUZZ_CHECK(buf_append(&rec->body, bytes.base, bytes.len) == 0);
    err = seal_open(k, SPAN_LIT("idem:s:k"), rec, &out, &f, id);
    FUZZ_CHECK(err == 0 || err == -EBADMSG);
    FUZZ_CHECK(strlen(id) <= SEAL_ID_MAX);
    if (err == 0) {
        FUZZ_CHECK(f == SEAL_OK && !out->sealed);
        FUZZ_CHECK(out->too_large || (out->status >= 100 && out->status <= 599));
    } else {
        FUZZ_CHECK(f != SEAL_OK && out == NULL);
    }
    record_unref(out);
    record_unref(rec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct span in = { (const char *)data, size }, parts[2];
    size_t n = fuzz_split(in, '\0', parts, 2);
    struct span text = parts[0], bytes = n > 1 ? parts[1] : (struct span){ "", 0 };
    struct seal_keys *k = NULL, *fixed = NULL;
    char why[256];
    int err;

    memset(why, 0, sizeof(why));
    err = seal_keys_parse(text, &k, why, sizeof(why));
    FUZZ_CHECK(err == 0 || err == -EINVAL);
    if (err == 0) {
        check_keys(k);
    } else {
        FUZZ_CHECK(k == NULL && why[0] != '\0');
        check_no_key_in(text, why);
    }
    FUZZ_CHECK(seal_keys_parse(SPAN_LIT(TEST_KEYS), &fixed, why, sizeof(why)) == 0);
    check_round_trip(k ? k : fixed, bytes);
    check_open(fixed, bytes);
    if (k)
        check_open(k, bytes);
    seal_keys_free(k);
    seal_keys_free(fixed);
    return 0;
}
