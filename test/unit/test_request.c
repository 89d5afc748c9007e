/* SPDX-License-Identifier: MIT */
/* Request ids (doc/operations.md, Metrics and access log): a client's is kept
 * when it is 1 to 200 bytes of 0x21-0x7E and the only one; else one is made,
 * 32 hex digits, new each time. */
#include "check.h"
#include "idemproxy/request.h"

static const struct span H = SPAN_LIT("X-Request-Id");

/* The id picked for a request carrying the fields <values> (<n> of them,
 * NULL: none) named <name>. */
static bool pick(const char *name, const char *const *values, size_t n, size_t len0,
                 char out[REQUEST_ID_MAX + 1])
{
    struct request *rq = request_new("/");
    bool kept;

    CHECK(rq != NULL);
    if (!rq)
        return false;
    (void)request_add_header(rq, SPAN_LIT("Host"), SPAN_LIT("h"));
    for (size_t i = 0; i < n; i++) {
        struct span v = span_from_cstr(values[i]);

        if (i == 0 && len0)
            v.len = len0; /* bytes past a NUL */
        (void)request_add_header(rq, span_from_cstr(name), v);
    }
    kept = request_id_pick(rq, H, out);
    request_free(rq);
    return kept;
}

static bool is_made(const char *id)
{
    if (strlen(id) != 32)
        return false;
    for (const char *p = id; *p; p++) {
        if (!strchr("0123456789abcdef", *p))
            return false;
    }
    return true;
}

static void test_request_id_kept(void)
{
    char out[REQUEST_ID_MAX + 1], longest[REQUEST_ID_MAX + 1];
    const char *v[1] = { "abc-123_~!" };

    CHECK(pick("x-request-id", v, 1, 0, out)); /* the name in any case */
    CHECK_EQ_STR(out, "abc-123_~!");
    memset(longest, '7', REQUEST_ID_MAX);
    longest[REQUEST_ID_MAX] = '\0';
    v[0] = longest;
    CHECK(pick("X-Request-Id", v, 1, 0, out));
    CHECK_EQ_STR(out, longest);
}

static void test_request_id_made(void)
{
    static const char nul[] = "ab\0cd";
    char out[REQUEST_ID_MAX + 1], again[REQUEST_ID_MAX + 1], too_long[REQUEST_ID_MAX + 2];
    const char *bad[] = { "", "has space", "tab\there", "caf\xc3\xa9", "del\x7f" };
    const char *two[] = { "one", "two" };
    const char *v[1];

    CHECK(!pick("X-Request-Id", NULL, 0, 0, out));
    CHECK(is_made(out));
    CHECK(!pick("X-Request-Id", NULL, 0, 0, again));
    CHECK(is_made(again) && strcmp(out, again) != 0);
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        v[0] = bad[i];
        CHECK(!pick("X-Request-Id", v, 1, 0, out));
        CHECK(is_made(out));
    }
    memset(too_long, 'a', REQUEST_ID_MAX + 1);
    too_long[REQUEST_ID_MAX + 1] = '\0';
    v[0] = too_long;
    CHECK(!pick("X-Request-Id", v, 1, 0, out) && is_made(out));
    v[0] = nul;
    CHECK(!pick("X-Request-Id", v, 1, sizeof(nul) - 1, out) && is_made(out));
    CHECK(!pick("X-Request-Id", two, 2, 0, out) && is_made(out)); /* which one? neither */
    v[0] = "other";
    CHECK(!pick("X-Correlation-Id", v, 1, 0, out) && is_made(out));
    CHECK(request_id_is_valid(SPAN_LIT("!")) && request_id_is_valid(SPAN_LIT("~")));
    CHECK(!request_id_is_valid(SPAN_LIT(" ")) && !request_id_is_valid((struct span){ "", 0 }));
}

TEST_MAIN(test_request_id_kept, test_request_id_made)
