/* SPDX-License-Identifier: MIT */
/* The capped byte buffer (buf.h). */
#include "idemproxy/buf.h"

#include <stdlib.h>
#include <string.h>

#define BUF_FIRST_CAP 256

int buf_append(struct buf *b, const void *p, size_t n)
{
    if (n == 0)
        return 0; /* memcpy(NULL, .., 0) is UB, and UBSan says so */
    if (b->len > b->limit || n > b->limit - b->len)
        return -E2BIG; /* written so that len + n cannot overflow */
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : (b->limit < BUF_FIRST_CAP ? b->limit : BUF_FIRST_CAP);
        char *data;

        /* Ends: len + n <= limit, and cap reaches limit at the latest. */
        while (cap - b->len < n)
            cap = cap > b->limit / 2 ? b->limit : cap * 2;
        data = realloc(b->data, cap);
        if (!data)
            return -ENOMEM;
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int buf_reserve(struct buf *b, size_t n)
{
    size_t cap;
    char *data;

    if (b->len > b->limit)
        return 0;
    cap = n > b->limit - b->len ? b->limit : b->len + n;
    if (cap <= b->cap)
        return 0;
    data = realloc(b->data, cap);
    if (!data)
        return -ENOMEM;
    b->data = data;
    b->cap = cap;
    return 0;
}

void buf_done(struct buf *b)
{
    if (!b)
        return;
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}
