/* SPDX-License-Identifier: MIT */
/* A body on its way through the proxy: a window of unread bytes in one
 * buffer, read from its front (compacted when the front passes half of it),
 * a copy beside it, and the two wake-ups. One thread. */
#include "idemproxy/flow.h"

#include <string.h>

void flow_init(struct flow *f)
{
    /* The window, not the buffer's limit, bounds what is queued. */
    *f = (struct flow){ .q = BUF_INIT(SIZE_MAX), .length = FLOW_LENGTH_UNKNOWN };
}

static size_t unread(const struct flow *f) { return f->q.len - f->off; }

/* Drops the copy: it would pass its limit, or memory ran out. */
static void drop_copy(struct flow *f)
{
    buf_done(f->copy);
    f->copy = NULL;
    f->copy_over = true;
}

void flow_set_copy(struct flow *f, struct buf *copy, size_t limit)
{
    f->copy = copy;
    f->copy_limit = limit;
    f->copy_over = false;
    if (copy->len > limit)
        drop_copy(f);
}

void flow_set_length(struct flow *f, uint64_t length) { f->length = length; }

void flow_set_over(struct flow *f, flow_wake_fn *fn, void *ctx)
{
    f->over = fn;
    f->over_ctx = ctx;
}

/* Tells <over> once the reader's body is over: cut, or ended, released and
 * all taken (a reader of a known length asks no more after its last byte). */
static void tell_over(struct flow *f)
{
    if (f->over_told || !f->over)
        return;
    if (!f->cut && !(f->ended && !f->held && unread(f) == 0))
        return;
    f->over_told = true;
    f->over(f->over_ctx);
}

void flow_set_to_the_end(struct flow *f) { f->to_the_end = true; }

void flow_set_reader(struct flow *f, flow_wake_fn *fn, void *ctx)
{
    f->reader_wake = fn;
    f->reader_ctx = ctx;
}

void flow_set_writer(struct flow *f, flow_wake_fn *fn, void *ctx)
{
    f->writer_wake = fn;
    f->writer_ctx = ctx;
    f->writer_paused = false;
}

/* Something came for the reader: woken once if it saw FLOW_AGAIN. */
static void wake_reader(struct flow *f)
{
    if (!f->reader_waits)
        return;
    f->reader_waits = false;
    if (f->reader_wake)
        f->reader_wake(f->reader_ctx);
}

static void wake_writer(struct flow *f)
{
    f->writer_paused = false;
    if (f->writer_wake)
        f->writer_wake(f->writer_ctx);
}

bool flow_wants_bytes(const struct flow *f)
{
    return f->to_the_end || f->copy || !(f->reader_gone || f->cut);
}

static size_t put(struct flow *f, const char *p, size_t n);

size_t flow_write(struct flow *f, const char *p, size_t n)
{
    bool queue = !(f->reader_gone || f->cut);

    if (n == 0)
        return 0;
    /* An empty window takes any write: the writer's piece is never split. */
    if (queue && unread(f) > 0 && (unread(f) >= FLOW_WINDOW || n > FLOW_WINDOW - unread(f))) {
        f->writer_paused = true;
        return 0;
    }
    return put(f, p, n);
}

void flow_push(struct flow *f, const char *p, size_t n)
{
    if (n > 0)
        (void)put(f, p, n);
}

/* Copies and queues <n> > 0 bytes, the window checked or not. */
static size_t put(struct flow *f, const char *p, size_t n)
{
    bool queue = !(f->reader_gone || f->cut);

    if (f->copy && (n > f->copy_limit - f->copy->len || buf_append(f->copy, p, n) < 0))
        drop_copy(f); /* past --max-response (or out of memory): the client still gets it all */
    f->written += n;
    if (!queue)
        return n;
    if (n > f->q.cap - f->q.len &&
        f->off > 0) { /* room at the front: move the unread bytes there */
        memmove(f->q.data, f->q.data + f->off, unread(f));
        f->q.len -= f->off;
        f->off = 0;
    }
    if (buf_append(&f->q, p, n) < 0) {
        flow_cut(f); /* out of memory: the reader's body cannot be whole */
        return n;
    }
    wake_reader(f);
    return n;
}

void flow_end(struct flow *f, bool whole)
{
    if (f->ended)
        return;
    f->ended = true;
    f->whole = whole;
    wake_reader(f);
    tell_over(f);
}

void flow_hold(struct flow *f) { f->held = true; }

void flow_release(struct flow *f)
{
    if (!f->held)
        return;
    f->held = false;
    wake_reader(f);
    tell_over(f);
}

void flow_cut(struct flow *f)
{
    f->cut = true;
    f->off = f->q.len = 0;
    wake_reader(f);
    tell_over(f);
    if (f->writer_paused)
        wake_writer(f); /* nothing is queued any more */
}

ssize_t flow_read(struct flow *f, char *p, size_t n)
{
    size_t avail = unread(f);
    bool was_full;

    if (f->cut || (f->ended && !f->whole && avail == 0 && !f->held))
        return FLOW_CUT;
    if (f->held && f->length != FLOW_LENGTH_UNKNOWN) {
        /* A known length's last byte waits for the release: the client
         * cannot take the answer for whole before it is stored. */
        uint64_t free_to = f->length > 0 ? f->length - 1 : 0;

        if (f->taken >= free_to)
            avail = 0;
        else if (avail > free_to - f->taken)
            avail = (size_t)(free_to - f->taken);
    }
    if (avail == 0) {
        if (f->ended && f->whole && !f->held && unread(f) == 0) /* a held cut waits too */
            return FLOW_END;
        f->reader_waits = true;
        return FLOW_AGAIN;
    }
    if (n > avail)
        n = avail;
    memcpy(p, f->q.data + f->off, n);
    was_full = f->writer_paused;
    f->off += n;
    f->taken += n;
    if (f->off == f->q.len)
        f->off = f->q.len = 0;
    /* The writer goes on once half the window is free: fewer, larger steps. */
    if (was_full && unread(f) <= FLOW_WINDOW / 2)
        wake_writer(f);
    tell_over(f);
    return (ssize_t)n;
}

void flow_reader_gone(struct flow *f)
{
    if (f->reader_gone)
        return;
    f->reader_gone = true;
    f->reader_wake = NULL;
    f->reader_waits = false;
    f->off = 0;
    buf_done(&f->q);
    wake_writer(f);
}

void flow_done(struct flow *f)
{
    if (!f)
        return;
    buf_done(&f->q);
    f->off = 0;
}
