/* SPDX-License-Identifier: MIT */
/* A growable byte buffer with a hard limit: every buffer that input can grow is one. */
#ifndef IDEMPROXY_BUF_H
#define IDEMPROXY_BUF_H

#include "idemproxy/common.h"

struct buf {
    char *data; /* owned; NULL while empty */
    size_t len, cap;
    size_t limit; /* appends past this fail with -E2BIG */
};

#define BUF_INIT(lim) ((struct buf){ .limit = (lim) })

/* Appends <n> bytes at <p>. Returns 0, -E2BIG if the result would exceed
 * <b>->limit (nothing is appended), or -ENOMEM. */
int buf_append(struct buf *b, const void *p, size_t n);

/* Makes room for <n> more bytes in one allocation (capped at <b>->limit), so
 * that a body of known length is not reallocated while it grows. Returns 0 or
 * -ENOMEM; a request past the limit reserves up to the limit. */
int buf_reserve(struct buf *b, size_t n);

/* Frees the data of <b> and leaves it empty with its limit. NULL-safe. */
void buf_done(struct buf *b);

/* A view of the bytes of <b>, valid until the next append or buf_done(). */
static inline struct span buf_span(const struct buf *b)
{
    return (struct span){ .base = b->data, .len = b->len };
}

#endif
