/* SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "idemproxy/http.h"
#include "idemproxy/record.h"

#define S(s) span_from_cstr(s)

static struct record *make(unsigned status, const char *const *hdrs, size_t nhdrs, const void *body,
                           size_t body_len)
{
    struct record *rec = record_new(1 << 20);

    CHECK(rec != NULL);
    if (!rec)
        return NULL;
    rec->status = status;
    for (size_t i = 0; i + 1 < nhdrs; i += 2)
        CHECK_EQ_INT(record_add_header(rec, S(hdrs[i]), S(hdrs[i + 1])), 0);
    CHECK_EQ_INT(buf_append(&rec->body, body, body_len), 0);
    return rec;
}

/* Encodes <rec>, decodes it back, and checks that everything survived. */
static void check_round_trip(const struct record *rec)
{
    struct buf head = BUF_INIT(1 << 20);
    struct record *out = NULL;

    CHECK_EQ_INT(record_encode_head(rec, &head), 0);
    CHECK_EQ_INT(record_decode(buf_span(&head), buf_span(&rec->body), &out), 0);
    CHECK(out != NULL);
    if (out) {
        CHECK_EQ_INT(out->status, rec->status);
        CHECK_EQ_INT(out->too_large, rec->too_large);
        CHECK_EQ_INT(out->nheaders, rec->nheaders);
        for (size_t i = 0; i < rec->nheaders && i < out->nheaders; i++) {
            CHECK_EQ_STR(out->headers[i].name, rec->headers[i].name);
            CHECK_EQ_STR(out->headers[i].value, rec->headers[i].value);
        }
        CHECK_EQ_INT(out->body.len, rec->body.len);
        if (out->body.len == rec->body.len && rec->body.len)
            CHECK_EQ_MEM(out->body.data, rec->body.data, rec->body.len);
        CHECK_EQ_INT(out->body.limit, rec->body.len);
        CHECK_EQ_INT(atomic_load(&out->refs), 1);
    }
    record_unref(out);
    buf_done(&head);
}

static void test_record_new_is_empty(void)
{
    struct record *rec = record_new(10);

    CHECK(rec != NULL);
    CHECK_EQ_INT(rec->status, 0);
    CHECK_EQ_INT(rec->nheaders, 0);
    CHECK_EQ_INT(rec->too_large, 0);
    CHECK_EQ_INT(rec->body.len, 0);
    CHECK_EQ_INT(rec->body.limit, 10);
    CHECK_EQ_INT(atomic_load(&rec->refs), 1);
    CHECK_EQ_INT(buf_append(&rec->body, "0123456789x", 11), -E2BIG); /* max_body holds */
    record_unref(rec);
}

static void test_record_refcount(void)
{
    struct record *rec = record_new(0);

    CHECK(record_ref(rec) == rec);
    CHECK(record_ref(rec) == rec);
    CHECK_EQ_INT(atomic_load(&rec->refs), 3);
    record_unref(rec);
    record_unref(rec);
    CHECK_EQ_INT(atomic_load(&rec->refs), 1);
    CHECK_EQ_INT(record_add_header(rec, S("A"), S("b")), 0);
    record_unref(rec); /* frees: ASan reports a leak or a double free otherwise */
    CHECK(record_ref(NULL) == NULL);
    record_unref(NULL);
}

static void test_record_add_header_copies(void)
{
    struct record *rec = record_new(0);
    char name[] = "X-Thing", value[] = "v1";

    CHECK_EQ_INT(record_add_header(rec, S(name), S(value)), 0);
    name[0] = 'Z'; /* the record holds its own copies */
    value[0] = 'Z';
    CHECK_EQ_STR(rec->headers[0].name, "X-Thing");
    CHECK_EQ_STR(rec->headers[0].value, "v1");
    /* Spans are not NUL-terminated: only <len> bytes are copied. */
    CHECK_EQ_INT(record_add_header(rec, (struct span){ "Set-Cookie: junk", 10 },
                                   (struct span){ "a=1; more", 3 }),
                 0);
    CHECK_EQ_STR(rec->headers[1].name, "Set-Cookie");
    CHECK_EQ_STR(rec->headers[1].value, "a=1");
    CHECK_EQ_INT(record_add_header(rec, S("Empty"), (struct span){ NULL, 0 }), 0);
    CHECK_EQ_STR(rec->headers[2].value, "");
    CHECK_EQ_INT(rec->nheaders, 3);
    record_unref(rec);
}

