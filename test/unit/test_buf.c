/* SPDX-License-Identifier: MIT */
#include <stdint.h>

#include "check.h"
#include "idemproxy/buf.h"

static void test_buf_starts_empty(void)
{
    struct buf b = BUF_INIT(100);
    struct span s = buf_span(&b);

    CHECK(b.data == NULL);
    CHECK_EQ_INT(b.len, 0);
    CHECK_EQ_INT(b.limit, 100);
    CHECK_EQ_INT(s.len, 0);
    CHECK_EQ_INT(buf_append(&b, NULL, 0), 0); /* empty append: no allocation, no UB */
    CHECK(b.data == NULL);
    buf_done(&b);
}

static void test_buf_appends_and_grows(void)
{
    struct buf b = BUF_INIT(1 << 20);
    char chunk[1000];
    size_t total = 0;
    int bad = 0;

    for (size_t i = 0; i < sizeof(chunk); i++)
        chunk[i] = (char)(i * 7);
    for (int i = 0; i < 50; i++) {
        CHECK_EQ_INT(buf_append(&b, chunk, sizeof(chunk)), 0);
        total += sizeof(chunk);
    }
    CHECK_EQ_INT(b.len, total);
    CHECK(b.cap >= b.len);
    CHECK(b.cap <= b.limit);
    for (size_t i = 0; i < total; i++)
        bad += b.data[i] != chunk[i % sizeof(chunk)];
    CHECK_EQ_INT(bad, 0);
    CHECK(buf_span(&b).base == b.data);
    CHECK_EQ_INT(buf_span(&b).len, total);
    buf_done(&b);
}

static void test_buf_keeps_binary_bytes(void)
{
    struct buf b = BUF_INIT(16);
    static const char bin[] = { 'a', '\0', 'b', '\0', (char)0xff };

    CHECK_EQ_INT(buf_append(&b, bin, sizeof(bin)), 0);
    CHECK_EQ_INT(b.len, sizeof(bin));
    CHECK_EQ_MEM(b.data, bin, sizeof(bin));
    buf_done(&b);
}

static void test_buf_refuses_past_limit(void)
{
    struct buf b = BUF_INIT(10);

    CHECK_EQ_INT(buf_append(&b, "0123456", 7), 0);
    CHECK_EQ_INT(buf_append(&b, "abcd", 4), -E2BIG); /* 11 > 10 */
    CHECK_EQ_INT(b.len, 7);                          /* nothing appended */
    CHECK_EQ_MEM(b.data, "0123456", 7);
    CHECK_EQ_INT(buf_append(&b, "abc", 3), 0); /* exactly the limit */
    CHECK_EQ_INT(b.len, 10);
    CHECK_EQ_MEM(b.data, "0123456abc", 10);
    CHECK_EQ_INT(buf_append(&b, "x", 1), -E2BIG);
    CHECK_EQ_INT(b.len, 10);
    CHECK(b.cap <= 10); /* never allocates past the limit */
    buf_done(&b);

    struct buf c = BUF_INIT(300);
    char fill[300];

    memset(fill, 'f', sizeof(fill));
    CHECK_EQ_INT(buf_append(&c, fill, 200), 0);
    CHECK_EQ_INT(buf_append(&c, fill, 100), 0); /* growth stops at the limit */
    CHECK_EQ_INT(c.len, 300);
    CHECK(c.cap <= 300);
    CHECK_EQ_INT(buf_append(&c, fill, 1), -E2BIG);
    buf_done(&c);
}

static void test_buf_limit_zero_refuses_everything(void)
{
    struct buf b = BUF_INIT(0);

    CHECK_EQ_INT(buf_append(&b, "x", 1), -E2BIG);
    CHECK(b.data == NULL);
    CHECK_EQ_INT(buf_append(&b, "x", 0), 0);
    buf_done(&b);
}

static void test_buf_huge_append_does_not_overflow(void)
{
    struct buf b = BUF_INIT(SIZE_MAX);

    CHECK_EQ_INT(buf_append(&b, "abc", 3), 0);
    /* len + n would wrap around: must be refused, not "fit". */
    CHECK_EQ_INT(buf_append(&b, "x", SIZE_MAX - 1), -E2BIG);
    CHECK_EQ_INT(buf_append(&b, "x", SIZE_MAX), -E2BIG);
    CHECK_EQ_INT(b.len, 3);
    CHECK_EQ_MEM(b.data, "abc", 3);
    buf_done(&b);

    struct buf small = BUF_INIT(100);

    CHECK_EQ_INT(buf_append(&small, "x", SIZE_MAX), -E2BIG);
    CHECK_EQ_INT(small.len, 0);
    buf_done(&small);
}

static void test_buf_done_resets_and_is_null_safe(void)
{
    struct buf b = BUF_INIT(50);

    CHECK_EQ_INT(buf_append(&b, "hello", 5), 0);
    buf_done(&b);
    CHECK(b.data == NULL);
    CHECK_EQ_INT(b.len, 0);
    CHECK_EQ_INT(b.cap, 0);
    CHECK_EQ_INT(b.limit, 50); /* the limit stays */
    buf_done(&b);              /* twice is fine */
    buf_done(NULL);
    CHECK_EQ_INT(buf_append(&b, "again", 5), 0); /* reusable after done */
    CHECK_EQ_MEM(b.data, "again", 5);
    buf_done(&b);
}

static void test_buf_reserve_allocates_once_up_to_the_limit(void)
{
    struct buf b = BUF_INIT(100);
    char *data;

    CHECK_EQ_INT(buf_reserve(&b, 40), 0);
    CHECK_EQ_INT(b.cap, 40);
    CHECK_EQ_INT(b.len, 0);
    data = b.data;
    CHECK_EQ_INT(buf_append(&b, "0123456789012345678901234567890123456789", 40), 0);
    CHECK(b.data == data); /* no realloc while the reserved bytes arrive */
    CHECK_EQ_INT(b.cap, 40);
    CHECK_EQ_INT(buf_reserve(&b, 10), 0); /* room for 10 more */
    CHECK_EQ_INT(b.cap, 50);
    CHECK_EQ_INT(buf_reserve(&b, 5), 0); /* already there: nothing changes */
    CHECK_EQ_INT(b.cap, 50);
    CHECK_EQ_INT(buf_reserve(&b, SIZE_MAX), 0); /* capped at the limit, no overflow */
    CHECK_EQ_INT(b.cap, 100);
    CHECK_EQ_INT(b.len, 40);
    CHECK_EQ_INT(buf_append(&b, "x", 61), -E2BIG); /* the limit still holds */
    buf_done(&b);
}

TEST_MAIN(test_buf_reserve_allocates_once_up_to_the_limit, test_buf_starts_empty,
          test_buf_appends_and_grows, test_buf_keeps_binary_bytes, test_buf_refuses_past_limit,
          test_buf_limit_zero_refuses_everything, test_buf_huge_append_does_not_overflow,
          test_buf_done_resets_and_is_null_safe)
