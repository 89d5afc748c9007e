/* SPDX-License-Identifier: MIT */
/* What upstream.c (the exchanges on the loop) and upstream_request.c (what
 * an exchange sends, pure) share. */
#ifndef IDEMPROXY_UPSTREAM_IMPL_H
#define IDEMPROXY_UPSTREAM_IMPL_H

#include <string.h>

#include <curl/curl.h>

#include "idemproxy/buf.h"
#include "idemproxy/upstream.h"

/* Buffers reused from one request to the next (one set per loop). */
struct upstream_scratch {
    struct buf conn, xff, line;
};

/* Builds in <ret> the header list sent to the upstream for <req> (see
 * upstream_submit()), with <s>'s buffers. Returns 0, or -ENOMEM (nothing
 * in <ret>). */
int upstream_build_headers(const struct upstream_request *req, struct upstream_scratch *s,
                           struct curl_slist **ret);

/* Whether the method <s> is <lit> (methods are case-sensitive). */
static inline bool upstream_method_is(struct span s, const char *lit)
{
    size_t n = strlen(lit);

    return s.len == n && memcmp(s.base, lit, n) == 0;
}

#endif
