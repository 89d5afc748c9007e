/* SPDX-License-Identifier: MIT */
/* A stored record as read back from the store (untrusted: whoever can write
 * to Redis wrote it; a sealed one too, whose body seal.h opens). Input: a 4-byte big-endian head
 * length, the head, then the body (a length past the end takes the rest as head). A record that
 * decodes must re-encode to the very same head (the encoding is canonical)
 * and decode again to the same status, flags, headers and body. */
#include <stdlib.h>

#include "fuzz.h"
#include "idemproxy/record.h"

static void check_same(const struct record *a, const struct record *b)
{
    FUZZ_CHECK(a->status == b->status && a->too_large == b->too_large && a->sealed == b->sealed);
    FUZZ_CHECK(a->nheaders == b->nheaders);
    for (size_t i = 0; i < a->nheaders; i++) {
        FUZZ_CHECK(strcmp(a->headers[i].name, b->headers[i].name) == 0);
        FUZZ_CHECK(strcmp(a->headers[i].value, b->headers[i].value) == 0);
    }
    FUZZ_CHECK(a->body.len == b->body.len);
    FUZZ_CHECK(!a->body.len || memcmp(a->body.data, b->body.data, a->body.len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct span head, body;
    struct record *rec = NULL, *again = NULL;
    struct buf enc = BUF_INIT(1 << 24);
    size_t hlen;
    int r;

    if (size < 4)
        return 0;
    hlen = (size_t)data[0] << 24 | (size_t)data[1] << 16 | (size_t)data[2] << 8 | data[3];
    if (hlen > size - 4)
        hlen = size - 4;
    head = (struct span){ .base = (const char *)data + 4, .len = hlen };
    body = (struct span){ .base = head.base + hlen, .len = size - 4 - hlen };

    r = record_decode(head, body, &rec);
    if (r < 0) {
        FUZZ_CHECK(r == -EPROTO && rec == NULL);
        return 0;
    }
    /* A sealed record (seal.h) holds nothing but its sealed body. */
    FUZZ_CHECK(!rec->sealed || (rec->status == 0 && !rec->too_large && rec->nheaders == 0));
    FUZZ_CHECK(rec->sealed || rec->too_large || (rec->status >= 100 && rec->status <= 599));
    FUZZ_CHECK(rec->status <= UINT16_MAX && rec->nheaders <= RECORD_MAX_HEADERS);
    FUZZ_CHECK(rec->body.len == body.len);
    FUZZ_CHECK(!body.len || memcmp(rec->body.data, body.base, body.len) == 0);
    for (size_t i = 0; i < rec->nheaders; i++)
        (void)record_header_get(rec, rec->headers[i].name);
    FUZZ_CHECK(record_mem_bytes(rec) >= sizeof(*rec) + body.len);

    FUZZ_CHECK(record_encode_head(rec, &enc) == 0);
    FUZZ_CHECK(enc.len == head.len && memcmp(enc.data, head.base, head.len) == 0);
    FUZZ_CHECK(record_decode(buf_span(&enc), buf_span(&rec->body), &again) == 0);
    check_same(rec, again);

    record_unref(again);
    record_unref(rec);
    buf_done(&enc);
    return 0;
}
