/* SPDX-License-Identifier: MIT */
/* A body on its way through the proxy (doc/guarantees.md, "Streaming"): a
 * bounded queue of bytes between one writer (the upstream exchange) and one
 * reader (the client's connection), with backpressure both ways, and an
 * optional copy of every byte that passes (a keyed answer captured for its
 * record). Base module: one thread, the loop that carries both sides; it
 * calls nothing but the two wake-ups its sides register. */
#ifndef IDEMPROXY_FLOW_H
#define IDEMPROXY_FLOW_H

#include <sys/types.h>

#include "idemproxy/buf.h"
#include "idemproxy/common.h"

/* The most bytes a flow holds that its reader has not taken (one write into
 * an empty flow is taken whole, whatever its size). */
#define FLOW_WINDOW (256u << 10)

#define FLOW_LENGTH_UNKNOWN UINT64_MAX

/* What flow_read() returns when it gives no bytes. */
enum {
    FLOW_AGAIN = 0, /* none now: the reader's wake-up runs when there are */
    FLOW_END = -1,  /* the body is whole, and all of it was read */
    FLOW_CUT = -2,  /* the body was cut: the reader must make that visible */
};

/* A side's wake-up, run by the flow on its thread from inside the other
 * side's call (flow_write() runs the reader's, flow_read() and
 * flow_reader_gone() the writer's): it notes and schedules, and never calls
 * back into the flow. */
typedef void flow_wake_fn(void *ctx);

/* Embedded and zeroed (flow_init()); the fields are the module's. */
struct flow {
    struct buf q;      /* owned: the bytes not yet read, from <off> on */
    size_t off;        /* bytes of <q> already read */
    struct buf *copy;  /* borrowed: every byte also goes here; NULL: no copy */
    size_t copy_limit; /* the copy stops before passing this */
    bool copy_over;    /* it would have: the copy was dropped */
    uint64_t length;   /* the body's announced length, or FLOW_LENGTH_UNKNOWN */
    uint64_t written;  /* bytes the writer gave */
    uint64_t taken;    /* bytes the reader took */
    bool ended;        /* the writer is done */
    bool whole;        /* ... and the body is whole */
    bool cut;          /* the reader's body is cut: no more bytes for it */
    bool held;         /* the end (and the last byte of a known length) waits for flow_release() */
    bool reader_gone;  /* nobody reads: written bytes are copied, then dropped */
    bool to_the_end;   /* the writer goes on to the end even with nobody reading */
    flow_wake_fn *reader_wake; /* the reader's wake-up, NULL: none */
    void *reader_ctx;
    bool reader_waits; /* its last read gave FLOW_AGAIN */
    flow_wake_fn
        *writer_wake; /* the writer, paused or not, wants to hear of room or of the reader gone */
    void *writer_ctx;
    bool writer_paused; /* the last write found the window full */
    flow_wake_fn *over; /* the reader's body is over, whole or cut: told once */
    void *over_ctx;
    bool over_told;
};

/* Makes <f> an empty flow of unknown length. */
void flow_init(struct flow *f);

/* Every byte written from now on is also appended to <copy> (borrowed: it
 * must outlive the writes), as long as it stays within <limit> bytes; the
 * write that would pass it drops the copy (buf_done()) and sets copy_over.
 * A <copy> already past <limit> is dropped at once. */
void flow_set_copy(struct flow *f, struct buf *copy, size_t limit);

/* The writer is to go on to the end of the body even when nobody reads it
 * and nothing is copied (a keyed exchange: its end decides its key). */
void flow_set_to_the_end(struct flow *f);

/* The body's announced length (so that a held flow keeps its last byte). */
void flow_set_length(struct flow *f, uint64_t length);

/* The reader's wake-up: <fn>(<ctx>) runs once after each flow_read() that
 * gave FLOW_AGAIN, when bytes, the end or the cut came. NULL: none. */
void flow_set_reader(struct flow *f, flow_wake_fn *fn, void *ctx);

/* The writer's wake-up: <fn>(<ctx>) runs when a paused writer may write
 * again, and when the reader goes while nothing is copied
 * (flow_wants_bytes() false: the writer should stop). NULL: none (the
 * writer is gone). */
void flow_set_writer(struct flow *f, flow_wake_fn *fn, void *ctx);

/* <fn>(<ctx>) runs once, from inside the call that makes it so, when the
 * reader's body is over: the reader took its last byte and the end is known
 * (whole, released when held), or it is cut. Its bytes are known then, and
 * the reader has not sent the last of them yet. */
void flow_set_over(struct flow *f, flow_wake_fn *fn, void *ctx);

/* Writes <n> bytes at <p>: copied (flow_set_copy()) and queued for the
 * reader, or only copied when the reader is gone or cut. Returns <n>, or 0
 * when the window (FLOW_WINDOW unread bytes) has no room for them (an empty
 * one always has): nothing
 * was taken, the writer pauses, and its wake-up runs when there is room. */
size_t flow_write(struct flow *f, const char *p, size_t n);

/* As flow_write(), but whatever the window holds: for a writer that must
 * not pause (the caller bounds what it pushes). */
void flow_push(struct flow *f, const char *p, size_t n);

/* Whether the writer should go on: a reader still reads, a copy is kept, or
 * it is to go on to the end. */
bool flow_wants_bytes(const struct flow *f);

/* The writer is done: the body is <whole>, or cut. The reader gets the
 * bytes queued, then FLOW_END (held: after flow_release()) or FLOW_CUT. */
void flow_end(struct flow *f, bool whole);

/* Holds the end back from the reader (whole or cut by flow_end()), and with
 * a known length the last byte: until flow_release(), the reader cannot
 * take the body for whole, nor see its cut (the key's fate is stored
 * first). */
void flow_hold(struct flow *f);
void flow_release(struct flow *f);

/* Cuts the reader's body now: what it has not taken is dropped, its next
 * read gives FLOW_CUT; the writer goes on into the copy. */
void flow_cut(struct flow *f);

/* Takes up to <n> unread bytes into <p>. Returns how many (> 0), FLOW_AGAIN
 * (none now; the reader's wake-up runs later), FLOW_END or FLOW_CUT. */
ssize_t flow_read(struct flow *f, char *p, size_t n);

/* The reader is gone: unread bytes are dropped, the reader's wake-up
 * cleared, and the writer woken (it stops when nothing is copied). */
void flow_reader_gone(struct flow *f);

/* Frees what <f> owns (not the copy). NULL-safe, idempotent. */
void flow_done(struct flow *f);

#endif
