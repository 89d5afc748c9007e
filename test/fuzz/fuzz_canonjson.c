/* SPDX-License-Identifier: MIT */
/* Canonical JSON for the semantic fingerprint (canonjson_write, doc/configuration.md, Fingerprint):
 * every byte of the body comes from a client. */
#include <stdlib.h>

#include "fuzz.h"
#include "idemproxy/buf.h"
#include "idemproxy/canonjson.h"
#include "idemproxy/keysource.h"

#define DEPTH 64
#define MAX_POINTERS 8
#define LIMIT ((size_t)1 << 22) /* far above what 16 KiB of body can give */

/* canonjson_write() on a heap copy of exactly <body.len> bytes (ASan sees a
 * read past it), checking the copy is unchanged, the result one of the
 * documented ones, and what was in <out> before kept. */
static int run(struct span body, const char *const *ptrs, size_t n, size_t depth, size_t limit,
               struct buf *out)
{
    char *copy = malloc(body.len ? body.len : 1);
    int r;

    FUZZ_CHECK(copy != NULL);
    *out = BUF_INIT(limit);
    FUZZ_CHECK(buf_append(out, "#", 1) == 0);
    if (body.len)
        memcpy(copy, body.base, body.len);
    r = canonjson_write((struct span){ .base = copy, .len = body.len }, ptrs, n, depth, out);
    FUZZ_CHECK(body.len == 0 || memcmp(copy, body.base, body.len) == 0);
    free(copy);
    FUZZ_CHECK(r == 0 || r == -EINVAL || r == -E2BIG || r == -ENOMEM);
    FUZZ_CHECK(out->len >= 1 && out->data[0] == '#');
    FUZZ_CHECK(r == 0 || out->len == 1);
    return r;
}

static struct span canonical(const struct buf *out)
{
    return (struct span){ .base = out->data + 1, .len = out->len - 1 };
}

/* <form> is canonical: it parses and is its own canonical form, holds no
 * whitespace outside strings and nothing that needs an escape it lacks. */
static void check_canonical(struct span form)
{
    struct buf again;

    if (form.len == 0)
        return; /* "" removed everything */
    FUZZ_CHECK(run(form, NULL, 0, DEPTH, LIMIT, &again) == 0);
    FUZZ_CHECK(span_eq(canonical(&again), form));
    buf_done(&again);
    /* Exactly as long a limit is enough, one byte less is not. */
    FUZZ_CHECK(run(form, NULL, 0, DEPTH, form.len + 1, &again) == 0);
    FUZZ_CHECK(span_eq(canonical(&again), form));
    buf_done(&again);
    FUZZ_CHECK(run(form, NULL, 0, DEPTH, form.len, &again) == -E2BIG);
    buf_done(&again);
}

/* An accepted <body> in brackets gives its <form> in brackets, one level
 * deeper allowed. (A refused one may not be refused there: 1,2.) */
static void check_wrapped(struct span body, struct span form)
{
    char *doc = malloc(body.len + 2);
    struct buf out;
    int again;

    FUZZ_CHECK(doc != NULL);
    doc[0] = '[';
    if (body.len)
        memcpy(doc + 1, body.base, body.len);
    doc[body.len + 1] = ']';
    again = run((struct span){ .base = doc, .len = body.len + 2 }, NULL, 0, DEPTH + 1, LIMIT, &out);
    FUZZ_CHECK(again == 0);
    FUZZ_CHECK(out.len == form.len + 3 && out.data[1] == '[' && out.data[out.len - 1] == ']');
    FUZZ_CHECK(memcmp(out.data + 2, form.base, form.len) == 0);
    buf_done(&out);
    free(doc);
}

/* The first line holds up to MAX_POINTERS pointers, one space apart (one
 * keysource_pointer_check() refuses is left out); the rest is the body.
 * Without a '\n' the whole input is the body. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct span in = { .base = (const char *)data, .len = size }, parts[2], words[MAX_POINTERS];
    size_t n = fuzz_split(in, '\n', parts, ARRAY_SIZE(parts)), nw = 0, np = 0;
    struct span body = n == 2 ? parts[1] : in;
    char *ptrs[MAX_POINTERS];
    struct buf plain, again, removed;
    int r, r2;

    if (n == 2 && parts[0].len > 0)
        nw = fuzz_split(parts[0], ' ', words, ARRAY_SIZE(words));
    for (size_t i = 0; i < nw; i++) {
        ptrs[np] = fuzz_strdup(words[i]);
        if (keysource_pointer_check(ptrs[np]) == 0)
            np++;
        else
            free(ptrs[np]);
    }
    r = run(body, NULL, 0, DEPTH, LIMIT, &plain);
    FUZZ_CHECK(r != -E2BIG);
    r2 = run(body, NULL, 0, DEPTH, LIMIT, &again); /* deterministic */
    FUZZ_CHECK(r2 == r && span_eq(canonical(&again), canonical(&plain)));
    buf_done(&again);
    if (r == 0) {
        check_canonical(canonical(&plain));
        check_wrapped(body, canonical(&plain));
    }
    /* Removing parts: the same answer, a canonical form no longer than the whole. */
    r2 = run(body, (const char *const *)ptrs, np, DEPTH, LIMIT, &removed);
    FUZZ_CHECK(r2 == r);
    if (r == 0) {
        FUZZ_CHECK(removed.len <= plain.len);
        FUZZ_CHECK(np > 0 || span_eq(canonical(&removed), canonical(&plain)));
        check_canonical(canonical(&removed));
    }
    buf_done(&removed);
    buf_done(&plain);
    for (size_t i = 0; i < np; i++)
        free(ptrs[i]);
    return 0;
}
