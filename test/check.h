/* SPDX-License-Identifier: MIT */
/* A minimal test harness: CHECK macros count failures, TEST_MAIN runs the
 * listed tests and exits 1 if any check failed. */
#ifndef IDEMPROXY_TEST_CHECK_H
#define IDEMPROXY_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures;
static int check_count;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        check_count++;                                                                             \
        if (!(cond)) {                                                                             \
            check_failures++;                                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                            \
        check_count++;                                                                             \
        if (check_a_ != check_b_) {                                                                \
            check_failures++;                                                                      \
            fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s == %lld, %s == %lld\n", __FILE__,      \
                    __LINE__, #a, check_a_, #b, check_b_);                                         \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                         \
    do {                                                                                           \
        const char *check_a_ = (a), *check_b_ = (b);                                               \
        check_count++;                                                                             \
        if (!check_a_ || !check_b_ || strcmp(check_a_, check_b_) != 0) {                           \
            check_failures++;                                                                      \
            fprintf(stderr, "%s:%d: CHECK_EQ_STR failed: %s == \"%s\", %s == \"%s\"\n", __FILE__,  \
                    __LINE__, #a, check_a_ ? check_a_ : "(null)", #b,                              \
                    check_b_ ? check_b_ : "(null)");                                               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_MEM(a, b, n) CHECK(memcmp((a), (b), (n)) == 0)

typedef void check_test_fn(void);

static inline int check_run(const char *const *names, check_test_fn *const *tests, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int before = check_failures;

        tests[i]();
        fprintf(stderr, "%s %s\n", check_failures == before ? "ok  " : "FAIL", names[i]);
    }
    fprintf(stderr, "%d checks, %d failed\n", check_count, check_failures);
    if (check_count == 0)
        return 1; /* a test binary that checked nothing is a defect */
    return check_failures ? 1 : 0;
}

#define CHECK_STR_(x) #x
#define TEST_MAIN(...)                                                                             \
    int main(void)                                                                                 \
    {                                                                                              \
        check_test_fn *const tests[] = { __VA_ARGS__ };                                            \
        static const char names[] = #__VA_ARGS__;                                                  \
        const char *list[sizeof(tests) / sizeof(tests[0])];                                        \
        char copy[sizeof(names)];                                                                  \
        size_t n = 0;                                                                              \
        memcpy(copy, names, sizeof(names));                                                        \
        for (char *tok = strtok(copy, ", "); tok && n < sizeof(tests) / sizeof(tests[0]);          \
             tok = strtok(NULL, ", "))                                                             \
            list[n++] = tok;                                                                       \
        return check_run(list, tests, n);                                                          \
    }

#endif