static void test_record_add_header_caps(void)
{
    struct record *rec = record_new(0);
    char name[32];
    int failed = 0;

    rec->status = 200;
    for (int i = 0; i < RECORD_MAX_HEADERS; i++) {
        snprintf(name, sizeof(name), "H%d", i);
        failed += record_add_header(rec, S(name), S("v")) != 0;
    }
    CHECK_EQ_INT(failed, 0);
    CHECK_EQ_INT(rec->nheaders, RECORD_MAX_HEADERS);
    CHECK_EQ_INT(record_add_header(rec, S("One-Too-Many"), S("v")), -E2BIG);
    CHECK_EQ_INT(rec->nheaders, RECORD_MAX_HEADERS);
    CHECK_EQ_STR(rec->headers[RECORD_MAX_HEADERS - 1].name, "H255");
    check_round_trip(rec); /* the maximum also decodes */
    record_unref(rec);
}

static void test_record_header_get(void)
{
    static const char *const h[] = { "Set-Cookie", "a=1",        "Content-Type",
                                     "text/plain", "set-cookie", "b=2" };
    struct record *rec = make(200, h, ARRAY_SIZE(h), "", 0);

    CHECK_EQ_STR(record_header_get(rec, "content-type"), "text/plain");
    CHECK_EQ_STR(record_header_get(rec, "SET-COOKIE"), "a=1"); /* the first one */
    CHECK(record_header_get(rec, "Content") == NULL);
    CHECK(record_header_get(rec, "Date") == NULL);
    record_unref(rec);
}

static void test_record_hop_by_hop_table(void)
{
    static const char *const hop[] = {
        "Connection", "keep-alive", "PROXY-CONNECTION",   "Transfer-Encoding",   "te",
        "Trailer",    "Upgrade",    "Proxy-Authenticate", "proxy-authorization", "Content-Length"
    };
    static const char *const e2e[] = {
        "Content-Type", "Set-Cookie",  "Date",        "Trailers", "T",
        "TEE",          "Connections", "Content-Len", "Location", ""
    };

    for (size_t i = 0; i < ARRAY_SIZE(hop); i++)
        CHECK(http_is_hop_by_hop(S(hop[i])));
    for (size_t i = 0; i < ARRAY_SIZE(e2e); i++)
        CHECK(!http_is_hop_by_hop(S(e2e[i])));
}

static void test_record_connection_listed(void)
{
    CHECK(http_is_connection_listed("close, X-Private", S("x-private")));
    CHECK(http_is_connection_listed("X-A,X-B", S("X-B")));
    CHECK(http_is_connection_listed(" \tX-A \t, X-B", S("x-a")));
    CHECK(http_is_connection_listed("keep-alive", S("Keep-Alive")));
    CHECK(http_is_connection_listed(",,X-A,", S("X-A")));
    CHECK(!http_is_connection_listed("X-AB", S("X-A")));
    CHECK(!http_is_connection_listed("X-A", S("X-AB")));
    CHECK(!http_is_connection_listed("X-A X-B", S("X-B")));
    CHECK(!http_is_connection_listed("", S("X-A")));
    CHECK(!http_is_connection_listed(", ,", S("")));
    CHECK(!http_is_connection_listed(NULL, S("X-A")));
}

/* One upstream header line: name, ':', value with its OWS trimmed; views
 * into the line. */
static void check_line(const char *line, const char *name, const char *value)
{
    struct span n = { 0 }, v = { 0 };

    CHECK_EQ_INT(http_parse_field_line(S(line), &n, &v), 0);
    CHECK(n.len == strlen(name) && memcmp(n.base, name, n.len) == 0);
    CHECK(v.len == strlen(value) && (!v.len || memcmp(v.base, value, v.len) == 0));
}

