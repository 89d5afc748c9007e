/* SPDX-License-Identifier: MIT */
/* The libcurl client (https://, and http:// with --upstream-client curl),
 * on the event loop's thread, which owns the multi handle: it builds each
 * transfer (easy handle, header list, the record it fills), runs it with
 * curl's multi_socket API (curl's sockets are watched by the loop) and calls
 * back. Easy handles are reused, and everything a transfer allocates is
 * allocated and freed on the loop thread. */
#include "idemproxy/upstream.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>

#include <curl/curl.h>

#include "idemproxy/buf.h"
#include "idemproxy/flow.h"
#include "idemproxy/http.h"
#include "idemproxy/list.h"
#include "idemproxy/loop.h"
#include "idemproxy/record.h"

#include "upstream_impl.h"

#define UPSTREAM_SCRATCH_LIMIT (1u << 30) /* header lines come from MHD, already bounded */
#define UPSTREAM_IDLE_HANDLES 256         /* easy handles kept for reuse (~6 KiB each) */
/* libcurl's receive buffer, one per transfer (its default is 16 KiB): 1000
 * slow requests hold 1000 of them, and an API's answer mostly fits in one
 * read of this; a larger body takes more reads, each appended to the record
 * as it comes. */
#define UPSTREAM_RECV_BUFFER 2048

struct curl_client;

struct xfer {
    struct curl_client *up;
    const struct upstream_request *req; /* borrowed: outlives the transfer */
    CURL *easy;                         /* owned */
    struct curl_slist *hdrs;            /* owned; curl reads it until the transfer ends */
    struct record *rec;                 /* owned until handed to <done> */
    upstream_done_fn *done;
    void *ctx;
    int err;               /* why a callback aborted the transfer, or 0 */
    bool in_head;          /* between a status line and the blank line ending its header block */
    unsigned status;       /* of the last status line */
    bool head_done;        /* the final answer's header block is in */
    bool streaming;        /* its head went to req->head: the body goes to req->flow */
    bool paused;           /* the flow had no room: curl's receiving is paused */
    bool upload_paused;    /* the body flow had no bytes: curl's sending is paused */
    bool body_sent;        /* the body flow's end was sent */
    bool waking;           /* in up->wakes */
    size_t head_bytes;     /* of the final answer's header block, as the client will get it */
    bool may_resend;       /* a safe method: curl may retry it on a reused connection found dead */
    unsigned requests;     /* times curl was about to send the request */
    unsigned tls_gen;      /* the TLS files its handle was configured with (up->tls_gen) */
    struct list_node node; /* in the submit queue, then in the running list */
    struct upstream_watched watch; /* up->watchdog's, out of it while paused */
    struct list_node fresh_node;   /* in up->fresh: its head came in the current read */
    struct list_node wake_node;    /* in up->wakes: its flow woke it */
    const char *cause;             /* why it failed, when a callback or the loop knows best */
    bool refused;                  /* the upstream's TLS refused the handshake: nothing ran */
    char errbuf[CURL_ERROR_SIZE];  /* curl's words on a failure */
};

/* The TLS files' bytes: read at start and on SIGHUP, handed to libcurl as
 * blobs (it copies them), so that a file replaced with one that does not
 * load changes nothing until a reload that checks it. */
struct tls_blobs {
    struct curl_blob ca, cert, key; /* data NULL: not given */
};

struct curl_client {
    struct upstream pub;       /* first: upstream.c's part */
    CURLM *multi;              /* owned; loop thread only */
    struct loop *loop;         /* borrowed */
    struct upstream_base base; /* owned: where every transfer connects, and the path prefix */
    size_t max_capture_bytes;
    struct upstream_options tls;   /* the tls_* options, borrowed */
    struct tls_blobs blobs;        /* loop thread: the TLS files' bytes, as read last */
    unsigned tls_gen;              /* loop thread: how many times they were read again */
    struct curl_slist *connect_to; /* owned: --upstream-tls-server-name's "name:port:host:port" */

    /* Loop thread only: */
    struct list running;     /* struct xfer added to <multi> */
    struct loop_timer timer; /* curl's timer */
    struct upstream_watchdog watchdog;
    struct list fresh;            /* transfers whose head came in the current read */
    struct list wakes;            /* transfers whose flow woke them, for <wake_timer> */
    struct loop_timer wake_timer; /* runs them outside the flow's caller */
    CURL **idle;                  /* easy handles kept for reuse, <nidle> of them */
    size_t nidle;
    struct upstream_scratch scratch; /* reused */
    struct buf target, method;       /* scratch, reused */
};

/* Frees <x> and what it owns, keeping its easy handle for reuse; the handle
 * must be out of the multi. Loop thread only. NULL-safe. */
