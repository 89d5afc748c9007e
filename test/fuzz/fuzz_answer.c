/* SPDX-License-Identifier: MIT */
/* The answer reader (answer_reader.h): the bytes an upstream sends on a
 * connection, read as they come. Whatever the bytes and however they are
 * cut into reads, the reader says the same: the same error or the same
 * answer (status, header fields, body), and where it ended. No byte after
 * that end is ever taken for its body (the rest is the next answer's, or
 * garbage: never this one's), the body is the same whether kept in the
 * record or streamed to a sink from the read after the head, and every
 * field kept is one the proxy may pass on. Input: a byte of flags (bit 0:
 * the request was a HEAD; bit 1: a small header limit), a byte that seeds
 * the cuts, then the connection's bytes. */
#include "fuzz.h"
#include "idemproxy/answer_reader.h"
#include "idemproxy/http.h"
#include "idemproxy/record.h"

#define MAX_BODY (1u << 20)

struct result {
    int err;
    bool done;
    size_t used; /* bytes taken for the answer */
    unsigned status;
    struct buf head; /* the kept fields, encoded */
    struct buf body;
};

/* The sink of a streamed body: every piece lies within the bytes of the
 * current read that the answer takes. */
struct sink {
    struct result *res;
    const char *base;
    size_t len;
};

static int take(void *ctx, const char *p, size_t n)
{
    struct sink *s = ctx;

    FUZZ_CHECK(p >= s->base && p + n <= s->base + s->len);
    FUZZ_CHECK(buf_append(&s->res->body, p, n) == 0);
    return 0;
}

static void keep_record(struct result *res, struct record *rec)
{
    FUZZ_CHECK(rec);
    for (size_t i = 0; i < rec->nheaders; i++) {
        struct span name = span_from_cstr(rec->headers[i].name);
        struct span value = span_from_cstr(rec->headers[i].value);

        FUZZ_CHECK(http_is_token(name) && http_is_field_value(value));
        FUZZ_CHECK(!http_is_hop_by_hop(name));
        FUZZ_CHECK(buf_append(&res->head, name.base, name.len) == 0);
        FUZZ_CHECK(buf_append(&res->head, "\n", 1) == 0);
        FUZZ_CHECK(buf_append(&res->head, value.base, value.len) == 0);
        FUZZ_CHECK(buf_append(&res->head, "\n", 1) == 0);
    }
    FUZZ_CHECK(buf_append(&res->body, rec->body.data, rec->body.len) == 0);
    res->status = rec->status;
    FUZZ_CHECK(res->status >= 200 && res->status <= 999);
    record_unref(rec);
}

/* The size of the next read, 1 to 97 bytes, from <seed>. */
static size_t next_piece(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return 1 + (*seed >> 16) % 97;
}

/* Reads <in> in pieces of the sizes <seed> makes (0: one piece), streaming
 * the body from the read after the head when <stream>. */
static void run(const uint8_t *in, size_t n, bool head, size_t max_head, unsigned seed,
                bool stream, struct result *res)
{
    struct answer_reader r;
    struct sink s = { .res = res };
    size_t off = 0;
    bool streaming = false;

    *res = (struct result){ .head = BUF_INIT(1u << 20), .body = BUF_INIT(MAX_BODY * 2) };
    FUZZ_CHECK(answer_reader_init(&r, MAX_BODY, max_head, head) == 0);
    while (off < n) {
        size_t piece = seed ? next_piece(&seed) : n;
        ssize_t used;

        piece = piece > n - off ? n - off : piece;
        s.base = (const char *)in + off;
        s.len = piece;
        used = answer_reader_feed(&r, (const char *)in + off, piece);
        if (used < 0) {
            res->err = (int)used;
            FUZZ_CHECK(r.err == res->err);
            break;
        }
        FUZZ_CHECK((size_t)used <= piece);
        s.len = (size_t)used;
        off += (size_t)used;
        if (r.done) {
            res->done = true;
            break;
        }
        FUZZ_CHECK((size_t)used == piece);
        if (stream && r.head_done && !streaming) {
            keep_record(res, answer_reader_take(&r)); /* the head, and the body so far */
            answer_reader_set_sink(&r, take, &s);
            streaming = true;
        }
    }
    if (!res->err && !res->done) {
        res->err = answer_reader_close(&r);
        res->done = res->err == 0;
        FUZZ_CHECK(res->done == r.done);
    }
    res->used = off;
    if (res->done) {
        FUZZ_CHECK(r.head_done && r.status >= 200);
        if (!streaming)
            keep_record(res, answer_reader_take(&r));
        else
            FUZZ_CHECK(answer_reader_take(&r) == NULL);
    }
    answer_reader_done(&r);
}

static bool bytes_eq(const struct buf *a, const struct buf *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

static void same(const struct result *a, const struct result *b)
{
    FUZZ_CHECK(a->err == b->err && a->done == b->done);
    if (!a->done)
        return;
    FUZZ_CHECK(a->used == b->used && a->status == b->status);
    FUZZ_CHECK(bytes_eq(&a->head, &b->head) && bytes_eq(&a->body, &b->body));
}

static void result_done(struct result *r)
{
    buf_done(&r->head);
    buf_done(&r->body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct result whole, cut, streamed, alone;
    bool head;
    size_t max_head;

    if (size < 2)
        return 0;
    head = data[0] & 1;
    max_head = (data[0] & 2) ? 64 : 4096;
    run(data + 2, size - 2, head, max_head, 0, false, &whole);
    run(data + 2, size - 2, head, max_head, data[1] | 1u, false, &cut);
    run(data + 2, size - 2, head, max_head, data[1] | 0x100u, true, &streamed);
    same(&whole, &cut);
    same(&whole, &streamed);
    FUZZ_CHECK(whole.body.len <= whole.used);
    if (whole.done && whole.used < size - 2) {
        /* An answer that ended before the bytes did ended on its own: the
         * bytes it took alone say the same, and what follows them cannot
         * change it. */
        run(data + 2, whole.used, head, max_head, 0, false, &alone);
        same(&whole, &alone);
        result_done(&alone);
    }
    result_done(&whole);
    result_done(&cut);
    result_done(&streamed);
    return 0;
}