static void test_http_parse_field_line(void)
{
    static const char *const malformed[] = {
        "",             /* nothing */
        "No-Colon",     /* no ':' */
        ": value",      /* empty name */
        " Folded: x",   /* obs-fold continuation: starts with whitespace */
        "\tFolded: x",  /* the same with a tab */
        "Bad Name: x",  /* a space in the name */
        "Bad(Name): x", /* a delimiter in the name */
        "X-A: a\rb",    /* a CR inside the value would split the replayed header */
        "X-A: a\x7f",   /* DEL */
        "X-A: \x01",    /* another control byte */
    };
    struct span n = S("kept"), v = S("kept");

    check_line("Content-Type: application/json", "Content-Type", "application/json");
    check_line("X-Empty:", "X-Empty", "");
    check_line("X-Ows: \t padded \t ", "X-Ows", "padded");
    check_line("X-Tab: a\tb", "X-Tab", "a\tb");
    check_line("X-Colons: a:b::c", "X-Colons", "a:b::c");
    check_line("X-8bit: caf\xc3\xa9", "X-8bit", "caf\xc3\xa9");
    check_line("!#$%&'*+-.^_`|~09azAZ: v", "!#$%&'*+-.^_`|~09azAZ", "v");
    for (size_t i = 0; i < ARRAY_SIZE(malformed); i++)
        CHECK_EQ_INT(http_parse_field_line(S(malformed[i]), &n, &v), -EINVAL);
    /* a NUL inside the value, which a C string cannot show */
    CHECK_EQ_INT(http_parse_field_line((struct span){ "X-A: a\0b", 8 }, &n, &v), -EINVAL);
    /* refused lines leave the outputs alone */
    CHECK(n.len == 4 && memcmp(n.base, "kept", 4) == 0);
    CHECK(v.len == 4 && memcmp(v.base, "kept", 4) == 0);
}

static void test_http_parse_status_line(void)
{
    static const char *const bad[] = {
        "HTTP/x.y 200 OK", /* libcurl makes a 200 of these */
        "HTTP/ 200 OK",    "HTTP/banana",      "HTTP/1.1",
        "HTTP/1.1 ",       "HTTP/1.1 20",      "HTTP/1.1 2000",
        "HTTP/1.1 20a OK", "HTTP/1.1  200 OK", "HTTP/1.1 099 Low",
        "HTTP/1.1 200OK",  "HTTP/20 200",      "HTTP/1 200",
        "http/1.1 200 OK", "ICY 200 OK",       "",
    };
    unsigned status = 7;

    CHECK_EQ_INT(http_parse_status_line(S("HTTP/1.1 201 Created"), &status), 0);
    CHECK_EQ_INT(status, 201);
    CHECK_EQ_INT(http_parse_status_line(S("HTTP/1.0 404"), &status), 0);
    CHECK_EQ_INT(status, 404);
    CHECK_EQ_INT(http_parse_status_line(S("HTTP/1.1 100 "), &status), 0);
    CHECK_EQ_INT(status, 100);
    CHECK_EQ_INT(http_parse_status_line(S("HTTP/2 503 "), &status), 0);
    CHECK_EQ_INT(status, 503);
    CHECK_EQ_INT(http_parse_status_line(S("HTTP/1.1 599 any reason \x80"), &status), 0);
    CHECK_EQ_INT(status, 599);
    status = 7;
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
        CHECK_EQ_INT(http_parse_status_line(S(bad[i]), &status), -EINVAL);
    CHECK_EQ_INT(status, 7);
}

static void test_record_filter_hop_by_hop(void)
{
    static const char *const h[] = {
        "Date",
        "Mon, 01 Jan 2024 00:00:00 GMT",
        "Connection",
        "close, X-Secret",
        "Set-Cookie",
        "a=1",
        "Transfer-Encoding",
        "chunked",
        "x-secret",
        "s",
        "Content-Length",
        "12",
        "Set-Cookie",
        "b=2",
        "Keep-Alive",
        "timeout=5",
        "connection",
        "X-Other",
        "X-Other",
        "o",
        "Proxy-Connection",
        "keep-alive",
        "Content-Type",
        "application/json",
        "TE",
        "trailers",
        "Trailer",
        "X",
        "Upgrade",
        "h2c",
        "Proxy-Authenticate",
        "Basic",
        "Proxy-Authorization",
        "Basic x",
        "X-Kept",
        "1",
    };
    struct record *rec = make(201, h, ARRAY_SIZE(h), "body", 4);

    record_filter_hop_by_hop(rec);
    CHECK_EQ_INT(rec->nheaders, 5);
    if (rec->nheaders == 5) {
        CHECK_EQ_STR(rec->headers[0].name, "Date");
        CHECK_EQ_STR(rec->headers[1].name, "Set-Cookie");
        CHECK_EQ_STR(rec->headers[1].value, "a=1");
        CHECK_EQ_STR(rec->headers[2].name, "Set-Cookie");
        CHECK_EQ_STR(rec->headers[2].value, "b=2");
        CHECK_EQ_STR(rec->headers[3].name, "Content-Type");
        CHECK_EQ_STR(rec->headers[4].name, "X-Kept");
    }
    CHECK_EQ_INT(rec->status, 201);
    CHECK_EQ_INT(rec->body.len, 4);
    record_filter_hop_by_hop(rec); /* idempotent */
    CHECK_EQ_INT(rec->nheaders, 5);
    CHECK_EQ_INT(record_add_header(rec, S("X-After"), S("1")), 0); /* still usable */
    CHECK_EQ_STR(rec->headers[5].name, "X-After");
    record_unref(rec);

    struct record *none = record_new(0);

    record_filter_hop_by_hop(none); /* no headers */
    CHECK_EQ_INT(none->nheaders, 0);
    record_unref(none);
}

