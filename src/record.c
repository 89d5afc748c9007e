/* SPDX-License-Identifier: MIT */
/* Stored answers and their binary codec (record.h). */
#include "idemproxy/record.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "idemproxy/http.h"

#define RECORD_MAGIC "IDR1"
#define RECORD_MAGIC_LEN 4
#define RECORD_FLAG_TOO_LARGE 0x01u
#define RECORD_FLAG_SEALED 0x02u
#define RECORD_FLAGS_KNOWN (RECORD_FLAG_TOO_LARGE | RECORD_FLAG_SEALED)

struct record *record_new(size_t max_body)
{
    struct record *rec = calloc(1, sizeof(*rec));

    if (!rec)
        return NULL;
    atomic_init(&rec->refs, 1);
    rec->body = BUF_INIT(max_body);
    return rec;
}

struct record *record_new_too_large(unsigned status)
{
    struct record *marker = record_new(0);

    if (marker) {
        marker->too_large = true;
        marker->status = status;
    }
    return marker;
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

static bool listed_in_any_connection(const struct record *rec, struct span name)
{
    static const struct span conn = SPAN_LIT("Connection");

    for (size_t i = 0; i < rec->nheaders; i++) {
        if (span_eq_nocase(span_from_cstr(rec->headers[i].name), conn) &&
            http_is_connection_listed(rec->headers[i].value, name))
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

        drop[i] = http_is_hop_by_hop(name) || listed_in_any_connection(rec, name);
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
 * too_large, bit 1: sealed), u32 nheaders, then per header u32 name_len, name, u32
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
    r = put_u8(ret, (rec->too_large ? RECORD_FLAG_TOO_LARGE : 0) |
                        (rec->sealed ? RECORD_FLAG_SEALED : 0));
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
    if (!(flags & (RECORD_FLAG_TOO_LARGE | RECORD_FLAG_SEALED)) && (status < 100 || status > 599))
        return -EPROTO;
    if (!get_u32(&rd, &n) || n > RECORD_MAX_HEADERS)
        return -EPROTO;
    /* A sealed record holds nothing in clear but its sealed body. */
    if ((flags & RECORD_FLAG_SEALED) && (flags != RECORD_FLAG_SEALED || status != 0 || n != 0))
        return -EPROTO;
    /* Each header takes at least 8 bytes: refuse a count the data cannot hold. */
    if (n > rd.left / 8)
        return -EPROTO;

    rec = record_new(body.len);
    if (!rec)
        return -ENOMEM;
    rec->status = status;
    rec->too_large = flags & RECORD_FLAG_TOO_LARGE;
    rec->sealed = flags & RECORD_FLAG_SEALED;
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

void record_ensure_date(struct record *rec)
{
    char date[64];
    struct tm tm;
    time_t t = time(NULL);

    if (record_header_get(rec, "Date"))
        return;
    gmtime_r(&t, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    (void)record_add_header(rec, SPAN_LIT("Date"), span_from_cstr(date));
}

static bool is_ows(char c) { return c == ' ' || c == '\t'; }

enum record_storage record_storage_parse(struct span v, uint64_t *ret_ttl_ms)
{
    static const struct span no_store = SPAN_LIT("no-store"), ttl = SPAN_LIT("ttl=");
    uint64_t ms = 0;

    while (v.len && is_ows(v.base[0]))
        v.base++, v.len--;
    while (v.len && is_ows(v.base[v.len - 1]))
        v.len--;
    if (span_eq_nocase(v, no_store))
        return RECORD_STORAGE_NO_STORE;
    if (v.len <= ttl.len || !span_eq_nocase((struct span){ v.base, ttl.len }, ttl))
        return RECORD_STORAGE_INVALID;
    for (size_t i = ttl.len; i < v.len; i++) {
        unsigned d = (unsigned)(unsigned char)v.base[i] - '0';

        if (d > 9)
            return RECORD_STORAGE_INVALID;
        ms = ms > (UINT64_MAX - d * 1000) / 10 ? UINT64_MAX : ms * 10 + d * 1000;
    }
    if (ms == 0)
        return RECORD_STORAGE_INVALID;
    *ret_ttl_ms = ms;
    return RECORD_STORAGE_TTL;
}

enum record_storage record_take_storage(struct record *rec, const char *name, uint64_t *ret_ttl_ms,
                                        char *ret_value, size_t len)
{
    struct span n = span_from_cstr(name);
    enum record_storage s = RECORD_STORAGE_DEFAULT;
    size_t kept = 0;

    ret_value[0] = '\0';
    for (size_t i = 0; i < rec->nheaders; i++) {
        struct record_header *h = &rec->headers[i];

        if (!span_eq_nocase(span_from_cstr(h->name), n)) {
            rec->headers[kept++] = *h;
            continue;
        }
        if (s == RECORD_STORAGE_DEFAULT) {
            snprintf(ret_value, len, "%s", h->value);
            s = record_storage_parse(span_from_cstr(h->value), ret_ttl_ms);
        } else {
            s = RECORD_STORAGE_INVALID; /* two answers to one question */
        }
        header_free(h);
    }
    rec->nheaders = kept;
    return s;
}
