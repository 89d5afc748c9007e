/* SPDX-License-Identifier: MIT */
#include <stdlib.h>

#include "idemproxy/record.h"

#include "idemproxy/http.h"

#define RECORD_MAGIC "IDR1"
#define RECORD_MAGIC_LEN 4
#define RECORD_FLAG_TOO_LARGE 0x01u
#define RECORD_FLAGS_KNOWN RECORD_FLAG_TOO_LARGE

struct record *record_new(size_t max_body)
{
    struct record *rec = calloc(1, sizeof(*rec));

    if (!rec)
        return NULL;
    atomic_init(&rec->refs, 1);
    rec->body = BUF_INIT(max_body);
    return rec;
}

struct record *record_ref(struct record *rec)
{
    if (rec)
        atomic_fetch_add_explicit(&rec->refs, 1, memory_order_relaxed);
    return rec;
}

static void header_free(struct record_header *h)
{
    free(h->name);
    free(h->value);
}

void record_unref(struct record *rec)
{
    if (!rec || atomic_fetch_sub_explicit(&rec->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (size_t i = 0; i < rec->nheaders; i++)
        header_free(&rec->headers[i]);
    free(rec->headers);
    buf_done(&rec->body);
    free(rec);
}

size_t record_mem_bytes(const struct record *rec)
{
    size_t n = sizeof(*rec) + RECORD_MALLOC_OVERHEAD;

    if (rec->headers)
        n += rec->headers_cap * sizeof(*rec->headers) + RECORD_MALLOC_OVERHEAD;
    for (size_t i = 0; i < rec->nheaders; i++)
        n += strlen(rec->headers[i].name) + strlen(rec->headers[i].value) + 2 +
             2 * RECORD_MALLOC_OVERHEAD;
    if (rec->body.data)
        n += rec->body.cap + RECORD_MALLOC_OVERHEAD;
    return n;
}

static char *dup_span(struct span s)
{
    char *p = malloc(s.len + 1);

    if (!p)
        return NULL;
    if (s.len)
        memcpy(p, s.base, s.len);
    p[s.len] = '\0';
    return p;
}

int record_add_header(struct record *rec, struct span name, struct span value)
{
    struct record_header h;

    if (rec->nheaders >= RECORD_MAX_HEADERS)
        return -E2BIG;
    if (rec->nheaders == rec->headers_cap) {
        size_t cap = rec->headers_cap ? rec->headers_cap * 2 : 8;
        struct record_header *hs;

        if (cap > RECORD_MAX_HEADERS)
            cap = RECORD_MAX_HEADERS;
        hs = realloc(rec->headers, cap * sizeof(*hs));
        if (!hs)
            return -ENOMEM;
        rec->headers = hs;
        rec->headers_cap = cap;
    }
    h.name = dup_span(name);
    h.value = dup_span(value);
    if (!h.name || !h.value) {
        header_free(&h);
        return -ENOMEM;
    }
    rec->headers[rec->nheaders++] = h;
    return 0;
}

const char *record_header_get(const struct record *rec, const char *name)
{
    struct span n = span_from_cstr(name);

    for (size_t i = 0; i < rec->nheaders; i++) {
        if (span_eq_nocase(span_from_cstr(rec->headers[i].name), n))
            return rec->headers[i].value;
    }
    return NULL;
}

static const struct span hop_by_hop[] = {
    SPAN_LIT("Connection"),
    SPAN_LIT("Keep-Alive"),
    SPAN_LIT("Proxy-Connection"),
    SPAN_LIT("Transfer-Encoding"),
    SPAN_LIT("TE"),
    SPAN_LIT("Trailer"),
    SPAN_LIT("Upgrade"),
    SPAN_LIT("Proxy-Authenticate"),
    SPAN_LIT("Proxy-Authorization"),
    SPAN_LIT("Content-Length"),
};

bool record_is_hop_by_hop(struct span name)
{
    for (size_t i = 0; i < ARRAY_SIZE(hop_by_hop); i++) {
        if (span_eq_nocase(hop_by_hop[i], name))
            return true;
    }
    return false;
}

static bool is_ows(char c) { return c == ' ' || c == '\t'; }

int record_parse_header_line(struct span line, struct span *ret_name, struct span *ret_value)
{
    const char *colon = line.len ? memchr(line.base, ':', line.len) : NULL;
    struct span name, value;

    if (!colon || colon == line.base)
        return -EINVAL; /* includes obs-fold, which starts with OWS */
    name = (struct span){ .base = line.base, .len = (size_t)(colon - line.base) };
    if (!http_is_token(name))
        return -EINVAL;
    value = (struct span){ .base = colon + 1, .len = line.len - name.len - 1 };
    while (value.len > 0 && is_ows(value.base[0])) {
        value.base++;
        value.len--;
    }
    while (value.len > 0 && is_ows(value.base[value.len - 1]))
        value.len--;
    if (!http_is_field_value(value))
        return -EINVAL; /* a stray CR or NUL would split or cut the replayed header */
    *ret_name = name;
    *ret_value = value;
    return 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

int record_parse_status_line(struct span line, unsigned *ret_status)
{
    const char *p = line.base;
    size_t at, n = line.len;
    unsigned code;

    if (n < 5 || memcmp(p, "HTTP/", 5) != 0)
        return -EINVAL;
    if (n >= 8 && is_digit(p[5]) && p[6] == '.' && is_digit(p[7]))
        at = 8; /* HTTP/1.1 */
    else if (n >= 6 && (p[5] == '2' || p[5] == '3'))
        at = 6; /* HTTP/2, as curl writes it */
    else
        return -EINVAL;
    if (n < at + 4 || p[at] != ' ' || !is_digit(p[at + 1]) || !is_digit(p[at + 2]) ||
        !is_digit(p[at + 3]))
        return -EINVAL;
    if (n > at + 4 && p[at + 4] != ' ')
        return -EINVAL; /* a fourth digit, or anything glued to the code */
    code = (unsigned)(p[at + 1] - '0') * 100 + (unsigned)(p[at + 2] - '0') * 10 +
           (unsigned)(p[at + 3] - '0');
    if (code < 100)
        return -EINVAL;
    *ret_status = code;
    return 0;
}

bool record_is_connection_listed(const char *connection, struct span name)
{
    const char *p = connection;

    if (!connection)
        return false;
    while (*p) {
        const char *end = strchr(p, ',');
        struct span tok;

        if (!end)
            end = p + strlen(p);
        tok = (struct span){ .base = p, .len = (size_t)(end - p) };
        while (tok.len && is_ows(tok.base[0])) {
            tok.base++;
            tok.len--;
        }
        while (tok.len && is_ows(tok.base[tok.len - 1]))
            tok.len--;
        if (tok.len && span_eq_nocase(tok, name))
            return true;
        p = *end ? end + 1 : end;
    }
    return false;
}

static bool listed_in_any_connection(const struct record *rec, struct span name)
{
    static const struct span conn = SPAN_LIT("Connection");

    for (size_t i = 0; i < rec->nheaders; i++) {
        if (span_eq_nocase(span_from_cstr(rec->headers[i].name), conn) &&
            record_is_connection_listed(rec->headers[i].value, name))
            return true;
    }
    return false;
}

void record_filter_hop_by_hop(struct record *rec)
{
    bool drop[RECORD_MAX_HEADERS] = { false };
    size_t n = rec->nheaders, kept = 0;

    /* Decide everything first: the Connection headers go too. */
    for (size_t i = 0; i < n; i++) {
        struct span name = span_from_cstr(rec->headers[i].name);

        drop[i] = record_is_hop_by_hop(name) || listed_in_any_connection(rec, name);
    }
    for (size_t i = 0; i < n; i++) {
        if (drop[i])
            header_free(&rec->headers[i]);
        else
            rec->headers[kept++] = rec->headers[i];
    }
    rec->nheaders = kept;
}

static int put_u8(struct buf *b, uint8_t v) { return buf_append(b, &v, 1); }

static int put_u16(struct buf *b, uint16_t v)
{
    uint8_t p[2] = { (uint8_t)(v >> 8), (uint8_t)v };

    return buf_append(b, p, sizeof(p));
}

static int put_u32(struct buf *b, uint32_t v)
{
    uint8_t p[4] = { (uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v };

    return buf_append(b, p, sizeof(p));
}

static int put_str(struct buf *b, const char *s)
{
    size_t len = strlen(s);
    int r;

    if (len > UINT32_MAX)
        return -E2BIG;
    r = put_u32(b, (uint32_t)len);
    if (r < 0)
        return r;
    return buf_append(b, s, len);
}

/* Layout, all integers big-endian: "IDR1", u16 status, u8 flags (bit 0:
 * too_large), u32 nheaders, then per header u32 name_len, name, u32
 * value_len, value. The body is stored apart. */
int record_encode_head(const struct record *rec, struct buf *ret)
{
    size_t start = ret->len;
    int r;

    if (rec->status > UINT16_MAX || rec->nheaders > RECORD_MAX_HEADERS)
        return -E2BIG;
    r = buf_append(ret, RECORD_MAGIC, RECORD_MAGIC_LEN);
    if (r < 0)
        goto fail;
    r = put_u16(ret, (uint16_t)rec->status);
    if (r < 0)
        goto fail;
    r = put_u8(ret, rec->too_large ? RECORD_FLAG_TOO_LARGE : 0);
    if (r < 0)
        goto fail;
    r = put_u32(ret, (uint32_t)rec->nheaders);
    if (r < 0)
        goto fail;
    for (size_t i = 0; i < rec->nheaders; i++) {
        r = put_str(ret, rec->headers[i].name);
        if (r < 0)
            goto fail;
        r = put_str(ret, rec->headers[i].value);
        if (r < 0)
            goto fail;
    }
    return 0;

fail:
    ret->len = start; /* nothing half-appended */
    return r;
}

/* A bounds-checked reader over untrusted bytes (they come from Redis). */
struct reader {
    const uint8_t *p;
    size_t left;
};

static bool get_bytes(struct reader *rd, size_t n, const uint8_t **ret)
{
    if (n > rd->left)
        return false;
    *ret = rd->p;
    rd->p += n;
    rd->left -= n;
    return true;
}

static bool get_u32(struct reader *rd, uint32_t *ret)
{
    const uint8_t *p;

    if (!get_bytes(rd, 4, &p))
        return false;
    *ret = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    return true;
}

/* A length-prefixed string with no NUL inside. */
static bool get_str(struct reader *rd, struct span *ret)
{
    const uint8_t *p;
    uint32_t len;

    if (!get_u32(rd, &len) || !get_bytes(rd, len, &p) || memchr(p, '\0', len))
        return false;
    *ret = (struct span){ .base = (const char *)p, .len = len };
    return true;
}

int record_decode(struct span head, struct span body, struct record **ret)
{
    struct reader rd = { .p = (const uint8_t *)head.base, .left = head.base ? head.len : 0 };
    const uint8_t *p;
    struct record *rec;
    unsigned status;
    uint8_t flags;
    uint32_t n;
    int r;

    if (!get_bytes(&rd, RECORD_MAGIC_LEN + 3, &p) || memcmp(p, RECORD_MAGIC, RECORD_MAGIC_LEN))
        return -EPROTO;
    status = (unsigned)p[4] << 8 | p[5];
    flags = p[6];
    if (flags & ~RECORD_FLAGS_KNOWN)
        return -EPROTO;
    if (!(flags & RECORD_FLAG_TOO_LARGE) && (status < 100 || status > 599))
        return -EPROTO;
    if (!get_u32(&rd, &n) || n > RECORD_MAX_HEADERS)
        return -EPROTO;
    /* Each header takes at least 8 bytes: refuse a count the data cannot hold. */
    if (n > rd.left / 8)
        return -EPROTO;

    rec = record_new(body.len);
    if (!rec)
        return -ENOMEM;
    rec->status = status;
    rec->too_large = flags & RECORD_FLAG_TOO_LARGE;
    for (uint32_t i = 0; i < n; i++) {
        struct span name, value;

        if (!get_str(&rd, &name) || !get_str(&rd, &value)) {
            r = -EPROTO;
            goto fail;
        }
        r = record_add_header(rec, name, value);
        if (r < 0)
            goto fail;
    }
    if (rd.left != 0) {
        r = -EPROTO; /* trailing garbage */
        goto fail;
    }
    r = buf_append(&rec->body, body.base, body.len);
    if (r < 0)
        goto fail;
    *ret = rec;
    return 0;

fail:
    record_unref(rec);
    return r;
}