static void xfer_free(struct xfer *x)
{
    struct curl_client *up;

    if (!x)
        return;
    up = x->up;
    /* A streamed transfer may end paused or cut mid-body: its handle is not
     * trusted to start the next one clean. */
    if (x->easy && !x->streaming && !x->req->body_flow && up->nidle < UPSTREAM_IDLE_HANDLES &&
        up->idle && x->tls_gen == up->tls_gen) { /* a handle of older TLS files goes */
        up->idle[up->nidle++] = x->easy;         /* configured still: see configure() */
    } else {
        curl_easy_cleanup(x->easy);
    }
    if (x->req->body_flow)
        flow_set_reader(x->req->body_flow, NULL, NULL); /* it may not have started */
    curl_slist_free_all(x->hdrs);
    record_unref(x->rec);
    upstream_watch_stop(&x->watch);
    list_remove(&x->fresh_node);
    list_remove(&x->wake_node);
    free(x);
}

/* True when curl wrote bytes of the request to a connection: the upstream
 * may have read them. */
static bool xfer_wrote(const struct xfer *x)
{
    long n = 0;

    return x->easy && curl_easy_getinfo(x->easy, CURLINFO_REQUEST_SIZE, &n) == CURLE_OK && n > 0;
}

static void tell_why(struct xfer *x, int err);

/* Hands the outcome to the callback and frees <x>. The easy handle goes
 * first, so nothing reads the borrowed request once <done> may free it. */
static void xfer_finish(struct xfer *x, int err)
{
    upstream_done_fn *done = x->done;
    void *ctx = x->ctx;
    struct record *rec = NULL;

    if (x->streaming)
        flow_set_writer(x->req->flow, NULL, NULL); /* the flow outlives the transfer */
    if (x->req->body_flow) { /* nobody reads the rest of the body: its writer drops it */
        flow_set_reader(x->req->body_flow, NULL, NULL);
        flow_reader_gone(x->req->body_flow);
    }
    if (err == 0 && x->streaming) {
        /* the body went to the flow */
    } else if (err == 0) {
        long code = 0;

        if (curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK || code < 100 ||
            code > 999) {
            err = -ECONNRESET;
        } else {
            rec = x->rec;
            x->rec = NULL;
            rec->status = (unsigned)code;
            record_filter_hop_by_hop(rec);
        }
    }
    if (err < 0) {
        err = upstream_failure(err, xfer_wrote(x) && !x->refused);
        tell_why(x, err);
    }
    xfer_free(x);
    done(ctx, err, rec);
}

/* Whether curl's words <errbuf> tell of a TLS alert that only a handshake
 * sends: the upstream's TLS refused the client (its certificate, most
 * often). With TLS 1.3 the client's handshake ends before the server has
 * checked its certificate, so curl has written the request when the alert
 * comes; but a server that refuses the handshake never reads it. */
static bool handshake_refused(const char *errbuf)
{
    static const char *const alerts[] = {
        "alert certificate required",    "alert bad certificate",     "alert unknown ca",
        "alert certificate unknown",     "alert certificate revoked", "alert certificate expired",
        "alert unsupported certificate", "alert access denied",       "alert handshake failure",
    };

    for (size_t i = 0; i < ARRAY_SIZE(alerts); i++) {
        if (strstr(errbuf, alerts[i]))
            return true;
    }
    return false;
}

/* The errno of a finished transfer (see upstream_done_fn, before
 * failure()), and in <x->cause> what failed, in words. */
static int map_curl_error(struct xfer *x, CURLcode cc)
{
    long os = 0;
    curl_off_t connected = 0;

    if (x->err)
        return x->err; /* a callback aborted the transfer and said why */
    switch (cc) {
    case CURLE_OK:
        return 0;
    case CURLE_OPERATION_TIMEDOUT:
        (void)curl_easy_getinfo(x->easy, CURLINFO_CONNECT_TIME_T, &connected);
        x->cause = connected == 0  ? "no connection to the upstream within --upstream-timeout"
                   : xfer_wrote(x) ? "no answer from the upstream within --upstream-timeout"
                                   : "the TLS handshake with the upstream did not finish within "
                                     "--upstream-timeout";
        return -ETIMEDOUT;
    case CURLE_COULDNT_RESOLVE_HOST:
        x->cause = "the upstream's host name does not resolve";
        return -ECONNREFUSED;
    case CURLE_COULDNT_CONNECT:
        (void)curl_easy_getinfo(x->easy, CURLINFO_OS_ERRNO, &os);
        x->cause = os == ECONNREFUSED ? "the upstream refused the connection"
                   : os == ENETUNREACH || os == EHOSTUNREACH
                       ? "the upstream's address is unreachable"
                       : "could not connect to the upstream";
        return -ECONNREFUSED;
    case CURLE_PEER_FAILED_VERIFICATION:
        x->cause = "the upstream's TLS certificate failed verification";
        return -ECONNREFUSED;
    case CURLE_SSL_CONNECT_ERROR:
        x->cause = "the TLS handshake with the upstream failed";
        return -ECONNREFUSED; /* the request never left */
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ENGINE_INITFAILED:
        x->cause = "the proxy's TLS files for the upstream could not be used";
        return -ECONNREFUSED;
    case CURLE_OUT_OF_MEMORY:
        return -ENOMEM;
    case CURLE_GOT_NOTHING:
        x->cause = "the upstream closed the connection without an answer";
        return -ECONNRESET;
    case CURLE_PARTIAL_FILE:
        x->cause = "the upstream closed the connection before the whole answer";
        return -ECONNRESET;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
        if (handshake_refused(x->errbuf)) {
            x->cause = "the upstream refused the TLS handshake";
            x->refused = true;
            return -ECONNREFUSED;
        }
        x->cause = xfer_wrote(x) ? "the upstream reset the connection after the request was sent"
                                 : "the upstream reset the connection before the request was sent";
        return -ECONNRESET;
    default:
        x->cause = "the upstream's answer is malformed";
        return -ECONNRESET; /* a bad reply, or one curl cannot read */
    }
}

