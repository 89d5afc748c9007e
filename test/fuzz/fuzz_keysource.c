/* SPDX-License-Identifier: MIT */
/* A route's key sources (doc/configuration.md, Key sources): an RFC 6901
 * pointer into a JSON body (keysource_json) and composite keys
 * (keysource_composite). */
#include <stdlib.h>

#include "fuzz.h"
#include "idemproxy/keysource.h"

/* Below jansson's JSON_PARSER_MAX_DEPTH (2048) with one level to spare, so
 * that wrapping the body in one more array or object cannot make it too deep. */
#define WRAP_MAX_OPEN 2000

/* An accepted key is what README.md says one is: 1-255 bytes of 0x21-0x7E. */
static void check_key(const struct idemkey *k)
{
    FUZZ_CHECK(k->len >= 1 && k->len <= IDEMKEY_MAX);
    for (size_t i = 0; i < k->len; i++)
        FUZZ_CHECK(k->buf[i] >= 0x21 && k->buf[i] <= 0x7e);
}

static bool is_key(struct span s)
{
    if (!s.base || s.len == 0 || s.len > IDEMKEY_MAX)
        return false;
    for (size_t i = 0; i < s.len; i++) {
        if (s.base[i] < 0x21 || s.base[i] > 0x7e)
            return false;
    }
    return true;
}

/* Runs keysource_json() on a heap copy of exactly <body.len> bytes (ASan sees
 * any read past it), and checks the copy is unchanged, the result one of the
 * documented ones, and <ret> untouched on failure. */
static int run_json(struct span body, const char *pointer, struct idemkey *ret)
{
    char *copy = malloc(body.len ? body.len : 1);
    struct idemkey k = { .len = 77 };
    int r;

    FUZZ_CHECK(copy != NULL);
    if (body.len)
        memcpy(copy, body.base, body.len);
    k.buf[0] = '#';
    r = keysource_json((struct span){ .base = copy, .len = body.len }, pointer, &k);
    FUZZ_CHECK(body.len == 0 || memcmp(copy, body.base, body.len) == 0);
    free(copy);
    FUZZ_CHECK(r == 0 || r == -ENOENT || r == -EINVAL || r == -ENOMEM);
    if (r == 0)
        check_key(&k);
    else
        FUZZ_CHECK(k.len == 77 && k.buf[0] == '#');
    *ret = k;
    return r;
}

static bool same_key(const struct idemkey *a, const struct idemkey *b)
{
    return a->len == b->len && memcmp(a->buf, b->buf, a->len) == 0;
}

/* <head> <body> <tail> and <head_ptr><pointer>: a body that parsed (its
 * result was 0 or -EINVAL) gives the same result one level down, reached by
 * an escaped member name or an array index. */
static void check_wrapped(struct span body, const char *pointer, const char *head, const char *tail,
                          const char *head_ptr, int r, const struct idemkey *k)
{
    size_t hl = strlen(head), tl = strlen(tail), pl = strlen(head_ptr), n = strlen(pointer);
    char *doc = malloc(hl + body.len + tl), *ptr = malloc(pl + n + 1);
    struct idemkey again;

    FUZZ_CHECK(doc && ptr);
    memcpy(doc, head, hl);
    if (body.len)
        memcpy(doc + hl, body.base, body.len);
    memcpy(doc + hl + body.len, tail, tl);
    memcpy(ptr, head_ptr, pl);
    memcpy(ptr + pl, pointer, n + 1);
    FUZZ_CHECK(keysource_pointer_check(ptr) == 0);
    FUZZ_CHECK(run_json((struct span){ .base = doc, .len = hl + body.len + tl }, ptr, &again) == r);
    FUZZ_CHECK(r != 0 || same_key(&again, k));
    free(doc);
    free(ptr);
}

/* The key found, written back as a JSON string (its '"' and '\' escaped), is
 * found again as the same key. */
static void check_reencoded(const struct idemkey *k)
{
    char doc[2 * IDEMKEY_MAX + 16];
    size_t n = 0;
    struct idemkey again;

    memcpy(doc, "{\"k\":\"", 6);
    n = 6;
    for (size_t i = 0; i < k->len; i++) {
        if (k->buf[i] == '"' || k->buf[i] == '\\')
            doc[n++] = '\\';
        doc[n++] = k->buf[i];
    }
    memcpy(doc + n, "\"}", 2);
    n += 2;
    FUZZ_CHECK(run_json((struct span){ .base = doc, .len = n }, "/k", &again) == 0);
    FUZZ_CHECK(same_key(&again, k));
}

static void check_json(struct span body, const char *pointer)
{
    struct idemkey k, again;
    int r = run_json(body, pointer, &k);
    size_t open = 0;

    FUZZ_CHECK(run_json(body, pointer, &again) == r); /* deterministic */
    FUZZ_CHECK(r != 0 || same_key(&again, &k));
    if (r == 0)
        check_reencoded(&k);
    if (r != 0 && r != -EINVAL)
        return; /* -ENOENT: not JSON or not found, which wrapping may change */
    for (size_t i = 0; i < body.len; i++)
        open += body.base[i] == '[' || body.base[i] == '{';
    if (open >= WRAP_MAX_OPEN)
        return;
    check_wrapped(body, pointer, "{\"a~b/c\":", "}", "/a~0b~1c", r, &k);
    check_wrapped(body, pointer, "{\"\":", "}", "/", r, &k);
    check_wrapped(body, pointer, "[0,1,2,3,4,5,6,7,8,9,", "]", "/10", r, &k);
}

/* The body's lines are the values: the join holds them, in order, one space
 * apart, exactly when each is a key. */
static void check_composite(struct span body)
{
    struct span v[8];
    size_t n = fuzz_split(body, '\n', v, ARRAY_SIZE(v)), len = 99, off = 0;
    char *keep = (char *)"untouched", *s = keep;
    bool all_keys = true;
    int r = keysource_composite(v, n, &s, &len);

    for (size_t i = 0; i < n; i++)
        all_keys = all_keys && is_key(v[i]);
    FUZZ_CHECK(r == 0 || r == -EINVAL || r == -ENOMEM);
    if (r != 0) {
        FUZZ_CHECK(s == keep && len == 99);
        FUZZ_CHECK(r == -ENOMEM || !all_keys);
        return;
    }
    FUZZ_CHECK(all_keys && s != keep && strlen(s) == len);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(memcmp(s + off, v[i].base, v[i].len) == 0);
        off += v[i].len;
        FUZZ_CHECK(s[off] == (i + 1 < n ? ' ' : '\0'));
        off++;
    }
    FUZZ_CHECK(off == len + 1);
    free(s);
}

/* The first line is the pointer (skipped unless keysource_pointer_check()
 * accepts it), the rest the body. Without a '\n' the whole input is the body
 * and the pointer is "". */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct span in = { .base = (const char *)data, .len = size }, parts[2];
    size_t n = fuzz_split(in, '\n', parts, ARRAY_SIZE(parts));
    struct span body = n == 2 ? parts[1] : in;
    char *pointer = fuzz_strdup(n == 2 ? parts[0] : (struct span){ .base = "", .len = 0 });
    int r = keysource_pointer_check(pointer);

    FUZZ_CHECK(r == 0 || r == -EINVAL);
    if (r == 0) {
        FUZZ_CHECK(pointer[0] == '\0' || pointer[0] == '/');
        check_json(body, pointer);
    }
    free(pointer);
    check_composite(body);
    return 0;
}
