/* SPDX-License-Identifier: MIT */
/* The request id (doc/guarantees.md, Threat model): client bytes that go
 * upstream (a curl header line), back to the client (an MHD response header)
 * and into the log. Input: the values of the request's X-Request-Id fields,
 * one a line. Properties: the id is always 1 to 200 bytes of 0x21-0x7E
 * (nothing that could end a header line or split a log field), the client's
 * is kept exactly when there is one field and it is such bytes, and a made
 * one is 32 hex digits. */
#include "fuzz.h"
#include "idemproxy/request.h"

#define MAX_FIELDS 8

static bool is_id_byte(unsigned char c) { return c >= 0x21 && c <= 0x7e; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct span parts[MAX_FIELDS];
    size_t n = fuzz_split((struct span){ (const char *)data, size }, '\n', parts, MAX_FIELDS);
    struct request *rq = request_new("/");
    char id[REQUEST_ID_MAX + 1];
    bool kept, sane = n == 1 && parts[0].len >= 1 && parts[0].len <= REQUEST_ID_MAX;
    size_t len;

    FUZZ_CHECK(rq != NULL);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(request_add_header(rq, SPAN_LIT("X-Request-Id"), parts[i]) == 0);
    for (size_t i = 0; sane && i < parts[0].len; i++)
        sane = is_id_byte((unsigned char)parts[0].base[i]);
    memset(id, 0x55, sizeof(id));
    kept = request_id_pick(rq, SPAN_LIT("x-request-id"), id);
    len = strnlen(id, sizeof(id));
    FUZZ_CHECK(len >= 1 && len <= REQUEST_ID_MAX);
    for (size_t i = 0; i < len; i++)
        FUZZ_CHECK(is_id_byte((unsigned char)id[i]));
    FUZZ_CHECK(kept == sane);
    FUZZ_CHECK(request_id_is_valid((struct span){ id, len }));
    if (kept) {
        FUZZ_CHECK(len == parts[0].len && memcmp(id, parts[0].base, len) == 0);
    } else {
        FUZZ_CHECK(len == 32);
        for (size_t i = 0; i < len; i++)
            FUZZ_CHECK(strchr("0123456789abcdef", id[i]) != NULL);
    }
    request_free(rq);
    return 0;
}
