/* SPDX-License-Identifier: MIT */
/* The storage header (doc/configuration.md, The API steers storage): bytes
 * an upstream sends, that decide whether and how long an answer is kept.
 * Input: the values of its fields, one a line, among other headers.
 * Properties: the parse agrees with a plain reading of the rule (no-store;
 * ttl= and digits, not zero, in seconds, saturating), more than one field is
 * ignored, the header never stays in the answer and the others keep their
 * order. */
#include <ctype.h>
#include <strings.h>

#include "fuzz.h"
#include "idemproxy/record.h"

#define MAX_FIELDS 8

/* The rule, read plainly: <v> with spaces and tabs trimmed, case-insensitive. */
static enum record_storage expected(struct span v, uint64_t *ms)
{
    char low[64];
    size_t a = 0, b = v.len;
    unsigned __int128 sum = 0;

    while (a < b && (v.base[a] == ' ' || v.base[a] == '\t'))
        a++;
    while (b > a && (v.base[b - 1] == ' ' || v.base[b - 1] == '\t'))
        b--;
    for (size_t i = a; i < b && i - a < 4; i++)
        low[i - a] = (char)tolower((unsigned char)v.base[i]);
    if (b - a == 8 && !strncasecmp(v.base + a, "no-store", 8))
        return RECORD_STORAGE_NO_STORE;
    if (b - a <= 4 || memcmp(low, "ttl=", 4))
        return RECORD_STORAGE_INVALID;
    for (size_t i = a + 4; i < b; i++) {
        if (!isdigit((unsigned char)v.base[i]))
            return RECORD_STORAGE_INVALID;
        sum = sum * 10 + (unsigned)(v.base[i] - '0');
        if (sum > UINT64_MAX)
            sum = (unsigned __int128)UINT64_MAX + 1; /* stays past it */
    }
    if (sum == 0)
        return RECORD_STORAGE_INVALID;
    *ms = sum * 1000 > UINT64_MAX ? UINT64_MAX : (uint64_t)(sum * 1000);
    return RECORD_STORAGE_TTL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct span parts[MAX_FIELDS];
    size_t n = fuzz_split((struct span){ (const char *)data, size }, '\n', parts, MAX_FIELDS);
    struct record *rec = record_new(0);
    uint64_t ms = 0, want_ms = 0;
    enum record_storage got, want = RECORD_STORAGE_DEFAULT;
    char value[80];

    FUZZ_CHECK(rec != NULL);
    for (size_t i = 0; i < n; i++) {
        char *v = fuzz_strdup(parts[i]); /* a stored value holds no NUL */

        FUZZ_CHECK(record_add_header(rec, SPAN_LIT("X-Before"), SPAN_LIT("1")) == 0);
        FUZZ_CHECK(record_add_header(rec, SPAN_LIT("idempotency-STORAGE"), span_from_cstr(v)) == 0);
        if (i == 0) {
            want = expected(span_from_cstr(v), &want_ms);
            got = record_storage_parse(span_from_cstr(v), &ms);
            FUZZ_CHECK(got == want);
            FUZZ_CHECK(got != RECORD_STORAGE_TTL || ms == want_ms);
        }
        free(v);
    }
    FUZZ_CHECK(record_add_header(rec, SPAN_LIT("X-After"), SPAN_LIT("2")) == 0);
    ms = 0;
    got = record_take_storage(rec, "Idempotency-Storage", &ms, value, sizeof(value));
    FUZZ_CHECK(got == (n > 1 ? RECORD_STORAGE_INVALID : want));
    FUZZ_CHECK(got != RECORD_STORAGE_TTL || ms == want_ms);
    FUZZ_CHECK(strlen(value) < sizeof(value));
    FUZZ_CHECK(rec->nheaders == n + 1 && record_header_get(rec, "Idempotency-Storage") == NULL);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(!strcmp(rec->headers[i].name, "X-Before"));
    FUZZ_CHECK(!strcmp(rec->headers[n].name, "X-After"));
    record_unref(rec);
    return 0;
}