/* Fills the request's upstream_why, when it asked, for the failure <err>. */
static void tell_why(struct xfer *x, int err)
{
    upstream_tell_why(x->req->why, err, x->cause, x->errbuf);
}

/* Bytes came for <x> (or it starts, or resumes). */
static void watch_touch(struct xfer *x) { upstream_watch_touch(&x->up->watchdog, &x->watch); }

/* What a silence past its timeout means for <x>, in words. */
static const char *timeout_cause(struct xfer *x)
{
    curl_off_t connected = 0;

    if (x->streaming)
        return x->watch.late
                   ? "the upstream's answer stopped for longer than --upstream-late-timeout"
                   : "the upstream's answer stopped for longer than --upstream-timeout";
    if (xfer_wrote(x))
        return x->watch.late ? "no answer from the upstream within --upstream-late-timeout either"
                             : "no answer from the upstream within --upstream-timeout";
    (void)curl_easy_getinfo(x->easy, CURLINFO_CONNECT_TIME_T, &connected);
    return connected == 0 ? "no connection to the upstream within --upstream-timeout"
                          : "the TLS handshake with the upstream did not finish within "
                            "--upstream-timeout";
}

/* One raw response header line. A status line starts a new response: the
 * headers of an interim 1xx answer must not reach the record. Lines after the
 * final header block are trailers, dropped. */
static size_t header_cb(char *data, size_t size, size_t n, void *userdata)
{
    struct xfer *x = userdata;
    size_t total = size * n, len = total;
    struct span name, value;
    int r;

    watch_touch(x);
    if (!x->rec)
        return total; /* a streamed answer's trailers (its record went with its head): dropped */
    if (len > 0 && data[len - 1] == '\n') {
        len--;
        if (len > 0 && data[len - 1] == '\r')
            len--;
    }
    if (len >= 5 && memcmp(data, "HTTP/", 5) == 0) {
        unsigned status;

        if (http_parse_status_line((struct span){ .base = data, .len = len }, &status) < 0)
            goto malformed; /* curl would take it for a 200 */
        if (x->rec->nheaders > 0) {
            struct record *fresh = record_new(x->up->max_capture_bytes);

            if (!fresh) {
                x->err = -ENOMEM;
                return 0;
            }
            record_unref(x->rec);
            x->rec = fresh;
        }
        x->in_head = true;
        x->head_bytes = 0;
        x->status = status;
        return total;
    }
    if (len == 0) {
        /* The final answer's head is in (not an interim 1xx one): with a
         * streamed answer it goes out once this read is over, unless the
         * whole answer came with it. */
        if (x->in_head && x->status >= 200 && !x->head_done && x->req->head) {
            x->head_done = true;
            list_append(&x->up->fresh, &x->fresh_node);
        }
        x->in_head = false;
        return total;
    }
    if (!x->in_head)
        return total;

    if (http_parse_field_line((struct span){ .base = data, .len = len }, &name, &value) < 0)
        goto malformed;
    x->head_bytes += name.len + value.len + 4;
    if (x->head_bytes > UPSTREAM_HEAD_MAX) {
        x->cause = "the upstream's answer has a header block larger than the proxy passes on";
        x->err = -E2BIG; /* it answered: completed with the too-large marker */
        return 0;
    }
    r = record_add_header(x->rec, name, value);
    if (r < 0) {
        x->err = r; /* -E2BIG: more headers than a record may keep */
        return 0;
    }
    return total;

malformed:
    x->cause = "the upstream's answer is malformed";
    x->err = -ECONNRESET;
    return 0;
}

