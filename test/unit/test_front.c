/* SPDX-License-Identifier: MIT */
/* front_head_hidden: bytes that libmicrohttpd's in-place parse of a header
 * section hides behind a NUL are found. The parse is modelled here as
 * libmicrohttpd 0.9.75 does it (each line end becomes NULs, the request line's
 * separators and each colon become a NUL, every part is then read as a C
 * string); test_trust_boundary.py sends the same bytes to the real one. */
#include "check.h"
#include "idemproxy/front.h"
#include "idemproxy/http.h"

#define MAX_FIELDS 16

struct parsed {
    char buf[1024];
    struct span head, method, uri, version;
    struct http_header h[MAX_FIELDS];
    size_t n;
};

/* Parses the raw header section <raw> (<len> bytes, ending with its blank
 * line) in place as libmicrohttpd does. */
static void mhd_parse(struct parsed *p, const char *raw, size_t len)
{
    char *b = p->buf, *line, *end, *sp;
    size_t at = 0;

    CHECK(len < sizeof(p->buf));
    memcpy(b, raw, len);
    p->n = 0;
    for (bool first = true;; first = false) {
        size_t line_len;

        line = b + at;
        end = memchr(line, '\n', len - at);
        CHECK(end != NULL);
        if (!end)
            return;
        at = (size_t)(end - b) + 1;
        *end = '\0';
        if (end > line && end[-1] == '\r')
            *--end = '\0';
        line_len = (size_t)(end - line);
        if (first) {
            char *uri, *v;

            /* the first space, then the last one: the line's length, not its NULs */
            sp = memchr(line, ' ', line_len);
            *sp = '\0';
            p->method = span_from_cstr(line);
            uri = sp + 1;
            while (*uri == ' ')
                uri++;
            for (v = line + line_len - 1; *v != ' ';)
                v--;
            *v = '\0';
            p->uri = span_from_cstr(uri); /* what the URI callback's strlen sees */
            p->version = span_from_cstr(v + 1);
            continue;
        }
        if (*line == '\0')
            break; /* the blank line */
        sp = strchr(line, ':');
        *sp = '\0';
        p->h[p->n].name = span_from_cstr(line);
        for (sp++; *sp == ' ' || *sp == '\t'; sp++)
            ;
        p->h[p->n].value = span_from_cstr(sp);
        while (p->h[p->n].value.len > 0 && (sp[p->h[p->n].value.len - 1] == ' ' ||
                                            sp[p->h[p->n].value.len - 1] == '\t'))
            p->h[p->n].value.len--; /* as front.c trims it */
        p->n++;
    }
    p->head = (struct span){ .base = b, .len = at };
}

static const char *hidden(const char *raw, size_t len)
{
    struct parsed p;

    mhd_parse(&p, raw, len);
    return front_head_hidden(p.head, p.method, p.uri, p.version, p.h, p.n);
}

#define HIDDEN(lit) hidden(lit, sizeof(lit) - 1)

static void test_front_head_whole(void)
{
    CHECK(HIDDEN("GET / HTTP/1.1\r\nHost: h\r\n\r\n") == NULL);
    CHECK(HIDDEN("GET / HTTP/1.0\r\n\r\n") == NULL);
    CHECK(HIDDEN("GET / HTTP/1.0\n\n") == NULL);
    CHECK(HIDDEN("POST /p?q=1 HTTP/1.1\nHost: h\r\nIdempotency-Key: \"a b\"\n\r\n") == NULL);
    CHECK(HIDDEN("GET   /spaces-before HTTP/1.1\r\nHost:h\r\n\r\n") == NULL);
    CHECK(HIDDEN("GET / HTTP/1.1\r\nX:\r\nY: \t \r\nZ:  v \t\r\n\r\n") == NULL);
    CHECK(HIDDEN("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n") == NULL); /* a bare CR: http.c refuses it */
}

static void test_front_head_nul_found(void)
{
    CHECK(HIDDEN("GET / HTTP/1.1\r\nIdempotency-Key: abc\0zzz\r\n\r\n") != NULL);
    CHECK(HIDDEN("GET / HTTP/1.1\r\nIdempotency-Key: abc\0zzz\r\nHost: h\r\n\r\n") != NULL);
    CHECK(HIDDEN("GET / HTTP/1.1\r\nX: abc \0zzz\r\n\r\n") != NULL);
    CHECK(HIDDEN("GET / HTTP/1.1\r\nX: \0\0\0\r\nHost: h\r\n\r\n") != NULL);
    CHECK(HIDDEN("GET / HTTP/1.1\r\nX: a\0\r\nHost: h\r\n\r\n") != NULL); /* three NULs */
    CHECK(HIDDEN("GET / HTTP/1.1\r\nX: a\0\r\n\r\n") != NULL);            /* five */
    CHECK(HIDDEN("GET /c\0d HTTP/1.1\r\nHost: h\r\n\r\n") != NULL);
    CHECK(HIDDEN("GET /c\0 HTTP/1.1\r\nHost: h\r\n\r\n") != NULL);
    CHECK(HIDDEN("GE\0T / HTTP/1.1\r\nHost: h\r\n\r\n") != NULL);
    CHECK(HIDDEN("GET / HTTP/1.1\0x\r\nHost: h\r\n\r\n") != NULL);
}

static void test_front_head_moved_parts_found(void)
{
    struct parsed p;
    char elsewhere[] = "h";

    mhd_parse(&p, "GET / HTTP/1.1\r\nHost: h\r\nX: 1\r\n\r\n", 33);
    CHECK(front_head_hidden(p.head, p.method, p.uri, p.version, p.h, p.n) == NULL);
    /* a folded line's value is moved out of the section */
    p.h[0].value = span_from_cstr(elsewhere);
    CHECK(front_head_hidden(p.head, p.method, p.uri, p.version, p.h, p.n) != NULL);
    mhd_parse(&p, "GET / HTTP/1.1\r\nHost: h\r\nX: 1\r\n\r\n", 33);
    /* fields out of order, or one missing */
    CHECK(front_head_hidden(p.head, p.method, p.uri, p.version, p.h + 1, 1) != NULL);
    CHECK(front_head_hidden(p.head, p.method, p.uri, p.version, p.h, 1) != NULL);
    /* a section of another length: one that ends before the blank line, or
     * holds a byte past it */
    p.head.len -= 3;
    CHECK(front_head_hidden(p.head, p.method, p.uri, p.version, p.h, p.n) != NULL);
    p.head.len += 4;
    p.buf[p.head.len - 1] = 'x';
    CHECK(front_head_hidden(p.head, p.method, p.uri, p.version, p.h, p.n) != NULL);
    p.head.len--;
    CHECK(front_head_hidden(p.head, p.method, p.uri, p.version, p.h, p.n) == NULL);
    /* no size from the HTTP layer */
    p.head.len = 0;
    CHECK(front_head_hidden(p.head, p.method, p.uri, p.version, p.h, p.n) != NULL);
}

TEST_MAIN(test_front_head_whole, test_front_head_nul_found, test_front_head_moved_parts_found)
