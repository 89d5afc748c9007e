/* SPDX-License-Identifier: MIT */
/* The answer reader: each framing, what it keeps, where it stops, and what
 * it refuses. fuzz_answer checks that any cut into reads says the same. */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "idemproxy/answer_reader.h"
#include "idemproxy/record.h"

/* Feeds <text> in pieces of <piece> bytes (0: at once), then the close when
 * <close>. Returns the last feed's or the close's result, or what was taken
 * in all once the answer is done. */
static ssize_t read_all(struct answer_reader *r, const char *text, size_t piece, bool close)
{
    size_t n = strlen(text), off = 0;

    while (off < n) {
        size_t k = piece && piece < n - off ? piece : n - off;
        ssize_t used = answer_reader_feed(r, text + off, k);

        if (used < 0)
            return used;
        off += (size_t)used;
        if (r->done)
            return (ssize_t)off;
    }
    if (close) {
        int err = answer_reader_close(r);

        return err < 0 ? err : (ssize_t)off;
    }
    return (ssize_t)off;
}

static struct record *one(const char *text, size_t piece, bool head_request, bool close,
                          ssize_t *ret)
{
    struct answer_reader r;
    struct record *rec = NULL;

    CHECK_EQ_INT(answer_reader_init(&r, 1 << 20, 4096, head_request), 0);
    *ret = read_all(&r, text, piece, close);
    if (*ret >= 0 && r.done)
        rec = answer_reader_take(&r);
    answer_reader_done(&r);
    return rec;
}

static void test_answer_reader_length_chunked_and_close(void)
{
#define CHUNKED_ANSWER                                                                             \
    "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"       \
    "2\r\nhe\r\n3;x=1\r\nllo\r\n0\r\nX-Trailer: dropped\r\n\r\n"
    static const char *const answers[] = {
        "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
        CHUNKED_ANSWER,
        "HTTP/1.0 201 Created\r\nContent-Type: text/plain\r\n\r\nhello",
    };

    for (size_t i = 0; i < 3; i++) {
        for (size_t piece = 0; piece < 8; piece += 7) {
            ssize_t got;
            struct record *rec = one(answers[i], piece, false, i == 2, &got);

            CHECK(rec != NULL);
            if (!rec)
                continue;
            CHECK_EQ_INT(rec->status, 201);
            CHECK_EQ_INT(rec->nheaders, 1); /* Content-Length and Transfer-Encoding dropped */
            CHECK_EQ_STR(rec->headers[0].name, "Content-Type");
            CHECK_EQ_STR(rec->headers[0].value, "text/plain");
            CHECK_EQ_INT(rec->body.len, 5);
            CHECK(memcmp(rec->body.data, "hello", 5) == 0);
            CHECK_EQ_INT(got, (ssize_t)strlen(answers[i]));
            record_unref(rec);
        }
    }
}

static void test_answer_reader_stops_at_the_answers_end(void)
{
    const char *two = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"
                      "Content-Length: 4\r\n\r\nnext";
    ssize_t got;
    struct record *rec = one(two, 0, false, false, &got);

    CHECK(rec && rec->body.len == 2);
    CHECK_EQ_INT(got, (ssize_t)(strlen(two) - strlen("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n"
                                                     "\r\nnext")));
    record_unref(rec);
}

static void test_answer_reader_interim_head_and_no_body(void)
{
    ssize_t got;
    struct record *rec = one("HTTP/1.1 100 Continue\r\nX-Early: 1\r\n\r\nHTTP/1.1 200 OK\r\n"
                             "X-Final: 1\r\nContent-Length: 0\r\n\r\n",
                             3, false, false, &got);

    CHECK(rec && rec->status == 200 && rec->nheaders == 1);
    if (rec)
        CHECK_EQ_STR(rec->headers[0].name, "X-Final");
    record_unref(rec);
    /* A HEAD's answer announces a length it does not send. */
    rec = one("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", 0, true, false, &got);
    CHECK(rec && rec->status == 200 && rec->body.len == 0);
    record_unref(rec);
    rec = one("HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n", 0, false, false, &got);
    CHECK(rec && rec->status == 304 && rec->body.len == 0);
    record_unref(rec);
}

static void test_answer_reader_refuses_what_it_cannot_pass_on(void)
{
    static const struct {
        const char *text;
        int err;
    } bad[] = {
        { "HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 0\r\n\r\n", -ECONNRESET },
        { "HTTP/1.1 200 OK\r\nX-A: a\rX-B: b\r\nContent-Length: 0\r\n\r\n", -ECONNRESET },
        { "HTTP/1.1 200 OK\r\nX A: a\r\nContent-Length: 0\r\n\r\n", -ECONNRESET },
        { "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", -ECONNRESET },
        { "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", -ECONNRESET },
        { "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
          -ECONNRESET },
        { "SSH-2.0-OpenSSH_9.2\r\n", -ECONNRESET },
        { "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", -ECONNRESET },
        { "", -ECONNRESET },
    };
    char big[6000];
    ssize_t got;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        for (size_t piece = 0; piece < 2; piece++) {
            struct record *rec = one(bad[i].text, piece, false, true, &got);

            CHECK(rec == NULL);
            CHECK_EQ_INT(got, bad[i].err);
        }
    }
    /* A header block past the limit: it answered, too large to pass on. */
    snprintf(big, sizeof(big), "HTTP/1.1 200 OK\r\nX-Big: %04500d\r\nContent-Length: 0\r\n\r\n", 7);
    CHECK(one(big, 0, false, false, &got) == NULL);
    CHECK_EQ_INT(got, -E2BIG);
    CHECK(one(big, 100, false, false, &got) == NULL);
    CHECK_EQ_INT(got, -E2BIG);
}

TEST_MAIN(test_answer_reader_length_chunked_and_close, test_answer_reader_stops_at_the_answers_end,
          test_answer_reader_interim_head_and_no_body,
          test_answer_reader_refuses_what_it_cannot_pass_on)