static size_t write_cb(char *data, size_t size, size_t n, void *userdata)
{
    struct xfer *x = userdata;
    curl_off_t expect = -1;
    int r;

    if (x->streaming) {
        struct flow *f = x->req->flow;

        if (!flow_wants_bytes(f)) {
            x->cause = "the client went away";
            x->err = -ECANCELED;
            return 0; /* nobody reads and nothing is kept: the upstream's connection is closed */
        }
        if (x->req->body_flow && !x->body_sent) {
            /* No answer goes out before the client's body is in (libmicrohttpd): a
             * pause could stop the upstream reading it. Held, up to the capture limit. */
            if (f->q.len - f->off + size * n > x->up->max_capture_bytes) {
                x->cause = "the upstream's answer outgrew what the proxy holds while the "
                           "request's body was still being sent";
                x->err = -E2BIG;
                return 0;
            }
            flow_push(f, data, size * n);
        } else if (size * n > 0 && flow_write(f, data, size * n) == 0) {
            /* The client reads slower than the upstream sends: curl keeps
             * these bytes and stops reading until the flow has room. */
            upstream_watch_stop(&x->watch);
            x->paused = true;
            return CURL_WRITEFUNC_PAUSE;
        }
        watch_touch(x);
        return size * n;
    }
    watch_touch(x);
    /* A body of announced length gets its whole buffer at once: no realloc
     * while it arrives, and a stored record holds no spare capacity. */
    if (x->rec->body.cap == 0 &&
        curl_easy_getinfo(x->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &expect) == CURLE_OK &&
        expect > 0 && buf_reserve(&x->rec->body, (size_t)expect) < 0) {
        x->err = -ENOMEM;
        return 0;
    }
    r = buf_append(&x->rec->body, data, size * n);

    if (r < 0) {
        x->err = r; /* -E2BIG past the capture limit, or -ENOMEM */
        return 0;
    }
    return size * n;
}

/* A streamed request body: curl takes what the flow has, pauses its sending
 * while it has none (the client is slow: not a silence of the upstream, so
 * the watchdog stops meanwhile), and ends the exchange when it was cut. */
static size_t read_cb(char *buf, size_t size, size_t n, void *userdata)
{
    struct xfer *x = userdata;
    ssize_t r = flow_read(x->req->body_flow, buf, size * n);

    if (r > 0) {
        watch_touch(x);
        return (size_t)r;
    }
    if (r == FLOW_END) {
        x->body_sent = true;
        watch_touch(x); /* the wait for the answer starts */
        return 0;
    }
    if (r == FLOW_CUT) {
        x->cause = "the request body did not come whole from the client";
        x->err = -ECANCELED;
        return CURL_READFUNC_ABORT;
    }
    upstream_watch_stop(&x->watch);
    x->upload_paused = true;
    return CURL_READFUNC_PAUSE;
}

/* Runs before curl sends the request. A second call means curl is retrying it
 * on a fresh connection after a reused one died: only a safe method may be
 * sent twice, the proxy never re-sends anything else on its own, unless not
 * one byte of it was written to the dead connection (found dead on send). */
static int prereq_cb(void *userdata, char *primary_ip, char *local_ip, int primary_port,
                     int local_port)
{
    struct xfer *x = userdata;

    (void)primary_ip;
    (void)local_ip;
    (void)primary_port;
    (void)local_port;
    if (++x->requests > 1 && !x->may_resend && xfer_wrote(x)) {
        x->err = -ECONNRESET;
        return CURL_PREREQFUNC_ABORT;
    }
    return CURL_PREREQFUNC_OK;
}

/* Sets every option of <x>'s easy handle for <req>. */
/* Sets <opt> on the easy handle <e> unless an earlier one failed (<cc>). */
#define SET(opt, val)                                                                              \
    do {                                                                                           \
        if (cc == CURLE_OK) {                                                                      \
            cc = curl_easy_setopt(e, opt, val);                                                    \
        }                                                                                          \
    } while (0)

/* The method (<method>, NUL-terminated) and the body of <req> on <x>'s
 * handle: none for HEAD and a bodiless GET, a streamed one from the body
 * flow (its Content-Length, or chunked), else the buffered one. */
static CURLcode setup_body(struct xfer *x, const struct upstream_request *req, const char *method)
{
    CURL *e = x->easy;
    CURLcode cc = CURLE_OK;

    /* The handle's last transfer may have set another method and body:
     * back to a plain GET first (no body, no upload, no custom method). Its
     * body's pointer goes first: HTTPGET keeps it, and it wins over a read
     * callback (setting it says POST: HTTPGET comes after). */
    SET(CURLOPT_POSTFIELDS, (char *)NULL);
    SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)-1);
    SET(CURLOPT_HTTPGET, 1L);
    SET(CURLOPT_CUSTOMREQUEST, (char *)NULL);
    if (upstream_method_is(req->method, "HEAD")) {
        SET(CURLOPT_NOBODY, 1L);
    } else if (upstream_method_is(req->method, "GET") && req->body.len == 0 && !req->body_flow) {
        /* as it is */
    } else if (req->body_flow) {
        uint64_t len = req->body_flow->length;

        SET(CURLOPT_CUSTOMREQUEST, method);
        SET(CURLOPT_POST, 1L);
        SET(CURLOPT_READFUNCTION, read_cb);
        SET(CURLOPT_READDATA, x);
        SET(CURLOPT_POSTFIELDSIZE_LARGE,
            len == FLOW_LENGTH_UNKNOWN || len > INT64_MAX ? (curl_off_t)-1 : (curl_off_t)len);
    } else {
        SET(CURLOPT_CUSTOMREQUEST, method);
        if (req->body.len > 0 || upstream_method_is(req->method, "POST") ||
            upstream_method_is(req->method, "PUT") || upstream_method_is(req->method, "PATCH")) {
            /* Borrowed, not copied: the request outlives the transfer. An
             * empty body still sends Content-Length: 0. */
            SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body.len);
            SET(CURLOPT_POSTFIELDS, req->body.base ? req->body.base : "");
        }
    }
    return cc;
}

