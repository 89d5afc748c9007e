/* SPDX-License-Identifier: MIT */
/* Measures what encryption at rest costs an answer: seal_record() (what a
 * completion adds) and seal_open() (what a replay adds) of an answer with
 * five headers and a body of 256 B, 1 KiB, 16 KiB and 1 MiB, under one key
 * of a key file, as the proxy does them. Not a test: Performance's figures
 * come from it.
 *   build/test/measure_seal [seconds per size=1] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "idemproxy/record.h"
#include "idemproxy/seal.h"

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct record *answer(size_t body)
{
    static const char *const h[][2] = { { "Content-Type", "application/json" },
                                        { "Date", "Thu, 26 Nov 2026 20:00:00 GMT" },
                                        { "Location", "/v1/payments/pay_1234567890" },
                                        { "Set-Cookie", "session=abcdef0123456789; Path=/" },
                                        { "X-Request-Id", "0123456789abcdef0123456789abcdef" } };
    struct record *rec = record_new(body);

    if (!rec)
        exit(1);
    rec->status = 201;
    for (size_t i = 0; i < ARRAY_SIZE(h); i++)
        (void)record_add_header(rec, span_from_cstr(h[i][0]), span_from_cstr(h[i][1]));
    if (buf_reserve(&rec->body, body) < 0)
        exit(1);
    memset(rec->body.data, 'x', body);
    rec->body.len = body;
    return rec;
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = { 256, 1024, 16384, 1 << 20 };
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    struct seal_keys *k = NULL;
    char why[256], id[SEAL_ID_MAX + 1];
    const struct span store_key = SPAN_LIT("idem:0123456789abcdef0123456789abcdef:order-7f3a");

    if (seal_keys_parse(SPAN_LIT("k:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n"), &k, why,
                        sizeof(why)) < 0) {
        fprintf(stderr, "measure_seal: %s\n", why);
        return 1;
    }
    printf("body bytes | seal µs | open µs | sealed bytes\n");
    for (size_t s = 0; s < ARRAY_SIZE(sizes); s++) {
        struct record *rec = answer(sizes[s]), *sealed = NULL, *out = NULL;
        enum seal_failure f;
        long n = 0, m = 0;
        double t0 = now_s(), seal_us, open_us;
        size_t sealed_len = 0;

        while (now_s() - t0 < secs) {
            if (seal_record(k, store_key, rec, &sealed) < 0)
                return 1;
            sealed_len = sealed->body.len;
            record_unref(sealed);
            n++;
        }
        seal_us = (now_s() - t0) * 1e6 / (double)n;
        if (seal_record(k, store_key, rec, &sealed) < 0)
            return 1;
        t0 = now_s();
        while (now_s() - t0 < secs) {
            if (seal_open(k, store_key, sealed, &out, &f, id) < 0)
                return 1;
            record_unref(out);
            m++;
        }
        open_us = (now_s() - t0) * 1e6 / (double)m;
        printf("%zu | %.2f | %.2f | %zu\n", sizes[s], seal_us, open_us, sealed_len);
        record_unref(sealed);
        record_unref(rec);
    }
    seal_keys_free(k);
    return 0;
}
