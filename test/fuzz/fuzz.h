/* SPDX-License-Identifier: MIT */
/* Shared by the libFuzzer targets: the entry point's prototype, a check that
 * aborts (libFuzzer keeps the input that did it), and input splitting. */
#ifndef IDEMPROXY_FUZZ_H
#define IDEMPROXY_FUZZ_H

#include <stdio.h>
#include <stdlib.h>

#include "idemproxy/common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond);          \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Splits <in> at each <sep> into at most <max> parts (the last one keeps the
 * rest, separators included). Returns the number of parts, at least 1. */
static inline size_t fuzz_split(struct span in, char sep, struct span *parts, size_t max)
{
    size_t n = 0;

    while (n + 1 < max) {
        const char *p = in.len ? memchr(in.base, sep, in.len) : NULL;

        if (!p)
            break;
        parts[n++] = (struct span){ .base = in.base, .len = (size_t)(p - in.base) };
        in.len -= (size_t)(p - in.base) + 1;
        in.base = p + 1;
    }
    parts[n++] = in;
    return n;
}

/* A NUL-terminated heap copy of <s> (NULs inside cut it short); aborts on OOM. */
static inline char *fuzz_strdup(struct span s)
{
    char *p = malloc(s.len + 1);

    FUZZ_CHECK(p != NULL);
    if (s.len)
        memcpy(p, s.base, s.len);
    p[s.len] = '\0';
    return p;
}

#endif
