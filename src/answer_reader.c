/* SPDX-License-Identifier: MIT */
/* The framing of an upstream's answer is libhttp-parser's: this module
 * gives it the bytes, keeps what its callbacks report, and checks each
 * header field as the proxy passes it on (a token name, a value without
 * control bytes, the block within its limit). */
#include "idemproxy/answer_reader.h"

#include <stdlib.h>
#include <string.h>

#include "idemproxy/http.h"
#include "idemproxy/record.h"

#define MALFORMED "the upstream's answer is malformed"

static struct answer_reader *of(http_parser *p) { return p->data; }

/* Ends the answer with <err> for <cause>: the parser stops at once. */
static int fail(struct answer_reader *r, int err, const char *cause)
{
    if (!r->err) {
        r->err = err;
        r->cause = cause;
    }
    return -1;
}

/* The header block cannot be passed on (too large, a field the proxy does
 * not pass): said once the parser has read the whole block, so that its
 * own verdict on the bytes (malformed) comes first, however they were cut
 * into reads. Nothing more is kept meanwhile. */
static int fail_head(struct answer_reader *r, int err, const char *cause)
{
    if (!r->head_err) {
        r->head_err = err;
        r->head_cause = cause;
    }
    return 0;
}

#define TOO_LARGE "the upstream's answer has a header block larger than the proxy passes on"

/* <s> without the spaces and tabs around it. */
static struct span trim(struct span s)
{
    while (s.len > 0 && (s.base[0] == ' ' || s.base[0] == '\t')) {
        s.base++;
        s.len--;
    }
    while (s.len > 0 && (s.base[s.len - 1] == ' ' || s.base[s.len - 1] == '\t'))
        s.len--;
    return s;
}

/* The header field read last is whole: checked, and kept in the record. */
static int end_field(struct answer_reader *r)
{
    struct span name = r->name, value = r->value;
    size_t size = r->field_len + 4; /* as it came: the same whatever the reads */
    bool over = r->spill_over;
    int err;

    if (!r->pending)
        return 0;
    if (r->spilled) {
        name = (struct span){ .base = r->spill.data, .len = r->name_len };
        value =
            (struct span){ .base = r->spill.data + r->name_len, .len = r->spill.len - r->name_len };
    }
    r->pending = r->spilled = r->spill_over = r->in_value = false;
    r->spill.len = r->name_len = r->field_len = 0;
    r->name = r->value = (struct span){ 0 };
    if (r->head_err)
        return 0;
    r->head_bytes += size;
    if (r->head_bytes > r->max_head || over)
        return fail_head(r, -E2BIG, TOO_LARGE);
    if (!http_is_token(name))
        return fail_head(r, -ECONNRESET, MALFORMED); /* a value without a name */
    err = record_add_header(r->rec, name, trim(value));
    if (err == -E2BIG)
        return fail_head(r, err,
                         "the upstream's answer has more header fields than the proxy keeps");
    return err < 0 ? fail(r, err, NULL) : 0;
}

static int spill(struct answer_reader *r);

/* Appends a piece of the field being read, of its name or its value: to
 * <spill> once it is there, else as a view while the pieces are
 * contiguous (one feed's bytes). */
static int add_piece(struct answer_reader *r, bool name, const char *p, size_t n)
{
    struct span *in_place = name ? &r->name : &r->value, piece = { .base = p, .len = n };

    r->pending = true;
    r->field_len += n;
    if (r->head_err || n == 0) /* a read that ended at the piece's end gives an empty one */
        return 0;
    /* Checked byte by byte as they come, before any limit is: the verdict
     * is the same however the bytes were cut into reads. */
    if (name ? !http_is_token(piece) : !http_is_field_value(piece))
        return fail_head(r, -ECONNRESET, MALFORMED);
    if (r->spill_over)
        return 0;
    if (!r->spilled && in_place->len > 0) {
        if (p == in_place->base + in_place->len) {
            in_place->len += n;
            return 0;
        }
        spill(r);
        if (r->spill_over)
            return 0;
    }
    if (r->spilled) {
        if (buf_append(&r->spill, p, n) < 0)
            r->spill_over = true; /* past the limit: said at the field's end */
        else if (name)
            r->name_len += n;
        return 0;
    }
    *in_place = piece;
    return 0;
}

