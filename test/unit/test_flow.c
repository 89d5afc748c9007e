/* SPDX-License-Identifier: MIT */
/* The flow (flow.h): the window, backpressure both ways, the copy, the held
 * end, cuts, and a reader gone. */
#include <errno.h>

#include "check.h"
#include "idemproxy/flow.h"

struct wakes {
    int reader, writer;
};

static void reader_woke(void *ctx) { ((struct wakes *)ctx)->reader++; }
static void writer_woke(void *ctx) { ((struct wakes *)ctx)->writer++; }

static void setup(struct flow *f, struct wakes *w)
{
    *w = (struct wakes){ 0 };
    flow_init(f);
    flow_set_reader(f, reader_woke, w);
    flow_set_writer(f, writer_woke, w);
}

static void test_flow_passes_bytes_in_order_then_ends(void)
{
    struct flow f;
    struct wakes w;
    char out[16];

    setup(&f, &w);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_AGAIN);
    CHECK_EQ_INT(flow_write(&f, "hello ", 6), 6);
    CHECK_EQ_INT(w.reader, 1); /* it waited: woken once */
    CHECK_EQ_INT(flow_write(&f, "world", 5), 5);
    CHECK_EQ_INT(w.reader, 1); /* it did not wait again */
    CHECK_EQ_INT(flow_read(&f, out, 4), 4);
    CHECK_EQ_MEM(out, "hell", 4);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), 7);
    CHECK_EQ_MEM(out, "o world", 7);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_AGAIN);
    flow_end(&f, true);
    CHECK_EQ_INT(w.reader, 2);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_END);
    CHECK_EQ_INT(f.written, 11);
    CHECK_EQ_INT(f.taken, 11);
    flow_done(&f);
}

static void test_flow_window_pauses_the_writer_until_half_is_read(void)
{
    static char big[FLOW_WINDOW], out[FLOW_WINDOW];
    struct flow f;
    struct wakes w;

    setup(&f, &w);
    memset(big, 'x', sizeof(big));
    CHECK_EQ_INT(flow_write(&f, big, FLOW_WINDOW - 10), FLOW_WINDOW - 10);
    CHECK_EQ_INT(flow_write(&f, big, 11), 0); /* over the window: nothing taken */
    CHECK(f.writer_paused);
    CHECK_EQ_INT(flow_write(&f, big, 10), 10); /* exactly full */
    CHECK_EQ_INT(flow_read(&f, out, FLOW_WINDOW / 4), FLOW_WINDOW / 4);
    CHECK_EQ_INT(w.writer, 0); /* three quarters still queued */
    CHECK_EQ_INT(flow_read(&f, out, FLOW_WINDOW / 4), FLOW_WINDOW / 4);
    CHECK_EQ_INT(w.writer, 1); /* half free: it goes on */
    CHECK_EQ_INT(flow_write(&f, big, FLOW_WINDOW / 2), FLOW_WINDOW / 2);
    CHECK_EQ_INT(flow_read(&f, out, FLOW_WINDOW), FLOW_WINDOW);
    flow_done(&f);
}

static void test_flow_takes_one_large_write_into_an_empty_window(void)
{
    static char big[FLOW_WINDOW * 2], out[FLOW_WINDOW * 2];
    struct flow f;
    struct wakes w;

    setup(&f, &w);
    memset(big, 'y', sizeof(big));
    CHECK_EQ_INT(flow_write(&f, big, sizeof(big)), sizeof(big));
    CHECK_EQ_INT(flow_write(&f, "z", 1), 0);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), sizeof(big));
    CHECK_EQ_MEM(out, big, sizeof(big));
    flow_done(&f);
}

static void test_flow_copy_stops_past_its_limit_and_the_reader_gets_all(void)
{
    struct buf copy = BUF_INIT(1 << 20);
    struct flow f;
    struct wakes w;
    char out[64];

    setup(&f, &w);
    CHECK_EQ_INT(buf_append(&copy, "ab", 2), 0); /* what came with the head */
    flow_set_copy(&f, &copy, 6);
    CHECK_EQ_INT(flow_write(&f, "cde", 3), 3);
    CHECK_EQ_INT(copy.len, 5);
    CHECK_EQ_MEM(copy.data, "abcde", 5);
    CHECK(!f.copy_over);
    CHECK_EQ_INT(flow_write(&f, "fg", 2), 2); /* 7 > 6: the copy is dropped */
    CHECK(f.copy_over);
    CHECK(copy.data == NULL && copy.len == 0);
    CHECK_EQ_INT(flow_write(&f, "h", 1), 1);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), 6);
    CHECK_EQ_MEM(out, "cdefgh", 6);
    flow_done(&f);

    setup(&f, &w);
    copy = BUF_INIT(1 << 20);
    CHECK_EQ_INT(buf_append(&copy, "0123456789", 10), 0);
    flow_set_copy(&f, &copy, 4); /* already past */
    CHECK(f.copy_over && copy.data == NULL);
    flow_done(&f);
}