/* What every transfer of <up> sets alike, once per easy handle: it keeps
 * them from one transfer to the next (no curl_easy_reset()). */
static int configure(struct curl_client *up, CURL *e)
{
    CURLcode cc = CURLE_OK;
    long connect = up->watchdog.timeout_ms > LONG_MAX ? LONG_MAX : (long)up->watchdog.timeout_ms;

    /* The URL is the fixed origin, parsed once at start-up: it says where to
     * connect and nothing else. The request line's target is given as is. */
    SET(CURLOPT_URL, up->base.origin);
    SET(CURLOPT_PROTOCOLS_STR, "http,https");
    SET(CURLOPT_PATH_AS_IS, 1L);
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_PROXY, ""); /* never a proxy from http_proxy and friends */
    SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    SET(CURLOPT_HTTP_CONTENT_DECODING, 0L); /* the body goes back byte for byte */
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
    SET(CURLOPT_BUFFERSIZE, (long)UPSTREAM_RECV_BUFFER);
    /* No CURLOPT_TIMEOUT_MS: --upstream-timeout bounds each silence, not the
     * exchange (the watchdog: watch_touch()). */
    SET(CURLOPT_CONNECTTIMEOUT_MS, connect);
    SET(CURLOPT_HEADERFUNCTION, header_cb);
    SET(CURLOPT_WRITEFUNCTION, write_cb);
    SET(CURLOPT_PREREQFUNCTION, prereq_cb);
    if (up->blobs.ca.data)
        SET(CURLOPT_CAINFO_BLOB, &up->blobs.ca);
    if (up->blobs.cert.data) {
        SET(CURLOPT_SSLCERT_BLOB, &up->blobs.cert);
        SET(CURLOPT_SSLKEY_BLOB, &up->blobs.key);
    }
    if (up->tls.tls_insecure) {
        SET(CURLOPT_SSL_VERIFYPEER, 0L);
        SET(CURLOPT_SSL_VERIFYHOST, 0L);
    }
    if (up->connect_to)
        SET(CURLOPT_CONNECT_TO, up->connect_to);
    return cc == CURLE_OK ? 0 : -ENOMEM;
}

/* What is <x>'s own on its handle (configured already): the target, the
 * fields, the callbacks' data, the method and the body. */
static int setup_easy(struct curl_client *up, struct xfer *x, const struct upstream_request *req)
{
    CURL *e = x->easy;
    struct buf *target = &up->target, *method = &up->method;
    CURLcode cc = CURLE_OK;
    int r;

    target->len = method->len = 0;
    r = upstream_request_target(span_from_cstr(up->base.prefix), req->target, target);
    if (r < 0)
        return r;
    if (buf_append(method, req->method.base, req->method.len) < 0 || buf_append(method, "", 1) < 0)
        return -ENOMEM;
    SET(CURLOPT_PRIVATE, x);
    SET(CURLOPT_REQUEST_TARGET, target->data);
    SET(CURLOPT_HTTPHEADER, x->hdrs);
    SET(CURLOPT_HEADERDATA, x);
    SET(CURLOPT_WRITEDATA, x);
    SET(CURLOPT_PREREQDATA, x);
    SET(CURLOPT_ERRORBUFFER, x->errbuf);
    if (cc == CURLE_OK)
        cc = setup_body(x, req, method->data);
    x->may_resend =
        upstream_method_is(req->method, "GET") || upstream_method_is(req->method, "HEAD") ||
        upstream_method_is(req->method, "OPTIONS") || upstream_method_is(req->method, "TRACE");
    return cc == CURLE_OK ? 0 : -ENOMEM; /* curl copied the strings */
}
#undef SET

static int xfer_start(struct curl_client *up, struct xfer *x);
static void on_flow_wake(void *ctx);

static int client_start(struct upstream *pub, const struct upstream_request *req,
                        upstream_done_fn *done, void *ctx)
{
    struct curl_client *up = (struct curl_client *)pub;
    struct xfer *x = calloc(1, sizeof(*x));
    int err;

    if (!x)
        return -ENOMEM;
    x->up = up;
    x->req = req;
    x->done = done;
    x->ctx = ctx;
    x->watch.req = req;
    x->watch.ctx = ctx;
    /* No callback can come from inside: curl reports in a later turn. */
    err = xfer_start(up, x);
    if (err < 0) {
        xfer_free(x);
        return err;
    }
    list_append(&up->running, &x->node);
    return 0;
}

