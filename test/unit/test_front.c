/* SPDX-License-Identifier: MIT */
/* front_framing_error: the request framings refused before anything runs. */
#include "check.h"
#include "idemproxy/front.h"
#include "idemproxy/upstream.h"

#define H(n, v)                                                                                    \
    {                                                                                              \
        .name = SPAN_LIT(n), .value = SPAN_LIT(v)                                                  \
    }

static void check_framing(const struct upstream_header *h, size_t n, unsigned want)
{
    unsigned status = 0;
    const char *why = front_framing_error(h, n, &status);

    if (!want) {
        CHECK(why == NULL);
        return;
    }
    CHECK(why != NULL);
    CHECK_EQ_INT(status, want);
}

static void test_front_framing_clear(void)
{
    const struct upstream_header none[] = { H("Host", "t") };
    const struct upstream_header cl[] = { H("Host", "t"), H("content-length", "35") };
    const struct upstream_header same_twice[] = { H("Content-Length", "7"),
                                                  H("Content-Length", "7") };
    const struct upstream_header te[] = { H("Transfer-Encoding", "CHUNKED") };
    const struct upstream_header symbols[] = { H("X-!#$%&'*+-.^_`|~", "v") };

    check_framing(none, ARRAY_SIZE(none), 0);
    check_framing(cl, ARRAY_SIZE(cl), 0);
    check_framing(same_twice, ARRAY_SIZE(same_twice), 0);
    check_framing(te, ARRAY_SIZE(te), 0);
    check_framing(symbols, ARRAY_SIZE(symbols), 0);
    check_framing(NULL, 0, 0);
}

static void test_front_framing_refused(void)
{
    const struct upstream_header both[] = { H("Content-Length", "3"),
                                            H("Transfer-Encoding", "chunked") };
    const struct upstream_header two_cl[] = { H("Content-Length", "0"), H("content-length", "35") };
    const struct upstream_header cl_list[] = { H("Content-Length", "0, 35") };
    const struct upstream_header cl_sign[] = { H("Content-Length", "+3") };
    const struct upstream_header cl_empty[] = { H("Content-Length", "") };
    const struct upstream_header two_te[] = { H("Transfer-Encoding", "chunked"),
                                              H("Transfer-Encoding", "chunked") };
    const struct upstream_header space_name[] = { H("Transfer-Encoding ", "chunked") };
    const struct upstream_header colon_name[] = { H("Content-Length:0", "35") };
    const struct upstream_header empty_name[] = { H("", "v") };
    const struct upstream_header te_list[] = { H("Transfer-Encoding", "chunked, identity") };
    const struct upstream_header te_gzip[] = { H("Transfer-Encoding", "gzip, chunked") };
    const struct upstream_header te_x[] = { H("Transfer-Encoding", "xchunked") };

    check_framing(both, ARRAY_SIZE(both), 400);
    check_framing(two_cl, ARRAY_SIZE(two_cl), 400);
    check_framing(cl_list, ARRAY_SIZE(cl_list), 400);
    check_framing(cl_sign, ARRAY_SIZE(cl_sign), 400);
    check_framing(cl_empty, ARRAY_SIZE(cl_empty), 400);
    check_framing(two_te, ARRAY_SIZE(two_te), 400);
    check_framing(space_name, ARRAY_SIZE(space_name), 400);
    check_framing(colon_name, ARRAY_SIZE(colon_name), 400);
    check_framing(empty_name, ARRAY_SIZE(empty_name), 400);
    check_framing(te_list, ARRAY_SIZE(te_list), 501);
    check_framing(te_gzip, ARRAY_SIZE(te_gzip), 501);
    check_framing(te_x, ARRAY_SIZE(te_x), 501);
}

TEST_MAIN(test_front_framing_clear, test_front_framing_refused)