static int on_field(http_parser *p, const char *at, size_t n)
{
    struct answer_reader *r = of(p);

    if (r->head_done)
        return 0; /* a trailer: dropped */
    if (r->in_value && end_field(r) < 0)
        return -1;
    return add_piece(r, true, at, n);
}

static int on_value(http_parser *p, const char *at, size_t n)
{
    struct answer_reader *r = of(p);

    if (r->head_done)
        return 0;
    r->in_value = true;
    return add_piece(r, false, at, n);
}

static int on_headers_complete(http_parser *p)
{
    struct answer_reader *r = of(p);
    unsigned status = p->status_code;

    if (end_field(r) < 0)
        return -1;
    if (r->head_err)
        return fail(r, r->head_err, r->head_cause);
    if (status < 100 || status == 101)
        return fail(r, -ECONNRESET, MALFORMED); /* no upgrade was asked for */
    if (status < 200) {
        /* An interim answer: its fields are not the final one's. */
        struct record *fresh = record_new(r->max_body);

        if (!fresh)
            return fail(r, -ENOMEM, NULL);
        record_unref(r->rec);
        r->rec = fresh;
        r->head_bytes = 0;
        return 1; /* no body */
    }
    r->head_done = true;
    r->status = status;
    r->length = (p->flags & F_CONTENTLENGTH) ? p->content_length : UINT64_MAX;
    if (r->head_request || status == 204 || status == 304)
        r->length = r->head_request ? UINT64_MAX : 0;
    /* A body of announced length kept whole gets its buffer at once. */
    if (!r->head_request && (p->flags & F_CONTENTLENGTH) && p->content_length > 0 &&
        buf_reserve(&r->rec->body,
                    p->content_length > r->max_body ? r->max_body : (size_t)p->content_length) < 0)
        return fail(r, -ENOMEM, NULL);
    return r->head_request ? 1 : 0;
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    struct answer_reader *r = of(p);
    int err;

    if (r->sink) {
        err = r->sink(r->sink_ctx, at, n);
        return err < 0 ? fail(r, err, NULL) : 0;
    }
    err = buf_append(&r->rec->body, at, n);
    if (err < 0)
        return fail(r, err,
                    err == -E2BIG ? "the upstream's answer is larger than the proxy holds" : NULL);
    return 0;
}

static int on_message_complete(http_parser *p)
{
    struct answer_reader *r = of(p);

    if (!r->head_done)
        return 0; /* an interim answer ended: the final one follows */
    r->done = true;
    http_parser_pause(p, 1); /* what follows is not this answer's */
    return 0;
}

