/* SPDX-License-Identifier: MIT */
/* Not a test: canonjson_write() on standard input, for
 * test/integration/test_canonjson.py (which compares it with another
 * implementation) and for trying bodies by hand.
 *
 *   canonjson_cli [-b] [-d MAX_DEPTH] [-l OUT_LIMIT] [POINTER...]
 *
 * The POINTERs are removed (canonjson.h). Without -b standard input is one
 * body: prints its canonical form and a newline, or EINVAL, E2BIG or ENOMEM
 * and exits 1. With -b it is a batch of records "<decimal length>\n<bytes>":
 * prints one line per record, the same way (a canonical form holds no
 * newline byte), and exits 0. Exits 2 on a usage error or bad input framing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idemproxy/buf.h"
#include "idemproxy/canonjson.h"
#include "idemproxy/keysource.h"

static int usage(void)
{
    fprintf(stderr, "usage: canonjson_cli [-b] [-d MAX_DEPTH] [-l OUT_LIMIT] [POINTER...]\n");
    return 2;
}

static int read_all(struct buf *in)
{
    char chunk[65536];
    size_t n;

    while ((n = fread(chunk, 1, sizeof(chunk), stdin)) > 0) {
        if (buf_append(in, chunk, n) < 0)
            return -1;
    }
    return ferror(stdin) ? -1 : 0;
}

/* Prints the canonical form of <body>, or the error's name. Returns 0 or 1. */
static int one(struct span body, char **ptrs, size_t n, size_t depth, size_t limit)
{
    struct buf out = BUF_INIT(limit);
    int r = canonjson_write(body, (const char *const *)ptrs, n, depth, &out);

    if (r == 0) {
        if (out.len)
            fwrite(out.data, 1, out.len, stdout);
        fputc('\n', stdout);
    } else {
        puts(r == -EINVAL ? "EINVAL" : r == -E2BIG ? "E2BIG" : r == -ENOMEM ? "ENOMEM" : "ERROR");
    }
    buf_done(&out);
    return r == 0 ? 0 : 1;
}

static int batch(struct span in, char **ptrs, size_t n, size_t depth, size_t limit)
{
    while (in.len > 0) {
        const char *nl = memchr(in.base, '\n', in.len);
        char *end;
        unsigned long long len;

        if (!nl)
            return 2;
        len = strtoull(in.base, &end, 10);
        if (end != nl || len > in.len - (size_t)(nl - in.base) - 1)
            return 2;
        in.len -= (size_t)(nl - in.base) + 1;
        in.base = nl + 1;
        (void)one((struct span){ .base = in.base, .len = (size_t)len }, ptrs, n, depth, limit);
        in.base += len;
        in.len -= (size_t)len;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct buf in = BUF_INIT((size_t)1 << 30);
    size_t depth = 64, limit = (size_t)1 << 26;
    bool is_batch = false;
    int c, r;

    while ((c = getopt(argc, argv, "bd:l:")) != -1) {
        if (c == 'b')
            is_batch = true;
        else if (c == 'd')
            depth = strtoull(optarg, NULL, 10);
        else if (c == 'l')
            limit = strtoull(optarg, NULL, 10);
        else
            return usage();
    }
    for (int i = optind; i < argc; i++) {
        if (keysource_pointer_check(argv[i]) < 0) {
            fprintf(stderr, "canonjson_cli: '%s' is not a JSON pointer\n", argv[i]);
            return 2;
        }
    }
    if (read_all(&in) < 0) {
        fprintf(stderr, "canonjson_cli: cannot read standard input\n");
        return 2;
    }
    if (is_batch)
        r = batch(buf_span(&in), argv + optind, (size_t)(argc - optind), depth, limit);
    else
        r = one(buf_span(&in), argv + optind, (size_t)(argc - optind), depth, limit);
    if (r == 2)
        fprintf(stderr, "canonjson_cli: a record is not \"<length>\\n<bytes>\"\n");
    buf_done(&in);
    return r;
}