static void test_flow_held_keeps_the_last_byte_and_the_end(void)
{
    struct flow f;
    struct wakes w;
    char out[16];

    setup(&f, &w);
    flow_set_length(&f, 5);
    flow_hold(&f);
    CHECK_EQ_INT(flow_write(&f, "abcde", 5), 5);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), 4); /* not the last one */
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_AGAIN);
    flow_end(&f, true);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_AGAIN); /* still held */
    w.reader = 0;
    flow_release(&f);
    CHECK_EQ_INT(w.reader, 1);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), 1);
    CHECK_EQ_INT(out[0], 'e');
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_END);
    flow_done(&f);

    /* Unknown length: the bytes go, the end waits; a cut waits too. */
    setup(&f, &w);
    flow_hold(&f);
    CHECK_EQ_INT(flow_write(&f, "xy", 2), 2);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), 2);
    flow_end(&f, false);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_AGAIN);
    flow_release(&f);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_CUT);
    flow_done(&f);
}

static void test_flow_cut_ends_the_reader_and_the_copy_goes_on(void)
{
    struct buf copy = BUF_INIT(1 << 20);
    struct flow f;
    struct wakes w;
    char out[16];

    setup(&f, &w);
    flow_set_copy(&f, &copy, 100);
    CHECK_EQ_INT(flow_write(&f, "abc", 3), 3);
    CHECK_EQ_INT(flow_read(&f, out, 1), 1);
    flow_cut(&f);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_CUT); /* the rest is dropped */
    CHECK(flow_wants_bytes(&f));
    CHECK_EQ_INT(flow_write(&f, "def", 3), 3); /* copied only */
    CHECK_EQ_INT(copy.len, 6);
    CHECK_EQ_INT(f.taken, 1);
    flow_done(&f);
    buf_done(&copy);

    /* Ended cut: the queued bytes first, then the cut. */
    setup(&f, &w);
    CHECK_EQ_INT(flow_write(&f, "abc", 3), 3);
    flow_end(&f, false);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), 3);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_CUT);
    flow_done(&f);
}

static void test_flow_reader_gone_wakes_the_writer_and_wants_no_bytes(void)
{
    struct flow f;
    struct wakes w;
    char out[4];

    setup(&f, &w);
    CHECK_EQ_INT(flow_write(&f, "abc", 3), 3);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), 3);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_AGAIN);
    flow_reader_gone(&f);
    CHECK_EQ_INT(w.writer, 1);
    CHECK(!flow_wants_bytes(&f));
    CHECK_EQ_INT(flow_write(&f, "def", 3), 3); /* dropped */
    CHECK_EQ_INT(w.reader, 0);                 /* never woken once gone */
    flow_done(&f);

    setup(&f, &w);
    flow_set_to_the_end(&f); /* a keyed exchange: it goes on */
    flow_reader_gone(&f);
    CHECK(flow_wants_bytes(&f));
    flow_done(&f);
}

static void over(void *ctx) { (*(int *)ctx)++; }

static void test_flow_tells_once_when_the_readers_body_is_over(void)
{
    struct flow f;
    struct wakes w;
    char out[16];
    int told = 0;

    setup(&f, &w);
    flow_set_over(&f, over, &told);
    flow_set_length(&f, 3);
    flow_hold(&f);
    CHECK_EQ_INT(flow_write(&f, "abc", 3), 3);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), 2);
    flow_end(&f, true);
    CHECK_EQ_INT(told, 0); /* held: its last byte is not taken */
    flow_release(&f);
    CHECK_EQ_INT(told, 0);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)),
                 1); /* the last byte: a known length asks no more */
    CHECK_EQ_INT(told, 1);
    CHECK_EQ_INT(flow_read(&f, out, sizeof(out)), FLOW_END);
    CHECK_EQ_INT(told, 1);
    flow_done(&f);

    setup(&f, &w);
    told = 0;
    flow_set_over(&f, over, &told);
    CHECK_EQ_INT(flow_write(&f, "x", 1), 1);
    flow_cut(&f);
    CHECK_EQ_INT(told, 1);
    flow_end(&f, false);
    CHECK_EQ_INT(told, 1);
    flow_done(&f);
}

TEST_MAIN(test_flow_passes_bytes_in_order_then_ends,
          test_flow_tells_once_when_the_readers_body_is_over,
          test_flow_window_pauses_the_writer_until_half_is_read,
          test_flow_takes_one_large_write_into_an_empty_window,
          test_flow_copy_stops_past_its_limit_and_the_reader_gets_all,
          test_flow_held_keeps_the_last_byte_and_the_end,
          test_flow_cut_ends_the_reader_and_the_copy_goes_on,
          test_flow_reader_gone_wakes_the_writer_and_wants_no_bytes)