/* Builds the transfer of <x> (loop thread) and adds it to the multi handle. */
static int xfer_start(struct curl_client *up, struct xfer *x)
{
    int r;

    x->tls_gen = up->tls_gen; /* the idle handles are all of the files read last */
    if (up->nidle) {
        x->easy = up->idle[--up->nidle];
    } else {
        x->easy = curl_easy_init();
        if (x->easy && configure(up, x->easy) < 0) {
            curl_easy_cleanup(x->easy); /* never kept half configured */
            x->easy = NULL;
        }
    }
    x->rec = record_new(up->max_capture_bytes);
    if (!x->easy || !x->rec)
        return -ENOMEM;
    r = upstream_build_headers(x->req, &up->scratch, &x->hdrs);
    if (r == 0)
        r = setup_easy(up, x, x->req);
    if (r == 0 && x->req->body_flow)
        flow_set_reader(x->req->body_flow, on_flow_wake, x);
    if (r == 0 && curl_multi_add_handle(up->multi, x->easy) != CURLM_OK)
        r = -ENOMEM;
    if (r == 0)
        watch_touch(x);
    return r;
}

/* Ends <x> for a silence past its timeout: what it says is <cause>. */
static void time_out(void *ctx, struct upstream_watched *w)
{
    struct curl_client *up = ctx;
    struct xfer *x = list_entry(w, struct xfer, watch);

    x->cause = timeout_cause(x);
    (void)curl_multi_remove_handle(up->multi, x->easy);
    list_remove(&x->node);
    xfer_finish(x, -ETIMEDOUT);
}

static bool wrote(void *ctx, struct upstream_watched *w)
{
    (void)ctx;
    return xfer_wrote(list_entry(w, struct xfer, watch));
}

/* The flow of <x> woke it (loop thread, inside the flow's caller): it is
 * run from the wake timer, outside. */
static void on_flow_wake(void *ctx)
{
    struct xfer *x = ctx;
    struct curl_client *up = x->up;

    if (x->waking)
        return;
    x->waking = true;
    list_append(&up->wakes, &x->wake_node);
    up->wake_timer.due_ms = 0;
}

/* Hands the heads that came in the last read to their requests: those
 * transfers still run, so their answers stream (the others got their whole
 * answer through <done> already). Runs after every curl call that may read. */
static void tell_heads(struct curl_client *up)
{
    struct list_node *n;

    while ((n = list_first(&up->fresh))) {
        struct xfer *x = list_entry(n, struct xfer, fresh_node);
        curl_off_t length = -1;
        struct record *rec = x->rec;

        list_remove(n);
        (void)curl_easy_getinfo(x->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
        x->rec = NULL;
        rec->status = x->status;
        record_filter_hop_by_hop(rec);
        if (x->req->head(x->ctx, rec, length >= 0 ? (uint64_t)length : FLOW_LENGTH_UNKNOWN) < 0) {
            (void)curl_multi_remove_handle(up->multi, x->easy);
            list_remove(&x->node);
            xfer_finish(x, -ENOMEM);
            continue;
        }
        x->streaming = true;
        flow_set_writer(x->req->flow, on_flow_wake, x);
    }
}

static void drain_done(struct curl_client *up);

/* The transfers whose flow woke them: a paused one resumes once its flow
 * has room; one whose flow wants no more bytes (the client is gone, nothing
 * is kept) ends, and its connection with it. */
static void on_wakes(void *ctx)
{
    struct curl_client *up = ctx;
    struct list_node *n;

    up->wake_timer.due_ms = UINT64_MAX;
    while ((n = list_first(&up->wakes))) {
        struct xfer *x = list_entry(n, struct xfer, wake_node);

        list_remove(n);
        x->waking = false;
        if (x->streaming && !flow_wants_bytes(x->req->flow)) {
            x->cause = "the client went away";
            (void)curl_multi_remove_handle(up->multi, x->easy);
            list_remove(&x->node);
            xfer_finish(x, -ECANCELED);
        } else if (x->paused || x->upload_paused) {
            /* Either flow woke it: both directions go on, and one that still
             * cannot pauses again in its callback. */
            x->paused = x->upload_paused = false;
            watch_touch(x);
            (void)curl_easy_pause(x->easy, CURLPAUSE_CONT); /* may read or write at once */
        }
    }
    drain_done(up);
    tell_heads(up);
}

/* Reports every transfer curl has finished. */
static void drain_done(struct curl_client *up)
{
    CURLMsg *msg;
    int left;

    while ((msg = curl_multi_info_read(up->multi, &left))) {
        struct xfer *x = NULL;
        CURLcode cc = msg->data.result;

        if (msg->msg != CURLMSG_DONE)
            continue;
        (void)curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        (void)curl_multi_remove_handle(up->multi, x->easy); /* <msg> is invalid from here */
        list_remove(&x->node);
        xfer_finish(x, map_curl_error(x, cc));
    }
}

/* One socket curl wants watched. */
struct sock {
    struct loop_watch watch;
    struct curl_client *up;
};

static void on_sock_events(void *ctx, uint32_t events)
{
    struct sock *sk = ctx;
    struct curl_client *up = sk->up;
    int flags = 0, still;

    if (events & EPOLLIN)
        flags |= CURL_CSELECT_IN;
    if (events & EPOLLOUT)
        flags |= CURL_CSELECT_OUT;
    if (events & (EPOLLERR | EPOLLHUP))
        flags |= CURL_CSELECT_ERR;
    (void)curl_multi_socket_action(up->multi, sk->watch.fd, flags, &still); /* may free <sk> */
    drain_done(up);
    tell_heads(up);
}

/* curl's socket callback: keeps the loop's epoll set in step with the sockets
 * curl wants watched, so that only sockets with events are looked at. */
static int on_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    struct curl_client *up = userp;
    struct sock *sk = socketp;
    uint32_t events = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);

    (void)easy;
    if (what == CURL_POLL_REMOVE) {
        if (sk) {
            loop_watch_del(up->loop, &sk->watch); /* the fd may be closed already */
            (void)curl_multi_assign(up->multi, fd, NULL);
            free(sk);
        }
        return 0;
    }
    if (sk)
        return loop_watch_mod(up->loop, &sk->watch, events) < 0 ? -1 : 0;
    sk = malloc(sizeof(*sk));
    if (!sk)
        return -1;
    *sk = (struct sock){ .watch = { .fn = on_sock_events, .ctx = sk, .fd = fd }, .up = up };
    if (loop_watch_add(up->loop, &sk->watch, events) < 0) {
        free(sk);
        return -1;
    }
    (void)curl_multi_assign(up->multi, fd, sk);
    return 0;
}