static void test_record_round_trips(void)
{
    static const char *const h[] = { "Set-Cookie",   "a=1; Path=/",
                                     "Content-Type", "application/json",
                                     "Set-Cookie",   "b=2",
                                     "X-Empty",      "" };
    static const char bin[] = { 0, 1, 2, '\0', (char)0xff, '\r', '\n', 0 };
    struct record *rec;

    rec = make(201, h, ARRAY_SIZE(h), "{\"id\":1}", 8);
    check_round_trip(rec);
    record_unref(rec);

    rec = make(204, NULL, 0, "", 0); /* no headers, empty body */
    check_round_trip(rec);
    record_unref(rec);

    rec = make(200, h, 2, bin, sizeof(bin)); /* binary body with NUL bytes */
    check_round_trip(rec);
    record_unref(rec);

    rec = make(599, NULL, 0, "x", 1);
    check_round_trip(rec);
    record_unref(rec);
    rec = make(100, NULL, 0, "", 0);
    check_round_trip(rec);
    record_unref(rec);

    rec = record_new(0); /* the too-large marker */
    rec->too_large = true;
    rec->status = 200;
    check_round_trip(rec);
    rec->status = 0; /* a marker may carry any status */
    check_round_trip(rec);
    record_unref(rec);
}

static void test_record_encoding_is_exact(void)
{
    static const char *const h[] = { "A", "bc" };
    static const unsigned char want[] = { 'I', 'D', 'R', '1', 0x01, 0xf5, 0x00, 0, 0, 0,   1,
                                          0,   0,   0,   1,   'A',  0,    0,    0, 2, 'b', 'c' };
    struct record *rec = make(501, h, 2, "zz", 2);
    struct buf head = BUF_INIT(1024);

    CHECK_EQ_INT(buf_append(&head, "pre", 3), 0);
    CHECK_EQ_INT(record_encode_head(rec, &head), 0); /* appends */
    CHECK_EQ_INT(head.len, 3 + sizeof(want));
    CHECK_EQ_MEM(head.data, "pre", 3);
    CHECK_EQ_MEM(head.data + 3, want, sizeof(want));
    buf_done(&head);

    rec->too_large = true;
    CHECK_EQ_INT(record_encode_head(rec, &head), 0);
    CHECK_EQ_INT(head.data[6], 1); /* flags bit 0 */
    buf_done(&head);

    /* Too small a buffer: -E2BIG and nothing half-appended. */
    struct buf tiny = BUF_INIT(12);

    CHECK_EQ_INT(buf_append(&tiny, "pre", 3), 0);
    CHECK_EQ_INT(record_encode_head(rec, &tiny), -E2BIG);
    CHECK_EQ_INT(tiny.len, 3);
    buf_done(&tiny);
    record_unref(rec);
}

/* Decodes <head> and checks it is refused with <ret> untouched. */
static void expect_eproto(const void *head, size_t len, int line)
{
    struct record *sentinel = (struct record *)&len, *out = sentinel;
    int r = record_decode((struct span){ head, len }, SPAN_LIT("body"), &out);

    if (r != -EPROTO || out != sentinel)
        fprintf(stderr, "  (expect_eproto called from line %d)\n", line);
    CHECK_EQ_INT(r, -EPROTO);
    CHECK(out == sentinel);
}
#define EXPECT_EPROTO(p, n) expect_eproto((p), (n), __LINE__)

