/* SPDX-License-Identifier: MIT */
/* A reconcile probe (doc/configuration.md, Reconcile): a client's key and
 * JSON body fill its target, and an API's answer is judged. Any bytes: the
 * target keeps the template's path and every byte of theirs is a %XX or an
 * unreserved byte that decodes back to them; the verdict is one of three. */
#include <string.h>

#include "fuzz.h"
#include "idemproxy/buf.h"
#include "idemproxy/http.h"
#include "idemproxy/reconcile.h"
#include "idemproxy/record.h"

static void check_expansion(struct span key, struct span body)
{
    struct buf out = BUF_INIT(SIZE_MAX);
    const char *why;
    char *dec = malloc(3 * key.len + 1);
    size_t dlen = 0;
    int r;

    FUZZ_CHECK(dec);
    r = reconcile_target_expand("/v1/p?r={key}", key, body, &out, &why);
    FUZZ_CHECK(r == 0 || r == -E2BIG || r == -ENOMEM);
    if (r == 0) {
        struct span q = { out.data + 8, out.len - 8 };

        FUZZ_CHECK(out.len >= 8 && memcmp(out.data, "/v1/p?r=", 8) == 0);
        FUZZ_CHECK(http_is_origin_form(buf_span(&out)));
        for (size_t i = 0; i < q.len; i++)
            FUZZ_CHECK(!memchr("/?#&=+", q.base[i], 6));
        FUZZ_CHECK(http_percent_decode(q, dec, &dlen) == 0 || memchr(key.base, 0, key.len));
        FUZZ_CHECK(memchr(key.base, 0, key.len) ||
                   (dlen == key.len && memcmp(dec, key.base, dlen) == 0));
    }
    buf_done(&out);
    r = reconcile_target_expand("/o/{body:/id}?k={key}", key, body, &out, &why);
    FUZZ_CHECK(r == 0 || r == -ENOENT || r == -E2BIG || r == -ENOMEM);
    if (r == 0)
        FUZZ_CHECK(memcmp(out.data, "/o/", 3) == 0 && http_is_origin_form(buf_span(&out)) &&
                   memchr(out.data + 3, '?', out.len - 3) == memchr(out.data, '?', out.len));
    buf_done(&out);
    free(dec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct span parts[2];
    size_t n = fuzz_split((struct span){ (const char *)data, size }, '\n', parts, 2);
    struct span key = parts[0], body = n > 1 ? parts[1] : (struct span){ "", 0 };
    struct reconcile_config c;
    struct record *ans = record_new(1 << 20), *kept = NULL;
    const char *why = NULL;
    int v;

    check_expansion(key, body);
    FUZZ_CHECK(ans);
    reconcile_config_init(&c);
    c.found = (struct reconcile_rule){ .status = { 200 }, .nstatus = 1, .pointer = "/data/0" };
    c.absent = (struct reconcile_rule){ .status = { 200 }, .nstatus = 1, .pointer = "/data/0" };
    ans->status = 200;
    FUZZ_CHECK(buf_append(&ans->body, body.base, body.len) == 0);
    v = reconcile_judge(&c, ans, 1 << 20, &kept, &why);
    FUZZ_CHECK(v == RECONCILE_FOUND || v == RECONCILE_ABSENT || v == RECONCILE_FAILED ||
               v == -ENOMEM);
    FUZZ_CHECK((v == RECONCILE_FOUND) == (kept != NULL));
    FUZZ_CHECK(v < 0 || why);
    record_unref(kept);
    record_unref(ans);
    return 0;
}