/* curl's timer callback: when it next wants CURL_SOCKET_TIMEOUT. */
static int on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    struct curl_client *up = userp;

    (void)multi;
    up->timer.due_ms = timeout_ms < 0 ? UINT64_MAX : now_ms() + (uint64_t)timeout_ms;
    return 0;
}

static void on_timer_due(void *ctx)
{
    struct curl_client *up = ctx;
    int still;

    (void)curl_multi_socket_action(up->multi, CURL_SOCKET_TIMEOUT, 0, &still);
    drain_done(up);
    tell_heads(up);
}

/* Ends every transfer with -ECANCELED and lets the sockets go. */
static void client_stop(struct upstream *pub)
{
    struct curl_client *up = (struct curl_client *)pub;
    struct list_node *n;

    if (!up->multi)
        return;
    while ((n = list_first(&up->running))) {
        struct xfer *x = list_entry(n, struct xfer, node);

        list_remove(n);
        (void)curl_multi_remove_handle(up->multi, x->easy);
        xfer_finish(x, -ECANCELED);
    }
    curl_multi_cleanup(up->multi); /* its sockets leave the loop */
    up->multi = NULL;
    loop_timer_del(up->loop, &up->timer);
    upstream_watchdog_done(&up->watchdog, up->loop);
    loop_timer_del(up->loop, &up->wake_timer);
}

/* --upstream-tls-server-name: the origin's host becomes <name>, which curl
 * sends as SNI and verifies in the certificate (and sends as Host when the
 * client sent none), and the connection still goes to the URL's host and
 * port ("name:port:host:port"). */
static int use_server_name(struct curl_client *up, const char *name)
{
    CURLU *u = curl_url();
    char *host = NULL, *port = NULL, *origin = NULL, line[600];
    struct curl_slist *l;
    int r = -ENOMEM;

    if (!u)
        return -ENOMEM;
    if (curl_url_set(u, CURLUPART_URL, up->base.origin, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
        curl_url_set(u, CURLUPART_HOST, name, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_URL, &origin, 0) != CURLUE_OK)
        goto out;
    if ((size_t)snprintf(line, sizeof(line), "%s:%s:%s:%s", name, port, host, port) >=
        sizeof(line)) {
        r = -EINVAL;
        goto out;
    }
    l = curl_slist_append(NULL, line);
    if (!l)
        goto out;
    up->connect_to = l;
    free(up->base.origin);
    up->base.origin = strdup(origin);
    r = up->base.origin ? 0 : -ENOMEM;
out:
    curl_free(host);
    curl_free(port);
    curl_free(origin);
    curl_url_cleanup(u);
    return r;
}

/* ---- the TLS files ---- */

#define TLS_FILE_MAX (4u << 20) /* a CA bundle of a few hundred certificates fits */

/* The whole of <path> into <b> (NULL <path>: left empty). */
static int blob_read(const char *path, struct curl_blob *b)
{
    FILE *fp;
    struct stat sb;
    int err;

    *b = (struct curl_blob){ .flags = CURL_BLOB_COPY };
    if (!path)
        return 0;
    if (!(fp = fopen(path, "re")))
        return -errno;
    err = fstat(fileno(fp), &sb) < 0 ? -errno : sb.st_size > TLS_FILE_MAX ? -E2BIG : 0;
    if (err == 0 && !(b->data = malloc((size_t)sb.st_size + 1)))
        err = -ENOMEM;
    if (err == 0) {
        b->len = fread(b->data, 1, (size_t)sb.st_size, fp);
        err = ferror(fp) ? -EIO : 0;
    }
    fclose(fp);
    return err;
}

static void blobs_done(struct tls_blobs *t)
{
    struct curl_blob *all[] = { &t->ca, &t->cert, &t->key };

    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        if (all[i]->data)
            explicit_bzero(all[i]->data, all[i]->len);
        free(all[i]->data);
        all[i]->data = NULL;
    }
}

