/* SPDX-License-Identifier: MIT */
/* Measures what a route's `fingerprint: {body: json}` costs a keyed request:
 * canonjson_write() of a payment-like JSON body (members out of order,
 * spaces, a decimal amount, nested metadata) grown to about 256 B, 1 KiB,
 * 16 KiB and 1 MiB by repeating its line items, beside the SHA-256 of the
 * same bytes that every keyed request pays anyway. Not a test: Performance's
 * figures come from it.
 *   build/test/measure_canon [seconds per size=1] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idemproxy/buf.h"
#include "idemproxy/canonjson.h"
#include "idemproxy/fingerprint.h"

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A body of about <size> bytes into <out>. */
static void body_of(size_t size, struct buf *out)
{
    static const char head[] = "{ \"currency\": \"eur\", \"amount\": 1099.50, \"customer\": "
                               "\"cus_9s6XKzkNRiz8i3\", \"metadata\": {\"order\": \"7f3a\", "
                               "\"sent_at\": \"2026-11-27T10:00:00Z\"}, \"items\": [";
    static const char item[] = "{\"sku\": \"sku_0123\", \"qty\": 2, \"price\": 19.99, "
                               "\"name\": \"Caf\\u00e9 cr\\u00e8me\"}";
    size_t n = 0;

    (void)buf_append(out, head, sizeof(head) - 1);
    while (out->len + sizeof(item) + 3 < size || n == 0) {
        if (n++)
            (void)buf_append(out, ", ", 2);
        (void)buf_append(out, item, sizeof(item) - 1);
    }
    (void)buf_append(out, "]}", 2);
}

int main(int argc, char **argv)
{
    static const size_t sizes[] = { 256, 1024, 16384, 1 << 20 };
    static const char *const ignore[] = { "/metadata/sent_at" };
    double secs = argc > 1 ? atof(argv[1]) : 1.0;

    printf("body bytes | canonical µs | SHA-256 µs | canonical bytes\n");
    for (size_t s = 0; s < ARRAY_SIZE(sizes); s++) {
        struct buf body = BUF_INIT(SIZE_MAX), canon = BUF_INIT(SIZE_MAX);
        uint8_t digest[FINGERPRINT_LEN];
        double t0, t_canon, t_hash;
        unsigned long n = 0, m = 0;

        body_of(sizes[s], &body);
        t0 = now_s();
        do {
            canon.len = 0;
            if (canonjson_write(buf_span(&body), ignore, ARRAY_SIZE(ignore), CANONJSON_DEPTH_MAX,
                                &canon) < 0) {
                fprintf(stderr, "measure_canon: the body does not canonicalize\n");
                return 1;
            }
            n++;
        } while (now_s() - t0 < secs);
        t_canon = (now_s() - t0) / (double)n;
        t0 = now_s();
        do {
            struct fingerprint fp = { 0 };

            if (fingerprint_init(&fp, SPAN_LIT("POST"), SPAN_LIT("/v1/payments")) < 0 ||
                fingerprint_update(&fp, body.data, body.len) < 0 ||
                fingerprint_final(&fp, digest) < 0)
                return 1;
            m++;
        } while (now_s() - t0 < secs);
        t_hash = (now_s() - t0) / (double)m;
        printf("%zu | %.2f | %.2f | %zu\n", body.len, t_canon * 1e6, t_hash * 1e6, canon.len);
        buf_done(&body);
        buf_done(&canon);
    }
    return 0;
}
