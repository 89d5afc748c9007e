/* SPDX-License-Identifier: MIT */
/* Types and helpers every module uses: borrowed byte views, monotonic time. */
#ifndef IDEMPROXY_COMMON_H
#define IDEMPROXY_COMMON_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* A borrowed view of bytes: never freed, valid as long as its owner says. */
struct span {
    const char *base;
    size_t len;
};

#define SPAN_LIT(s) ((struct span){ .base = (s), .len = sizeof(s) - 1 })
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

static inline struct span span_from_cstr(const char *s)
{
    return (struct span){ .base = s, .len = s ? strlen(s) : 0 };
}

/* True when <a> and <b> hold the same bytes. */
static inline bool span_eq(struct span a, struct span b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.base, b.base, a.len) == 0);
}

/* True when <a> and <b> hold the same bytes, ASCII case ignored (header names). */
static inline bool span_eq_nocase(struct span a, struct span b)
{
    if (a.len != b.len)
        return false;
    for (size_t i = 0; i < a.len; i++) {
        unsigned char x = (unsigned char)a.base[i], y = (unsigned char)b.base[i];

        if (x >= 'A' && x <= 'Z')
            x = (unsigned char)(x + 32);
        if (y >= 'A' && y <= 'Z')
            y = (unsigned char)(y + 32);
        if (x != y)
            return false;
    }
    return true;
}

/* Writes the <n> bytes of <p> as 2 * <n> lowercase hex characters and a NUL
 * into <out>: the one hex encoder (fingerprints, scopes, tokens). */
static inline void hex_encode(const uint8_t *p, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 0xf];
    }
    out[2 * n] = '\0';
}

/* Monotonic milliseconds: every duration in idemproxy is measured with this. */
static inline uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif
