/* SPDX-License-Identifier: MIT */
/* Forwarding to the upstream, on one event loop's thread: over HTTP/1.1
 * connections of idemproxy's own for http:// (a keep-alive pool, answers
 * framed by libhttp-parser), or with libcurl's multi handle for https://
 * and when asked (doc/performance.md); connections kept alive and reused
 * either way. Requests are handed over from any thread; their callbacks run
 * on the event loop's thread. */
#ifndef IDEMPROXY_UPSTREAM_H
#define IDEMPROXY_UPSTREAM_H

#include "idemproxy/common.h"
#include "idemproxy/http.h"

struct buf;
struct flow;
struct loop;
struct record;
struct upstream;

/* Why an exchange failed, in words, filled before the callback runs with an
 * error (see upstream_done_fn). */
struct upstream_why {
    /* Static, a phrase for the client's problem detail and the log: "the
     * upstream's host name does not resolve"; NULL: none to give. */
    const char *cause;
    /* For the log only: curl's own words (a certificate's fault), or NULL;
     * owned by the caller once filled (free() it). */
    char *more;
};

/* The largest header block of an answer the proxy passes on (names, values
 * and their ": " and CRLF): as nginx's default proxy_buffer_size. It leaves
 * room in a client connection's memory for a request's header section of
 * 8 KiB beside it (front.c). A larger one fails the exchange with -E2BIG. */
#define UPSTREAM_HEAD_MAX 4096

/* What to forward. Everything is borrowed and must stay valid until the
 * callback has run. */
struct upstream_request {
    struct span method;
    /* The target in origin-form (checked: http_is_origin_form()), or "*": it
     * goes into the request line after the upstream's path prefix. */
    struct span target;
    /* The Host to send in place of the client's (absolute-form: its
     * authority), or base NULL to forward the client's Host unchanged. */
    struct span host;
    const struct http_header *headers; /* the client's headers, in order */
    size_t nheaders;
    struct span body;
    const char *client_ip; /* appended to X-Forwarded-For */
    const char *proto;     /* X-Forwarded-Proto: "http" or "https" */
    /* The request id (doc/operations.md, Metrics and access log): the client's
     * fields named <id_header> are replaced by one carrying <id>. <id_header>
     * empty: none. */
    struct span id_header;
    struct span id;
    /* With tracing on (doc/operations.md, Tracing): the client's traceparent
     * fields are replaced by one carrying this (its trace, the span of this
     * exchange); NULL: the client's go as they came. tracestate goes as it
     * came. */
    const char *traceparent;
    /* Optional: makes the exchange go on past a silence of the timeout, for
     * the late timeout (upstream_options), and runs once, on the loop
     * thread, when such a silence passes after the request was sent: the
     * caller answers its client then (or cuts its streamed answer), and the
     * callback still runs once at the exchange's end (doc/guarantees.md). */
    void (*overdue)(void *ctx);
    /* Optional: the answer streams (doc/guarantees.md, "Streaming"). When
     * its body does not come whole in the read that completed its head,
     * <head> runs once, on the loop thread, with the head in <rec> (a
     * reference passed over: status, headers as for upstream_done_fn, and
     * the body bytes read so far) and the announced body length in
     * <length> (FLOW_LENGTH_UNKNOWN: none); it sets <flow> and returns 0,
     * or returns -ENOMEM and the exchange ends with it. The rest of the
     * body is written to <flow> (borrowed until the callback has run), paused while it has
     * no room, and ended when nobody reads it any more and nothing is
     * copied (the client is gone). The callback then runs with <rec> NULL:
     * <err> 0 for a whole body, or negative when it was cut (as below;
     * -ETIMEDOUT for a silence past the timeout). Without <head>, or when
     * the body came whole with its head, the callback gets the whole
     * answer. */
    int (*head)(void *ctx, struct record *rec, uint64_t length);
    struct flow *flow;
    /* Optional: the body streams from here instead of <body> (borrowed
     * until the callback has run; its length, or FLOW_LENGTH_UNKNOWN:
     * chunked): read as the upstream takes it, curl's sending paused while
     * it is empty. A cut body ends the exchange. When the exchange ends the
     * flow's reader is gone (flow_reader_gone()): its writer drops the rest. */
    struct flow *body_flow;
    struct upstream_why *why; /* optional: filled when the exchange fails */
};

/* Runs exactly once per accepted request, on the loop thread. <err> is 0
 * and <rec> the response (status, headers in order without hop-by-hop ones
 * and Content-Length, body; ownership of this reference passes to the
 * callback), or <err> is negative and <rec> NULL. Whether a byte of the
 * request can have reached the upstream is known from what was written to
 * the connection, and told apart:
 * - nothing was written: -ECONNREFUSED (no connection: refused, a name that
 *   does not resolve, a failed TLS handshake, a reset before the request),
 *   -ENOTCONN (the connection was not up within the timeout), -ECANCELED
 *   (stopping), -ENOMEM;
 * - bytes of the request may have reached it (upstream_err_maybe_sent()):
 *   -ECONNRESET (reset, closed early or a malformed answer), -ETIMEDOUT (no
 *   complete answer within the timeout, and the late timeout with overdue),
 *   -ESHUTDOWN (cancelled, stopping);
 * - it answered: -E2BIG (the body grew past the capture limit, or its header
 *   block past UPSTREAM_HEAD_MAX). */
typedef void upstream_done_fn(void *ctx, int err, struct record *rec);

/* True when <err> (of upstream_done_fn) says that bytes of the request may
 * have reached the upstream, so that it may have run it. */
static inline bool upstream_err_maybe_sent(int err)
{
    return err == -ECONNRESET || err == -ETIMEDOUT || err == -ESHUTDOWN;
}

/* Which client carries the exchanges of an http:// upstream (https:// is
 * always libcurl's). */
enum upstream_client {
    UPSTREAM_CLIENT_OWN,
    UPSTREAM_CLIENT_CURL,
};

struct upstream_options {
    const char *base_url; /* scheme://host[:port][/prefix], no trailing '/' */
    enum upstream_client client;
    uint64_t timeout_ms;      /* bounds the wait for the answer's head and each silence after */
    uint64_t late_ms;         /* how much longer an exchange with overdue may stay silent */
    size_t max_capture_bytes; /* a response body past this fails with -E2BIG */
    unsigned max_connections; /* kept-alive connections to the upstream */
    /* https:// (doc/configuration.md, Recipes), borrowed: they must outlive the client. */
    const char *tls_ca_file;     /* the CAs that verify the upstream, NULL: the system's */
    const char *tls_cert_file;   /* a client certificate, NULL: none */
    const char *tls_key_file;    /* its key */
    const char *tls_server_name; /* the name verified and sent as SNI, NULL: the URL's host */
    bool tls_insecure;           /* no verification */
};

/* The fixed part of every upstream request, from --upstream: where to
 * connect, and the path prefix of every target. */
struct upstream_base {
    char *origin; /* owned: "scheme://host[:port]/", as libcurl's URL API rebuilt it */
    char *prefix; /* owned: the path prefix without its trailing '/', "" for none */
};

/* Parses the upstream URL <url> with libcurl's URL API: http or https, a
 * host, an optional port and path; no user info, query or fragment. Returns 0
 * with the parts in <ret> (free with upstream_base_done()), -EINVAL when <url>
 * is not such a URL (<ret> untouched), or -ENOMEM. Any thread. */
int upstream_base_parse(const char *url, struct upstream_base *ret);

/* Looks up the host of the upstream URL <url> (checked already) now, as
 * --check-config does: blocks on the resolver. Returns 0 when it resolves
 * (or is an address), else -ENOENT with the resolver's words in <why>. */
int upstream_base_resolve(const char *url, char *why, size_t why_len);

/* Frees what upstream_base_parse() filled. NULL-safe, idempotent. */
void upstream_base_done(struct upstream_base *b);

/* Appends to <out> the request line's target for the checked <target> (see
 * struct upstream_request) behind the path <prefix>: <prefix> then <target>;
 * for "*", "*" alone without a prefix and the prefix itself with one (an
 * OPTIONS of the whole API behind it); then a NUL. The client's bytes never
 * reach libcurl's URL parser: the connection goes to the base's origin, and
 * this is what curl sends as the target (CURLOPT_REQUEST_TARGET). Returns 0,
 * -EINVAL when <target> is neither "*" nor in origin-form (nothing appended),
 * or -E2BIG/-ENOMEM from <out> (nothing appended). */
int upstream_request_target(struct span prefix, struct span target, struct buf *out);

/* Creates the upstream client, run by <loop> (borrowed: it must outlive the
 * client; it must not be running yet). curl_global_init() must have been
 * called: main does, once, before any thread starts, and cleans up at exit.
 * Returns 0 with it in <ret>, or a negative errno. */
int upstream_new(const struct upstream_options *opt, struct loop *loop, struct upstream **ret);

/* Forwards <req>: method, raw target, end-to-end headers (hop-by-hop ones,
 * those named in Connection, Expect, Content-Length and the client's
 * X-Forwarded-Proto/-Host dropped), the client's Host unchanged,
 * X-Forwarded-For appended with req->client_ip, X-Forwarded-Proto and
 * X-Forwarded-Host (the Host sent) set, the request id set (req->id_header), no Expect:
 * 100-continue, body; to the origin of --upstream only, whatever the target. With req->host, the
 * client's Host fields are replaced by it.
 * <req> and everything it points to are borrowed: they must stay unchanged
 * until <done> runs (the loop thread reads them when it starts the
 * transfer, and the body while sending it). Returns 0 when accepted (<done>
 * runs exactly once, never inside this call), or -ECANCELED once stopping,
 * -ENOMEM: <done> never runs. */
int upstream_submit(struct upstream *up, const struct upstream_request *req, upstream_done_fn *done,
                    void *ctx);

/* SIGHUP: reads the TLS files of <up>'s options again (the CA file, the
 * client certificate and key) for the exchanges that start from now on;
 * those running keep theirs. Main thread, while its loop runs (waits for
 * it). Returns 1 when it did, 0 when <up> has no TLS file, or a negative
 * errno when one does not read (the files in use stay). */
int upstream_reload_tls(struct upstream *up);

/* Finishes the transfers still running with -ECANCELED (their callbacks run,
 * on the loop thread) and refuses new ones with -ECANCELED from then on; the
 * client stays usable as a handle until upstream_free(). Any thread; waits
 * for the loop to do it. NULL-safe. */
void upstream_cancel(struct upstream *up);

/* Finishes the transfers still running with -ECANCELED (their callbacks run,
 * on the loop thread while it runs), then frees. NULL-safe. */
void upstream_free(struct upstream *up);

#endif
