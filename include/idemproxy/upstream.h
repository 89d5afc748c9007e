/* SPDX-License-Identifier: MIT */
/* Forwarding to the upstream: a libcurl multi handle driven by one event-loop
 * thread; connections kept alive and reused. Requests are handed over from
 * any thread; their callbacks run on the event loop's thread. */
#ifndef IDEMPROXY_UPSTREAM_H
#define IDEMPROXY_UPSTREAM_H

#include "idemproxy/common.h"

struct buf;
struct loop;
struct record;
struct upstream;

struct upstream_header {
    struct span name, value;
};

/* What to forward. Everything is borrowed and must stay valid until the
 * callback has run. */
struct upstream_request {
    struct span method;
    struct span target; /* raw request target, exactly as received: appended to the base URL */
    const struct upstream_header *headers; /* the client's headers, in order */
    size_t nheaders;
    struct span body;
    const char *client_ip; /* appended to X-Forwarded-For */
    const char *proto;     /* X-Forwarded-Proto: "http" */
};

/* Runs exactly once per accepted request, on the loop thread. <err> is 0
 * and <rec> the response (status, headers in order without hop-by-hop ones
 * and Content-Length, body; ownership of this reference passes to the
 * callback), or <err> is negative and <rec> NULL: -ECONNREFUSED (could not
 * connect), -ECONNRESET (reset, closed early, malformed answer), -ETIMEDOUT
 * (the whole exchange took longer than the timeout), -E2BIG (the body grew
 * past the capture limit), -ENOMEM. <elapsed_ms> is the time the exchange took. */
typedef void upstream_done_fn(void *ctx, int err, struct record *rec, uint64_t elapsed_ms);

struct upstream_options {
    const char *base_url;     /* scheme://host[:port][/prefix], no trailing '/' */
    uint64_t timeout_ms;      /* bounds the whole exchange */
    size_t max_capture_bytes; /* a response body past this fails with -E2BIG */
    unsigned max_connections; /* kept-alive connections to the upstream */
};

/* True when the raw request target <target> goes into the request line
 * exactly as received (CURLOPT_REQUEST_TARGET): it is in origin-form (starts
 * with '/') and holds no byte at or below 0x20 and no DEL. curl would
 * percent-encode the 8-bit bytes of a URL's path; any other target
 * (absolute-form, '*', control bytes) goes through the URL, where curl
 * rejects what it must. */
bool upstream_target_verbatim(struct span target);

/* The offset in <base_url> (scheme://host[:port][/prefix]) of its path
 * prefix: the first '/' past the authority, or its length when it has none. */
size_t upstream_prefix_at(struct span base_url);

/* Appends to <url> the URL curl is given for <target> on <base_url> (no
 * trailing '/'; its path prefix at <prefix_at>, from upstream_prefix_at()):
 * the two joined, then a NUL. When upstream_target_verbatim(<target>),
 * <ret_target_at> is the offset in <url> of the request line's target, the
 * path prefix and <target> running to that NUL; otherwise SIZE_MAX. Returns
 * 0, or -E2BIG past the limit of <url> or -ENOMEM (<url> unchanged,
 * <ret_target_at> untouched). */
int upstream_compose_url(struct span base_url, size_t prefix_at, struct span target,
                         struct buf *url, size_t *ret_target_at);

/* Creates the upstream client, run by <loop> (borrowed: it must outlive the
 * client; it must not be running yet). Returns 0 with it in <ret>, or a
 * negative errno. */
int upstream_new(const struct upstream_options *opt, struct loop *loop, struct upstream **ret);

/* Forwards <req>: method, raw target, end-to-end headers (hop-by-hop ones,
 * those named in Connection, Expect, Content-Length and the client's
 * X-Forwarded-Proto/-Host dropped), the client's Host unchanged,
 * X-Forwarded-For appended with req->client_ip, X-Forwarded-Proto and
 * X-Forwarded-Host (the client's Host) set, no Expect: 100-continue, body.
 * <req> and everything it points to are borrowed: they must stay unchanged
 * until <done> runs (the loop thread reads them when it starts the
 * transfer, and the body while sending it). Returns 0 when accepted (<done>
 * runs exactly once, never inside this call), or -ECANCELED once stopping,
 * -ENOMEM: <done> never runs. */
int upstream_submit(struct upstream *up, const struct upstream_request *req, upstream_done_fn *done,
                    void *ctx);

/* Finishes the transfers still running with -ECANCELED (their callbacks run,
 * on the loop thread while it runs), then frees. NULL-safe. */
void upstream_free(struct upstream *up);

#endif
