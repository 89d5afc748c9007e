/* SPDX-License-Identifier: MIT */
/* One answer read off an HTTP/1.1 connection to the upstream, as its bytes
 * come in any chunking: framed by libhttp-parser (Content-Length, chunked,
 * or up to the close; interim 1xx answers skipped; no body for HEAD, 204
 * and 304), its status and header fields checked and kept in a record, its
 * body kept there too or handed to a sink as it comes. It stops at the
 * answer's last byte: what follows on the connection is never taken for
 * this answer (the caller does not reuse a connection that sent more).
 * Pure, one thread. */
#ifndef IDEMPROXY_ANSWER_READER_H
#define IDEMPROXY_ANSWER_READER_H

#include <sys/types.h>

#include <http_parser.h>

#include "idemproxy/buf.h"
#include "idemproxy/common.h"

struct record;

/* Takes <n> > 0 bytes of the body. Returns 0, or a negative errno that ends
 * the answer with it (the sink sets the reader's <cause> when it knows why). */
typedef int answer_body_fn(void *ctx, const char *p, size_t n);

/* Embedded; answer_reader_init() before use, answer_reader_done() after.
 * The fields are the module's, read-only for the caller. */
struct answer_reader {
    http_parser parser;
    struct record *rec; /* owned: status, header fields, and the body while no sink takes it */
    size_t max_body;    /* a body kept in <rec> fails past this with -E2BIG */
    size_t max_head;    /* ... and a header block (names, values, ": " and CRLF) past this */
    bool head_request;  /* the request was a HEAD: no body follows */
    /* The header field being read. In place (views into the bytes of the
     * current answer_reader_feed()) until a feed ends inside it; then
     * copied into <spill>, name first (<name_len> bytes) then value. */
    struct span name, value;
    bool in_value, spilled, pending;
    bool spill_over;  /* the field outgrew <spill>: too large, its bytes dropped */
    size_t field_len; /* its bytes so far, name and value, as they came */
    struct buf spill;
    size_t name_len;
    size_t head_bytes;      /* of the header block, as the client will get it */
    int head_err;           /* why the block cannot be passed on, said at its end, or 0 */
    const char *head_cause; /* ... in words */
    size_t scan_line;       /* bytes of the head's current line so far (not CR or LF) */
    bool scan_cr;           /* the last byte of the head was a CR */
    bool started;           /* a byte of the answer came */
    bool head_done;         /* the final (not 1xx) answer's head is in <rec> */
    bool done;              /* ... and its whole body */
    unsigned status;        /* of the final answer, once head_done */
    uint64_t length;        /* its announced body length, or UINT64_MAX */
    int err;                /* why reading failed, or 0 */
    const char *cause;      /* ... in words, static */
    answer_body_fn *sink;   /* NULL: the body goes into <rec> */
    void *sink_ctx;
};

/* Makes <r> ready for one answer to a request (a HEAD when <head_request>)
 * whose body may be kept up to <max_body> bytes, its header block up to
 * <max_head>. Returns 0 or -ENOMEM. */
int answer_reader_init(struct answer_reader *r, size_t max_body, size_t max_head,
                       bool head_request);

/* From now on body bytes go to <fn>(<ctx>) instead of the record. */
void answer_reader_set_sink(struct answer_reader *r, answer_body_fn *fn, void *ctx);

/* Reads the <n> bytes at <p>, which came next on the connection. Returns
 * how many belong to this answer: <n>, or fewer once it is done (<done>: the
 * rest came after its last byte). Returns a negative errno when the answer
 * cannot be read, with <cause> set: -ECONNRESET (malformed), -E2BIG (its
 * header block past <max_head> or more fields than a record keeps,
 * or a kept body past <max_body>: it answered), -ENOMEM, or a sink's. Not
 * to be called again after an error or once done. */
ssize_t answer_reader_feed(struct answer_reader *r, const char *p, size_t n);

/* The connection was closed by the upstream. Returns 0 when that ends the
 * answer (a body delimited by the close: <done> is set), else -ECONNRESET
 * with <cause> set (nothing came, or not the whole answer). */
int answer_reader_close(struct answer_reader *r);

/* Whether the connection may carry another exchange after this answer,
 * as far as the answer says (done, and no Connection: close or HTTP/1.0
 * without keep-alive). */
bool answer_reader_keeps_alive(const struct answer_reader *r);

/* Hands over the record: status set, hop-by-hop fields dropped. NULL on
 * a second call. */
struct record *answer_reader_take(struct answer_reader *r);

/* Frees what <r> owns. NULL-safe, idempotent. */
void answer_reader_done(struct answer_reader *r);

#endif
