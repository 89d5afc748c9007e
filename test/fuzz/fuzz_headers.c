/* SPDX-License-Identifier: MIT */
/* Header lines captured from the upstream, as the transfer's header callback
 * sees them: each line parsed (http_parse_status_line, http_parse_field_line), the accepted
 * ones added to a record, then the hop-by-hop filter. Input: a header block, lines split at '\n'
 * with one trailing '\r' dropped. */
#include <stdlib.h>

#include "fuzz.h"
#include "idemproxy/http.h"
#include "idemproxy/record.h"

#define MAX_LINES 512

static bool is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool is_ows(char c) { return c == ' ' || c == '\t'; }

static void check_line(struct span line, int r, struct span name, struct span value)
{
    bool has_ctl = false;

    for (size_t i = 0; i < line.len; i++) {
        unsigned char c = (unsigned char)line.base[i];

        has_ctl = has_ctl || (c < 0x20 && c != '\t') || c == 0x7f;
    }
    if (r < 0) {
        FUZZ_CHECK(r == -EINVAL);
        return;
    }
    /* Accepted: no control byte anywhere, so no obs-fold, CR or NUL gets through. */
    FUZZ_CHECK(!has_ctl && line.len > 0 && !is_ows(line.base[0]));
    FUZZ_CHECK(name.base == line.base && name.len > 0 && name.len < line.len);
    FUZZ_CHECK(line.base[name.len] == ':');
    for (size_t i = 0; i < name.len; i++)
        FUZZ_CHECK(is_tchar((unsigned char)name.base[i]));
    FUZZ_CHECK(value.base >= line.base + name.len + 1 &&
               value.base + value.len <= line.base + line.len);
    FUZZ_CHECK(value.len == 0 || (!is_ows(value.base[0]) && !is_ows(value.base[value.len - 1])));
    /* Only OWS is trimmed around the value. */
    for (const char *p = line.base + name.len + 1; p < value.base; p++)
        FUZZ_CHECK(is_ows(*p));
    for (const char *p = value.base + value.len; p < line.base + line.len; p++)
        FUZZ_CHECK(is_ows(*p));
}

/* The filter keeps, in order, exactly the headers that are neither hop-by-hop
 * nor named in one of the Connection headers the record had before it. */
static void check_filter(struct record *rec)
{
    size_t n = rec->nheaders, nconn = 0, kept = 0;
    char **names = calloc(n + 1, sizeof(*names)), **values = calloc(n + 1, sizeof(*values));
    bool *keep = calloc(n + 1, sizeof(*keep));
    const char *conn[RECORD_MAX_HEADERS];

    FUZZ_CHECK(names && values && keep);
    for (size_t i = 0; i < n; i++) {
        names[i] = fuzz_strdup(span_from_cstr(rec->headers[i].name));
        values[i] = fuzz_strdup(span_from_cstr(rec->headers[i].value));
        if (span_eq_nocase(span_from_cstr(names[i]), SPAN_LIT("Connection")))
            conn[nconn++] = values[i];
    }
    for (size_t i = 0; i < n; i++) {
        struct span name = span_from_cstr(names[i]);

        keep[i] = !http_is_hop_by_hop(name);
        for (size_t j = 0; j < nconn && keep[i]; j++)
            keep[i] = !http_is_connection_listed(conn[j], name);
    }
    record_filter_hop_by_hop(rec);
    for (size_t i = 0; i < n; i++) {
        if (!keep[i])
            continue;
        FUZZ_CHECK(kept < rec->nheaders);
        FUZZ_CHECK(strcmp(rec->headers[kept].name, names[i]) == 0);
        FUZZ_CHECK(strcmp(rec->headers[kept].value, values[i]) == 0);
        kept++;
    }
    FUZZ_CHECK(kept == rec->nheaders);
    for (size_t i = 0; i < rec->nheaders; i++) {
        struct span name = span_from_cstr(rec->headers[i].name);

        FUZZ_CHECK(!http_is_hop_by_hop(name));
        FUZZ_CHECK(!span_eq_nocase(name, SPAN_LIT("Content-Length")));
    }
    for (size_t i = 0; i < n; i++) {
        free(names[i]);
        free(values[i]);
    }
    free(names);
    free(values);
    free(keep);
}

/* What is kept is stored: it must come back from the store unchanged. */
static void check_round_trip(const struct record *rec)
{
    struct buf head = BUF_INIT(1 << 24);
    struct record *out = NULL;

    FUZZ_CHECK(record_encode_head(rec, &head) == 0);
    FUZZ_CHECK(record_decode(buf_span(&head), buf_span(&rec->body), &out) == 0);
    FUZZ_CHECK(out->status == rec->status && out->nheaders == rec->nheaders);
    for (size_t i = 0; i < rec->nheaders; i++) {
        FUZZ_CHECK(strcmp(out->headers[i].name, rec->headers[i].name) == 0);
        FUZZ_CHECK(strcmp(out->headers[i].value, rec->headers[i].value) == 0);
    }
    record_unref(out);
    buf_done(&head);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct span lines[MAX_LINES];
    struct span in = { .base = (const char *)data, .len = size };
    size_t n = fuzz_split(in, '\n', lines, ARRAY_SIZE(lines));
    struct record *rec = record_new(1 << 20);

    FUZZ_CHECK(rec != NULL);
    rec->status = 200;
    for (size_t i = 0; i < n; i++) {
        struct span line = lines[i], name = { .base = NULL }, value = { .base = NULL };
        int r;

        if (line.len > 0 && line.base[line.len - 1] == '\r')
            line.len--;
        if (line.len >= 5 && memcmp(line.base, "HTTP/", 5) == 0) {
            unsigned status = 0;

            /* a status line: accepted only as version, SP, a code of 100-999 */
            if (http_parse_status_line(line, &status) == 0)
                FUZZ_CHECK(status >= 100 && status <= 999 && line.len >= 10 &&
                           memchr(line.base, ' ', line.len) != NULL);
            continue;
        }
        if (line.len == 0)
            continue; /* the end of a block */
        r = http_parse_field_line(line, &name, &value);
        check_line(line, r, name, value);
        if (r < 0)
            continue; /* the transfer fails there; the rest still gets parsed here */
        r = record_add_header(rec, name, value);
        FUZZ_CHECK(r == 0 || (r == -E2BIG && rec->nheaders == RECORD_MAX_HEADERS));
        if (r < 0)
            break;
    }
    check_filter(rec);
    check_round_trip(rec);
    (void)record_mem_bytes(rec);
    record_unref(rec);
    return 0;
}