static void test_record_decode_rejects_malformed(void)
{
    static const unsigned char good[] = { 'I', 'D', 'R', '1', 0x00, 0xc8, 0x00, 0, 0, 0,   2,
                                          0,   0,   0,   1,   'A',  0,    0,    0, 2, 'b', 'c',
                                          0,   0,   0,   1,   'D',  0,    0,    0, 0 };
    unsigned char m[sizeof(good) + 8];
    struct record *out = NULL;

    /* The reference block is valid. */
    CHECK_EQ_INT(
        record_decode((struct span){ (const char *)good, sizeof(good) }, SPAN_LIT("b"), &out), 0);
    CHECK(out && out->nheaders == 2 && out->status == 200);
    if (out && out->nheaders == 2) {
        CHECK_EQ_STR(out->headers[0].value, "bc");
        CHECK_EQ_STR(out->headers[1].name, "D");
        CHECK_EQ_STR(out->headers[1].value, "");
    }
    record_unref(out);

    /* Every truncation, including the empty block and NULL. */
    for (size_t n = 0; n < sizeof(good); n++)
        EXPECT_EPROTO(good, n);
    EXPECT_EPROTO(NULL, 0);

    /* Trailing garbage. */
    memcpy(m, good, sizeof(good));
    m[sizeof(good)] = 0;
    EXPECT_EPROTO(m, sizeof(good) + 1);

    /* Bad magic. */
    memcpy(m, good, sizeof(good));
    m[3] = '2';
    EXPECT_EPROTO(m, sizeof(good));

    /* Status outside 100-599. */
    memcpy(m, good, sizeof(good));
    m[4] = 0, m[5] = 99;
    EXPECT_EPROTO(m, sizeof(good));
    m[4] = 0x02, m[5] = 0x58; /* 600 */
    EXPECT_EPROTO(m, sizeof(good));
    m[4] = 0, m[5] = 0;
    EXPECT_EPROTO(m, sizeof(good));
    m[6] = 1; /* ...but the too-large marker may carry it */
    CHECK_EQ_INT(record_decode((struct span){ (const char *)m, sizeof(good) }, SPAN_LIT(""), &out),
                 0);
    CHECK(out && out->too_large && out->status == 0);
    record_unref(out);

    /* Unknown flags. */
    memcpy(m, good, sizeof(good));
    m[6] = 0x02;
    EXPECT_EPROTO(m, sizeof(good));

    /* nheaders too big for the data, or over RECORD_MAX_HEADERS. */
    memcpy(m, good, sizeof(good));
    m[10] = 3;
    EXPECT_EPROTO(m, sizeof(good));
    m[10] = 1; /* too few: the rest is trailing garbage */
    EXPECT_EPROTO(m, sizeof(good));
    m[7] = 0xff, m[8] = 0xff, m[9] = 0xff, m[10] = 0xff;
    EXPECT_EPROTO(m, sizeof(good));
    m[7] = 0, m[8] = 0, m[9] = 0x01, m[10] = 0x01; /* 257 */
    EXPECT_EPROTO(m, sizeof(good));

    /* Lengths that run past the end (including ones that would wrap). */
    memcpy(m, good, sizeof(good));
    m[14] = 30;
    EXPECT_EPROTO(m, sizeof(good));
    m[11] = 0xff, m[12] = 0xff, m[13] = 0xff, m[14] = 0xff;
    EXPECT_EPROTO(m, sizeof(good));
    memcpy(m, good, sizeof(good));
    m[19] = 12; /* value length of the first header */
    EXPECT_EPROTO(m, sizeof(good));
    memcpy(m, good, sizeof(good));
    m[sizeof(good) - 1] = 1; /* last value length 1 with no byte left */
    EXPECT_EPROTO(m, sizeof(good));

    /* NUL bytes inside a name or a value. */
    memcpy(m, good, sizeof(good));
    m[15] = 0;
    EXPECT_EPROTO(m, sizeof(good));
    memcpy(m, good, sizeof(good));
    m[21] = 0;
    EXPECT_EPROTO(m, sizeof(good));
}

