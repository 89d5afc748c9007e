/* SPDX-License-Identifier: MIT */
/* The flow (flow.h) between an upstream and a client: whatever the pieces
 * the writer brings, the reads the reader makes and when, what the reader
 * takes is exactly what the writer wrote, in order, whole at the end; the
 * copy is all of it unless it passed its limit; the window is never passed
 * but by a single write into an empty flow; a held flow gives neither its
 * last byte nor its end before the release. Input: a script, two bytes a
 * step: an operation and a size. */
#include "fuzz.h"
#include "idemproxy/flow.h"

#define MAX_BODY (4u << 20)

static uint8_t source_byte(uint64_t i) { return (uint8_t)(i * 31 + 7 + (i >> 11)); }

struct side {
    bool writer_woken;
};

static void woke(void *ctx) { ((struct side *)ctx)->writer_woken = true; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char piece[FLOW_WINDOW * 2], got[FLOW_WINDOW * 2];
    struct buf copy = BUF_INIT(MAX_BODY);
    struct side w = { 0 };
    struct flow f;
    uint64_t total, wrote = 0, read = 0, limit;
    bool held, released = false, ended = false, paused = false;

    if (size < 3)
        return 0;
    total = ((uint64_t)data[0] << 12 | (uint64_t)data[1] << 4) % MAX_BODY;
    held = data[2] & 1;
    limit = (data[2] & 2) ? total / 2 : MAX_BODY;
    flow_init(&f);
    flow_set_writer(&f, woke, &w);
    flow_set_copy(&f, &copy, limit);
    if (data[2] & 4)
        flow_set_length(&f, total);
    if (held)
        flow_hold(&f);
    for (size_t at = 3; at + 1 < size || !ended || read < total; at += 2) {
        uint8_t op = at + 1 < size ? data[at] : 0xff, arg = at + 1 < size ? data[at + 1] : 0xff;
        size_t n = ((size_t)arg + 1) * ((op & 0x40) ? 2048 : 37); /* at most a piece */

        if (at + 1 >= size && !released && held) { /* the script is over: the store reports */
            released = true;
            flow_release(&f);
        }
        if ((op & 1) && !ended && (!paused || w.writer_woken)) { /* the upstream writes */
            if (n > total - wrote)
                n = (size_t)(total - wrote);
            for (size_t i = 0; i < n; i++)
                piece[i] = (char)source_byte(wrote + i);
            if (n > 0) {
                size_t unread_before = (size_t)(f.written - f.taken);
                size_t taken = flow_write(&f, piece, n);

                FUZZ_CHECK(taken == 0 || taken == n);
                FUZZ_CHECK(taken == n || unread_before > 0); /* an empty flow takes any write */
                paused = taken == 0;
                w.writer_woken = false;
                wrote += taken;
                FUZZ_CHECK(taken == 0 || unread_before == 0 ||
                           f.written - f.taken <= FLOW_WINDOW);
            }
            if (wrote == total) {
                flow_end(&f, true);
                ended = true;
            }
        }
        if (!(op & 1) || at + 1 >= size) { /* the client reads */
            ssize_t r = flow_read(&f, got, n < sizeof(got) ? n : sizeof(got));

            if (r > 0) {
                for (ssize_t i = 0; i < r; i++)
                    FUZZ_CHECK((uint8_t)got[i] == source_byte(read + (uint64_t)i));
                read += (uint64_t)r;
                FUZZ_CHECK(!held || released || (data[2] & 4) == 0 || read < total);
            } else if (r == FLOW_END) {
                FUZZ_CHECK(ended && read == total && (!held || released));
                break;
            } else {
                FUZZ_CHECK(r == FLOW_AGAIN);
                FUZZ_CHECK(!ended || (held && !released) || read < total);
                if (at + 1 >= size && ended && held && !released)
                    FUZZ_CHECK(0); /* unreachable: released above */
            }
        }
        FUZZ_CHECK(at < size + 4 * (MAX_BODY / 37) + 16); /* the tail always ends */
    }
    FUZZ_CHECK(read == total && wrote == total);
    if (total <= limit) {
        FUZZ_CHECK(!f.copy_over && copy.len == total);
        for (uint64_t i = 0; i < total; i++)
            FUZZ_CHECK((uint8_t)copy.data[i] == source_byte(i));
    } else {
        FUZZ_CHECK(f.copy_over && copy.len == 0);
    }
    flow_done(&f);
    buf_done(&copy);
    return 0;
}
