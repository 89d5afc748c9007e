/* SPDX-License-Identifier: MIT */
/* PostgreSQL URLs as an operator writes them (pg_url_check, pg_url_hosts,
 * pg_url_redact: libpq's parser, then ours over its answer), and client
 * bytes made into text for PostgreSQL (pg_text_escape: what an unknown key
 * keeps of a target). */
#include <stdlib.h>

#include "fuzz.h"
#include "idemproxy/pg_url.h"

static int unhex(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The escaped text is printable ASCII only, and reads back as the input's
 * prefix: each byte as itself, or (outside 0x20-0x7E) as %XX. */
static void check_escape(const uint8_t *data, size_t size, size_t cap)
{
    char *out = malloc(cap);
    size_t len, i = 0, j = 0;

    if (!out)
        return;
    len = pg_text_escape((const char *)data, size, out, cap);
    FUZZ_CHECK(len < cap && out[len] == '\0');
    for (; j < len; i++) {
        uint8_t c = data[i];

        FUZZ_CHECK(i < size);
        if (c >= 0x20 && c < 0x7f) {
            FUZZ_CHECK(out[j] == (char)c);
            j++;
        } else {
            FUZZ_CHECK(j + 2 < len + 1 && out[j] == '%');
            FUZZ_CHECK(unhex(out[j + 1]) == c >> 4 && unhex(out[j + 2]) == (c & 15));
            j += 3;
        }
    }
    FUZZ_CHECK(j == len);
    for (size_t k = 0; k < len; k++)
        FUZZ_CHECK(out[k] >= 0x20 && out[k] < 0x7f);
    /* Room for everything: nothing left out. */
    FUZZ_CHECK(cap < 3 * size + 1 || i == size);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *url = malloc(size + 1), red[512], why[256];
    struct pg_url_hosts h;

    if (!url)
        return 0;
    memcpy(url, data, size);
    url[size] = '\0';
    if (pg_url_check(url, why, sizeof(why)) == 0 && pg_url_hosts(url, &h) == 0) {
        FUZZ_CHECK(h.n >= 1 && h.n <= PG_URL_MAX_HOSTS);
        for (unsigned i = 0; i < h.n; i++)
            FUZZ_CHECK(strlen(h.host[i]) < PG_URL_HOST_MAX && strlen(h.port[i]) < 8);
    }
    for (size_t cap = 1; cap <= sizeof(red); cap += 255) {
        pg_url_redact(url, red, cap);
        FUZZ_CHECK(strlen(red) < cap);
    }
    check_escape(data, size, 3 * size + 1);
    check_escape(data, size, size / 2 + 1);
    free(url);
    return 0;
}