/* The files of <opt> (checked at start, or by the reload's check). */
static int blobs_read(const struct upstream_options *opt, struct tls_blobs *t)
{
    int err = blob_read(opt->tls_ca_file, &t->ca);

    if (err == 0)
        err = blob_read(opt->tls_cert_file, &t->cert);
    if (err == 0)
        err = blob_read(opt->tls_key_file, &t->key);
    if (err < 0)
        blobs_done(t);
    return err;
}

struct tls_swap {
    struct curl_client *up;
    struct tls_blobs blobs;
};

/* Loop thread: the new bytes in place; the handles kept idle were configured
 * with the old ones, so they go, and so do those running now when they end
 * (a running transfer keeps its own till then). */
static void swap_blobs(void *ctx)
{
    struct tls_swap *s = ctx;
    struct tls_blobs old = s->up->blobs;

    s->up->blobs = s->blobs;
    s->blobs = old;
    s->up->tls_gen++; /* the handles running now are not kept when they end */
    while (s->up->nidle)
        curl_easy_cleanup(s->up->idle[--s->up->nidle]);
}

static int client_reload_tls(struct upstream *pub)
{
    struct curl_client *up = (struct curl_client *)(void *)pub;
    struct tls_swap s = { .up = up };
    int err;

    if (!up->tls.tls_ca_file && !up->tls.tls_cert_file)
        return 0;
    if ((err = blobs_read(&up->tls, &s.blobs)) < 0)
        return err;
    loop_call(up->loop, swap_blobs, &s);
    blobs_done(&s.blobs);
    return 1;
}

static void client_free(struct upstream *pub)
{
    struct curl_client *up = (struct curl_client *)pub;

    if (!up)
        return;
    client_stop(pub);
    while (up->nidle > 0)
        curl_easy_cleanup(up->idle[--up->nidle]);
    free(up->idle);
    buf_done(&up->scratch.conn);
    buf_done(&up->scratch.xff);
    buf_done(&up->scratch.line);
    buf_done(&up->target);
    buf_done(&up->method);
    upstream_base_done(&up->base);
    curl_slist_free_all(up->connect_to);
    blobs_done(&up->blobs);
    free(up);
}

static const struct upstream_client_ops curl_ops = {
    .start = client_start,
    .stop = client_stop,
    .free = client_free,
    .reload_tls = client_reload_tls,
};

int upstream_curl_new(const struct upstream_options *opt, struct loop *loop, struct upstream **ret)
{
    struct curl_client *up = calloc(1, sizeof(*up));
    int r = -ENOMEM;

    if (!up)
        return -ENOMEM;
    up->pub.ops = &curl_ops;
    up->loop = loop;
    list_init(&up->running);
    up->timer = (struct loop_timer){ .fn = on_timer_due, .ctx = up, .due_ms = UINT64_MAX };
    up->wake_timer = (struct loop_timer){ .fn = on_wakes, .ctx = up, .due_ms = UINT64_MAX };
    list_init(&up->fresh);
    list_init(&up->wakes);
    up->scratch.conn = up->scratch.xff = up->scratch.line = BUF_INIT(UPSTREAM_SCRATCH_LIMIT);
    up->target = up->method = BUF_INIT(UPSTREAM_SCRATCH_LIMIT);
    up->idle = calloc(UPSTREAM_IDLE_HANDLES, sizeof(*up->idle));
    up->max_capture_bytes = opt->max_capture_bytes;
    up->tls = *opt;
    r = blobs_read(opt, &up->blobs);
    if (r == 0)
        r = upstream_base_parse(opt->base_url, &up->base);
    if (r == 0 && opt->tls_server_name)
        r = use_server_name(up, opt->tls_server_name);
    if (r < 0)
        goto fail;
    r = -ENOMEM;
    up->multi = curl_multi_init();
    if (!up->multi || !up->idle ||
        curl_multi_setopt(up->multi, CURLMOPT_SOCKETFUNCTION, on_socket) != CURLM_OK ||
        curl_multi_setopt(up->multi, CURLMOPT_SOCKETDATA, up) != CURLM_OK ||
        curl_multi_setopt(up->multi, CURLMOPT_TIMERFUNCTION, on_timer) != CURLM_OK ||
        curl_multi_setopt(up->multi, CURLMOPT_TIMERDATA, up) != CURLM_OK)
        goto fail;
    if (opt->max_connections > 0) {
        long n = (long)opt->max_connections;

        if (curl_multi_setopt(up->multi, CURLMOPT_MAX_HOST_CONNECTIONS, n) != CURLM_OK ||
            curl_multi_setopt(up->multi, CURLMOPT_MAXCONNECTS, n) != CURLM_OK)
            goto fail;
    }
    r = upstream_watchdog_init(&up->watchdog, loop, opt->timeout_ms, opt->late_ms, wrote, time_out,
                               up);
    if (r == 0)
        r = loop_timer_add(loop, &up->timer);
    if (r == 0)
        r = loop_timer_add(loop, &up->wake_timer);
    if (r < 0)
        goto fail;
    *ret = &up->pub;
    return 0;

fail:
    client_free(&up->pub);
    return r;
}