static const http_parser_settings settings = {
    .on_header_field = on_field,
    .on_header_value = on_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

int answer_reader_init(struct answer_reader *r, size_t max_body, size_t max_head, bool head_request)
{
    *r = (struct answer_reader){
        .max_body = max_body,
        .max_head = max_head,
        .head_request = head_request,
        .spill = BUF_INIT(max_head + 2),
        .length = UINT64_MAX,
    };
    http_parser_init(&r->parser, HTTP_RESPONSE);
    r->parser.data = r;
    r->rec = record_new(max_body);
    return r->rec ? 0 : -ENOMEM;
}

void answer_reader_set_sink(struct answer_reader *r, answer_body_fn *fn, void *ctx)
{
    r->sink = fn;
    r->sink_ctx = ctx;
}

/* A feed ends inside a header field (or a piece of it is apart): its
 * pieces so far are copied, since the bytes they view go away. */
static int spill(struct answer_reader *r)
{
    if (!r->pending || r->spilled || r->spill_over || r->head_err)
        return 0;
    r->spill.len = 0;
    if (buf_append(&r->spill, r->name.base, r->name.len) < 0 ||
        buf_append(&r->spill, r->value.base, r->value.len) < 0) {
        r->spill_over = true; /* past the limit: said at the field's end */
        return 0;
    }
    r->name_len = r->name.len;
    r->spilled = true;
    return 0;
}

/* Gives the parser the <n> bytes at <p>. Returns how many it took (fewer
 * once the answer is done), or a negative errno. */
static ssize_t parse(struct answer_reader *r, const char *p, size_t n)
{
    size_t used = http_parser_execute(&r->parser, &settings, p, n);
    enum http_errno e = HTTP_PARSER_ERRNO(&r->parser);

    if (r->err)
        return r->err;
    if (e == HPE_PAUSED && r->done)
        return (ssize_t)used;
    if (e != HPE_OK || used != n || r->parser.upgrade)
        return fail(r, -ECONNRESET, MALFORMED), r->err;
    return (ssize_t)n;
}

/* How many of the <n> bytes at <p> belong to the head being read: up to
 * and with the empty line that ends it, or all. A CR not followed by LF
 * makes the head malformed (-1): libhttp-parser would take it for a line's
 * end in one read and not in another (RFC 9112 says to refuse it); so does
 * a line folded onto the one before (obs-fold), which it would join. */
static ssize_t head_part(struct answer_reader *r, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = p[i];

        if (r->scan_cr && c != '\n')
            return -1;
        if (r->scan_line == 0 && !r->scan_cr && (c == ' ' || c == '\t'))
            return -1; /* an obs-fold: refused, as RFC 9112 lets a proxy */
        r->scan_cr = c == '\r';
        if (c == '\n') {
            bool empty = r->scan_line == 0;

            r->scan_line = 0;
            if (empty)
                return (ssize_t)(i + 1);
        } else if (c != '\r') {
            r->scan_line++;
        }
    }
    return (ssize_t)n;
}

ssize_t answer_reader_feed(struct answer_reader *r, const char *p, size_t n)
{
    size_t off = 0;
    ssize_t part, used;

    if (r->err)
        return r->err;
    if (n == 0 || r->done)
        return 0;
    r->started = true;
    /* A head (the final one, or an interim 1xx one) at a time, checked. */
    while (off < n && !r->head_done) {
        part = head_part(r, p + off, n - off);
        if (part < 0)
            return fail(r, -ECONNRESET, MALFORMED), r->err;
        used = parse(r, p + off, (size_t)part);
        if (used < 0 || r->done)
            return used < 0 ? used : (ssize_t)(off + (size_t)used);
        off += (size_t)part;
    }
    if (off < n) {
        used = parse(r, p + off, n - off);
        if (used < 0 || r->done)
            return used < 0 ? used : (ssize_t)(off + (size_t)used);
    }
    if (spill(r) < 0)
        return r->err;
    return (ssize_t)n;
}

int answer_reader_close(struct answer_reader *r)
{
    if (r->done)
        return 0;
    if (r->err)
        return r->err;
    if (r->started && r->head_done) {
        /* A body delimited by the close ends here; any other is cut. */
        (void)http_parser_execute(&r->parser, &settings, NULL, 0);
        if (r->done)
            return 0;
    }
    r->err = -ECONNRESET;
    r->cause = !r->started ? "the upstream closed the connection without an answer"
                           : "the upstream closed the connection before the whole answer";
    return r->err;
}

bool answer_reader_keeps_alive(const struct answer_reader *r)
{
    return r->done && !r->err && http_should_keep_alive(&r->parser);
}

struct record *answer_reader_take(struct answer_reader *r)
{
    struct record *rec = r->rec;

    r->rec = NULL;
    if (rec) {
        rec->status = r->status;
        record_filter_hop_by_hop(rec);
    }
    return rec;
}

void answer_reader_done(struct answer_reader *r)
{
    if (!r)
        return;
    record_unref(r->rec);
    r->rec = NULL;
    buf_done(&r->spill);
}
