/* SPDX-License-Identifier: MIT */
/* Random bytes in per-thread blocks (rng.h): every draw is new, across a
 * block's end, and hex is what it says. */
#include "idemproxy/rng.h"

#include <string.h>

#include "check.h"

static void test_rng_draws_differ_across_blocks(void)
{
    unsigned char seen[100][16], big[2048] = { 0 }, zero[2048] = { 0 };

    for (size_t i = 0; i < 100; i++) /* 1600 bytes: past three blocks */
        CHECK_EQ_INT(rng_bytes(seen[i], sizeof(seen[i])), 0);
    for (size_t i = 0; i < 100; i++) {
        for (size_t j = i + 1; j < 100; j++)
            CHECK(memcmp(seen[i], seen[j], sizeof(seen[i])) != 0);
    }
    CHECK_EQ_INT(rng_bytes(big, sizeof(big)), 0); /* larger than a block */
    CHECK(memcmp(big, zero, sizeof(big)) != 0);
}

static void test_rng_hex(void)
{
    char a[33], b[33];

    memset(a, 'X', sizeof(a));
    CHECK_EQ_INT(rng_hex(a, 16), 0);
    CHECK_EQ_INT(rng_hex(b, 16), 0);
    CHECK_EQ_INT(strlen(a), 32);
    CHECK_EQ_INT(strspn(a, "0123456789abcdef"), 32);
    CHECK(strcmp(a, b) != 0);
    CHECK_EQ_INT(rng_hex(a, 65), -EIO); /* past what it draws at once */
}

TEST_MAIN(test_rng_draws_differ_across_blocks, test_rng_hex)