static void test_record_decode_header_count_limit(void)
{
    /* RECORD_MAX_HEADERS + 1 empty headers: well-formed apart from the count. */
    size_t n = RECORD_MAX_HEADERS + 1, len = 11 + 8 * n;
    unsigned char *m = calloc(1, len);
    struct record *out = NULL;

    memcpy(m, "IDR1\x00\xc8\x00", 7);
    m[9] = (unsigned char)(n >> 8), m[10] = (unsigned char)n;
    EXPECT_EPROTO(m, len);
    /* Exactly the maximum decodes. */
    n = RECORD_MAX_HEADERS, len = 11 + 8 * n;
    m[9] = (unsigned char)(n >> 8), m[10] = (unsigned char)n;
    CHECK_EQ_INT(record_decode((struct span){ (const char *)m, len }, SPAN_LIT(""), &out), 0);
    CHECK(out && out->nheaders == RECORD_MAX_HEADERS);
    record_unref(out);
    free(m);
}

/* Every single-byte corruption of a valid block decodes cleanly or is refused
 * with -EPROTO, and never reads out of bounds (ASan watches). */
static void test_record_decode_survives_corruption(void)
{
    static const char *const h[] = { "Set-Cookie", "a=1", "X", "", "Content-Type", "text/html" };
    static const unsigned char vals[] = { 0x00, 0x01, 0x7f, 0x80, 0xff };
    struct record *rec = make(200, h, ARRAY_SIZE(h), "body", 4);
    struct buf head = BUF_INIT(4096);
    int bad = 0;

    CHECK_EQ_INT(record_encode_head(rec, &head), 0);
    for (size_t i = 0; i < head.len; i++) {
        for (size_t v = 0; v < ARRAY_SIZE(vals); v++) {
            char *copy = malloc(head.len); /* exact size: ASan catches any overread */
            struct record *out = NULL;
            int r;

            memcpy(copy, head.data, head.len);
            copy[i] = (char)vals[v];
            r = record_decode((struct span){ copy, head.len }, SPAN_LIT(""), &out);
            bad += r != 0 && r != -EPROTO;
            bad += (r == 0) != (out != NULL);
            record_unref(out);
            free(copy);
        }
    }
    CHECK_EQ_INT(bad, 0);
    buf_done(&head);

    rec->status = 70000; /* does not fit the u16 field */
    CHECK_EQ_INT(record_encode_head(rec, &head), -E2BIG);
    CHECK_EQ_INT(head.len, 0);
    buf_done(&head);
    record_unref(rec);
}

static void test_record_mem_bytes_counts_every_allocation(void)
{
    struct record *rec = record_new(4096);
    size_t empty, with_header, with_body;

    if (!rec)
        abort();
    empty = record_mem_bytes(rec);
    CHECK_EQ_INT(empty, sizeof(*rec) + RECORD_MALLOC_OVERHEAD);
    CHECK_EQ_INT(record_add_header(rec, SPAN_LIT("Content-Type"), SPAN_LIT("text/plain")), 0);
    with_header = record_mem_bytes(rec);
    /* The header array (its capacity), then name and value with their NULs. */
    CHECK_EQ_INT(with_header, empty + rec->headers_cap * sizeof(*rec->headers) +
                                  RECORD_MALLOC_OVERHEAD + 12 + 10 + 2 +
                                  2 * RECORD_MALLOC_OVERHEAD);
    CHECK_EQ_INT(buf_append(&rec->body, "hello", 5), 0);
    with_body = record_mem_bytes(rec);
    /* The body's capacity, not its length: spare room costs memory too. */
    CHECK(rec->body.cap >= 5);
    CHECK_EQ_INT(with_body, with_header + rec->body.cap + RECORD_MALLOC_OVERHEAD);
    record_unref(rec);
}

TEST_MAIN(test_record_mem_bytes_counts_every_allocation, test_record_new_is_empty,
          test_record_refcount, test_record_add_header_copies, test_record_add_header_caps,
          test_record_header_get, test_record_hop_by_hop_table, test_record_connection_listed,
          test_http_parse_field_line, test_http_parse_status_line,
          test_record_filter_hop_by_hop, test_record_round_trips, test_record_encoding_is_exact,
          test_record_decode_rejects_malformed, test_record_decode_header_count_limit,
          test_record_decode_survives_corruption)
