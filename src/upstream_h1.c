/* SPDX-License-Identifier: MIT */
/* The HTTP/1.1 client of http:// upstreams (doc/performance.md), on the
 * event loop's thread: an exchange builds its request head once, writes it
 * with its body in one writev() on a connection of the pool
 * (upstream_h1_pool.c), and reads the answer with the answer reader
 * (libhttp-parser's framing). What it tells its caller is what the libcurl
 * client tells (upstream.h): the same errors, told apart by whether a byte
 * of the request was written, the same causes in words, the same
 * streaming of an answer whose body does not come with its head, and the
 * same silences bounded by the watchdog. A request found on a kept
 * connection that the upstream had closed is sent again on a new one only
 * when nothing of it was written, or its method is safe, as libcurl does. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include "idemproxy/flow.h"
#include "idemproxy/http.h"
#include "idemproxy/record.h"

#include "upstream_h1_impl.h"

#define H1_SCRATCH_LIMIT (1u << 30) /* header lines come from MHD, already bounded */

static void ex_finish(struct h1_ex *x, int err, bool keep);

/* Runs the client's turn timer at once: what waits for it runs outside
 * the caller that queued it. */
static void kick(struct h1_client *cl) { cl->turn_timer.due_ms = 0; }

void h1_ex_end_later(struct h1_ex *x, int err, const char *cause)
{
    x->end_err = err;
    if (cause)
        x->cause = cause;
    list_remove(&x->node);
    list_append(&x->cl->ended, &x->node);
    upstream_watch_stop(&x->watch);
    kick(x->cl);
}

/* ---- the request ---- */

static int add_field(void *ctx, struct span name, struct span value)
{
    struct buf *h = ctx;

    if (buf_append(h, name.base, name.len) < 0 || buf_append(h, ": ", 2) < 0 ||
        buf_append(h, value.base, value.len) < 0 || buf_append(h, "\r\n", 2) < 0)
        return -ENOMEM;
    return 0;
}

/* Builds the request head of <x> in cl->head: the request line, the
 * fields (upstream_each_field()), Host when the client sent none, and the
 * body's framing. Returns 0, -EINVAL (a target neither "*" nor in
 * origin-form) or -ENOMEM. */
static int build_head(struct h1_ex *x)
{
    struct h1_client *cl = x->cl;
    const struct upstream_request *req = x->req;
    struct buf *h = &cl->head;
    struct upstream_fields_seen seen;
    uint64_t len = 0;
    char line[48];
    int r;

    h->len = 0;
    if (buf_append(h, req->method.base, req->method.len) < 0 || buf_append(h, " ", 1) < 0)
        return -ENOMEM;
    r = upstream_request_target(span_from_cstr(cl->base.prefix), req->target, h);
    if (r < 0)
        return r;
    h->len--; /* its NUL */
    if (buf_append(h, " HTTP/1.1\r\n", 11) < 0)
        return -ENOMEM;
    r = upstream_each_field(req, &cl->scratch, add_field, h, &seen);
    if (r < 0)
        return r;
    if (!seen.host && add_field(h, SPAN_LIT("Host"), span_from_cstr(cl->authority)) < 0)
        return -ENOMEM;
    x->framing = upstream_body_framing(req, &len);
    if (x->framing == UPSTREAM_LENGTH) {
        int n = snprintf(line, sizeof(line), "%llu", (unsigned long long)len);

        if (add_field(h, SPAN_LIT("Content-Length"), (struct span){ line, (size_t)n }) < 0)
            return -ENOMEM;
    } else if (x->framing == UPSTREAM_CHUNKED &&
               add_field(h, SPAN_LIT("Transfer-Encoding"), SPAN_LIT("chunked")) < 0) {
        return -ENOMEM;
    }
    return buf_append(h, "\r\n", 2) < 0 ? -ENOMEM : 0;
}

/* The head of <x> is in cl->head: it goes to a connection now (a kept one,
 * at once), or is kept in x->out until one is there. */
static void ex_go(struct h1_ex *x)
{
    struct h1_client *cl = x->cl;

    x->head_built = false;
    (void)h1_pool_acquire(cl, x);
    if (!x->head_built) {
        x->out.len = x->out_off = 0;
        if (buf_append(&x->out, cl->head.data, cl->head.len) < 0)
            h1_ex_end_later(x, -ENOMEM, NULL);
        x->head_built = true;
    }
}

/* What a failed write or read says, by what was written before. */
static int reset(struct h1_ex *x)
{
    x->cause = x->wrote ? "the upstream reset the connection after the request was sent"
                        : "the upstream reset the connection before the request was sent";
    return -ECONNRESET;
}

/* <w> bytes of what ex_send() offered were written: the head (in cl->head
 * when <in_scratch>, else in x->out), then the body. What is left of a head
 * in cl->head moves to x->out: cl->head is the next exchange's. */
static int consumed(struct h1_ex *x, size_t w, bool in_scratch)
{
    struct h1_client *cl = x->cl;
    size_t take;

    if (in_scratch) {
        x->head_built = true;
        x->out.len = x->out_off = 0;
        take = w < cl->head.len ? w : cl->head.len;
        if (take < cl->head.len &&
            buf_append(&x->out, cl->head.data + take, cl->head.len - take) < 0)
            return -ENOMEM;
    } else {
        take = x->out.len - x->out_off;
        take = w < take ? w : take;
        x->out_off += take;
        if (x->out_off == x->out.len)
            x->out.len = x->out_off = 0;
    }
    x->body_off += w - take;
    return 0;
}

/* Takes what the body flow has into x->out, framed: 1 when bytes or the
 * end came, 0 when it has none now (writing pauses until its wake-up), or
 * a negative errno (it was cut). */
static int pull(struct h1_ex *x)
{
    struct h1_client *cl = x->cl;
    ssize_t n = flow_read(x->req->body_flow, cl->rbuf, sizeof(cl->rbuf));
    char size[24];
    int len, r = 0;

    if (n == FLOW_AGAIN) {
        x->upload_paused = true;
        upstream_watch_stop(&x->watch); /* the client is slow, not the upstream */
        return 0;
    }
    if (n == FLOW_CUT) {
        x->cause = "the request body did not come whole from the client";
        return -ECANCELED;
    }
    if (n == FLOW_END) {
        x->body_ended = true; /* sent once what it put in x->out is written */
        if (x->framing == UPSTREAM_CHUNKED)
            r = buf_append(&x->out, "0\r\n\r\n", 5);
        return r < 0 ? -ENOMEM : 1;
    }
    x->pulled = true;
    if (x->framing == UPSTREAM_CHUNKED) {
        len = snprintf(size, sizeof(size), "%zx\r\n", (size_t)n);
        r = buf_append(&x->out, size, (size_t)len);
    }
    if (r == 0)
        r = buf_append(&x->out, cl->rbuf, (size_t)n);
    if (r == 0 && x->framing == UPSTREAM_CHUNKED)
        r = buf_append(&x->out, "\r\n", 2);
    return r < 0 ? -ENOMEM : 1;
}

/* Whether <x> waits for room to write (what it has not written yet). */
static bool writing(const struct h1_ex *x) { return (x->conn->events & EPOLLOUT) != 0; }

/* What <x>'s connection waits for: the answer unless reading is paused,
 * and room to write while the request is not all written. */
static int want(struct h1_ex *x, bool blocked)
{
    return h1_conn_want(x->conn, (x->paused ? 0 : EPOLLIN) | (blocked ? EPOLLOUT : 0));
}

/* Writes what <x> has to send until it is all written, the socket is full
 * (EPOLLOUT says when to go on) or the body flow has nothing now. Returns 0
 * or a negative errno with x->cause. */
static int ex_send(struct h1_ex *x)
{
    struct h1_client *cl = x->cl;
    struct span body =
        x->req->body_flow || x->framing == UPSTREAM_NO_BODY ? (struct span){ 0 } : x->req->body;

    for (;;) {
        struct iovec iov[2];
        bool in_scratch = !x->head_built;
        int n = 0, r;
        ssize_t w;

        if (in_scratch)
            iov[n++] = (struct iovec){ cl->head.data, cl->head.len };
        else if (x->out.len > x->out_off)
            iov[n++] = (struct iovec){ x->out.data + x->out_off, x->out.len - x->out_off };
        if (x->body_off < body.len)
            iov[n++] = (struct iovec){ (void *)(uintptr_t)(body.base + x->body_off),
                                       body.len - x->body_off }; /* writev() only reads it */
        if (n == 0) {
            /* A request framed without a body (HEAD) sends none, whatever the
             * client streamed: its bytes would be a request of their own. */
            if (!x->req->body_flow || x->framing == UPSTREAM_NO_BODY || x->body_ended)
                x->body_sent = true;
            if (x->body_sent || x->upload_paused)
                return want(x, false);
            if ((r = pull(x)) <= 0)
                return r < 0 ? r : want(x, false);
            continue;
        }
        w = writev(x->conn->watch.fd, iov, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            if (in_scratch && consumed(x, 0, true) < 0)
                return -ENOMEM;
            return want(x, true);
        }
        if (w < 0)
            return reset(x);
        x->wrote += (uint64_t)w;
        upstream_watch_touch(&cl->watchdog, &x->watch);
        if (consumed(x, (size_t)w, in_scratch) < 0)
            return -ENOMEM;
    }
}

/* ---- failures ---- */

/* Sends <x> again on a new connection: the kept one it went over was
 * closed by the upstream before answering. Returns 0, or a negative errno
 * (it is not). */
static int ex_retry(struct h1_ex *x)
{
    struct h1_client *cl = x->cl;
    int r;

    h1_pool_release(cl, x->conn, false);
    x->conn = NULL;
    x->retried = true;
    x->wrote_before = x->wrote > 0;
    x->wrote = 0;
    x->body_off = 0;
    x->body_sent = x->body_ended = x->paused = x->upload_paused = false;
    kick(cl); /* a place in the pool was freed: the exchanges waiting for one */
    x->out.len = x->out_off = 0;
    answer_reader_done(&x->rd);
    r = answer_reader_init(&x->rd, cl->max_capture_bytes, UPSTREAM_HEAD_MAX,
                           upstream_method_is(x->req->method, "HEAD"));
    list_remove(&x->node);
    if (r == 0)
        r = build_head(x);
    if (r == 0)
        ex_go(x);
    return r;
}

/* <x> failed with <err>: sent again when it may be (see above), else it
 * ends now, or at the next turn when <later> (its caller must not see it
 * end). */
static void ex_fail(struct h1_ex *x, int err, bool later)
{
    struct h1_conn *c = x->conn;

    if (err == -ECONNRESET && c && c->reused && !x->retried && !x->rd.started && !x->pulled &&
        (x->wrote == 0 || x->may_resend) && ex_retry(x) == 0)
        return;
    if (later)
        h1_ex_end_later(x, err, NULL);
    else
        ex_finish(x, err, false);
}

/* ---- the answer ---- */

/* The answer's body, once it streams: to req->flow, as the libcurl client
 * does (see write_cb there). */
static int to_flow(void *ctx, const char *p, size_t n)
{
    struct h1_ex *x = ctx;
    struct flow *f = x->req->flow;

    if (!flow_wants_bytes(f)) {
        x->cause = "the client went away";
        return -ECANCELED;
    }
    if (x->req->body_flow && !x->body_sent) {
        /* No answer goes out before the client's body is in (libmicrohttpd):
         * held, up to the capture limit. */
        if (f->q.len - f->off + n > x->cl->max_capture_bytes) {
            x->cause = "the upstream's answer outgrew what the proxy holds while the "
                       "request's body was still being sent";
            return -E2BIG;
        }
        flow_push(f, p, n);
        return 0;
    }
    if (flow_write(f, p, n) == 0) {
        /* The client reads slower than the upstream sends: this read's
         * bytes are queued still, and no more are read until it has room. */
        flow_push(f, p, n);
        x->paused = true;
    }
    return 0;
}

static void on_flow_wake(void *ctx);

/* The head came and the body did not come with it: the head goes to the
 * caller, and the body streams. Returns false when <x> ended instead. */
static bool ex_stream(struct h1_ex *x)
{
    struct record *rec = answer_reader_take(&x->rd);
    uint64_t length = x->rd.length == UINT64_MAX ? FLOW_LENGTH_UNKNOWN : x->rd.length;

    if (x->req->head(x->ctx, rec, length) < 0) {
        ex_finish(x, -ENOMEM, false);
        return false;
    }
    x->streaming = true;
    answer_reader_set_sink(&x->rd, to_flow, x);
    flow_set_writer(x->req->flow, on_flow_wake, x);
    return true;
}

/* The connection has bytes, or was closed: one read, given to the answer
 * reader. */
static void ex_read(struct h1_ex *x)
{
    struct h1_client *cl = x->cl;
    ssize_t n = read(x->conn->watch.fd, cl->rbuf, sizeof(cl->rbuf)), used;

    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n < 0) {
        ex_fail(x, reset(x), false);
        return;
    }
    if (n == 0) {
        if (answer_reader_close(&x->rd) == 0) {
            ex_finish(x, 0, false);
            return;
        }
        x->cause = x->rd.cause;
        ex_fail(x, x->rd.err, false);
        return;
    }
    used = answer_reader_feed(&x->rd, cl->rbuf, (size_t)n);
    if (used < 0) {
        if (!x->cause)
            x->cause = x->rd.cause;
        ex_finish(x, (int)used, false);
        return;
    }
    if (x->rd.done) {
        /* Kept only when it was all this answer, and the request all sent. */
        ex_finish(x, 0, used == n && x->body_sent && answer_reader_keeps_alive(&x->rd));
        return;
    }
    if (x->rd.head_done && x->req->head && !x->streaming) {
        if (!ex_stream(x))
            return;
    } else if (!x->paused) {
        upstream_watch_touch(&cl->watchdog, &x->watch);
    }
    if (x->paused) {
        upstream_watch_stop(&x->watch);
        (void)want(x, writing(x));
    }
}

void h1_ex_on_events(struct h1_conn *c, uint32_t events)
{
    struct h1_ex *x = c->ex;
    int r;

    if ((events & (EPOLLOUT | EPOLLERR)) && (c->events & EPOLLOUT)) {
        r = ex_send(x);
        if (r < 0) {
            ex_fail(x, r, false);
            return;
        }
    }
    if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !x->paused)
        ex_read(x);
}

void h1_ex_connected(struct h1_ex *x)
{
    int r = ex_send(x);

    if (r < 0)
        ex_fail(x, r, true);
}

/* Hands the outcome to the callback and frees <x>; its connection goes
 * back to the pool when <keep>, else is closed. */
static void ex_finish(struct h1_ex *x, int err, bool keep)
{
    struct h1_client *cl = x->cl;
    const struct upstream_request *req = x->req;
    upstream_done_fn *done = x->done;
    void *ctx = x->ctx;
    struct record *rec = NULL;

    list_remove(&x->node);
    list_remove(&x->wake_node);
    upstream_watch_stop(&x->watch);
    if (x->streaming)
        flow_set_writer(req->flow, NULL, NULL); /* the flow outlives the exchange */
    if (req->body_flow) { /* nobody reads the rest of the body: its writer drops it */
        flow_set_reader(req->body_flow, NULL, NULL);
        flow_reader_gone(req->body_flow);
    }
    if (err == 0 && !x->streaming)
        rec = answer_reader_take(&x->rd);
    if (err < 0) {
        err = upstream_failure(err, x->wrote > 0 || x->wrote_before);
        upstream_tell_why(req->why, err, x->cause, x->more);
    }
    if (x->conn)
        h1_pool_release(cl, x->conn, err == 0 && keep);
    answer_reader_done(&x->rd);
    buf_done(&x->out);
    free(x);
    done(ctx, err, rec);
    h1_pool_serve(cl);
}

/* ---- the loop's side ---- */

/* A flow of <x> woke it (inside the flow's caller): it runs at the turn. */
static void on_flow_wake(void *ctx)
{
    struct h1_ex *x = ctx;

    if (x->waking)
        return;
    x->waking = true;
    list_append(&x->cl->wakes, &x->wake_node);
    kick(x->cl);
}

/* A woken exchange: it stops when its client is gone, else reads or
 * writes again. */
static void ex_woken(struct h1_ex *x)
{
    struct h1_client *cl = x->cl;
    int r = 0;

    x->waking = false;
    if (!x->conn || x->conn->state != H1_BUSY)
        return; /* waiting for a connection still: it sends once it has one */
    if (x->streaming && !flow_wants_bytes(x->req->flow)) {
        x->cause = "the client went away";
        ex_finish(x, -ECANCELED, false);
        return;
    }
    if (x->paused) {
        x->paused = false;
        upstream_watch_touch(&cl->watchdog, &x->watch);
        r = want(x, writing(x));
    }
    if (r == 0 && x->upload_paused) {
        x->upload_paused = false;
        upstream_watch_touch(&cl->watchdog, &x->watch);
        r = ex_send(x);
    }
    if (r < 0)
        ex_fail(x, r == -ENOMEM || r == -ECANCELED ? r : -ECONNRESET, false);
}

static void on_turn(void *ctx)
{
    struct h1_client *cl = ctx;
    struct list_node *n;

    cl->turn_timer.due_ms = UINT64_MAX;
    while ((n = list_first(&cl->ended))) {
        struct h1_ex *x = list_entry(n, struct h1_ex, node);

        ex_finish(x, x->end_err, false);
    }
    while ((n = list_first(&cl->wakes))) {
        list_remove(n);
        ex_woken(list_entry(n, struct h1_ex, wake_node));
    }
    h1_pool_serve(cl);
}

/* What a silence past its timeout means for <x>, in words. */
static const char *timeout_cause(const struct h1_ex *x)
{
    if (x->streaming)
        return x->watch.late
                   ? "the upstream's answer stopped for longer than --upstream-late-timeout"
                   : "the upstream's answer stopped for longer than --upstream-timeout";
    if (x->wrote)
        return x->watch.late ? "no answer from the upstream within --upstream-late-timeout either"
                             : "no answer from the upstream within --upstream-timeout";
    return "no connection to the upstream within --upstream-timeout";
}

static void time_out(void *ctx, struct upstream_watched *w)
{
    struct h1_ex *x = list_entry(w, struct h1_ex, watch);

    (void)ctx;
    x->cause = timeout_cause(x);
    ex_finish(x, -ETIMEDOUT, false);
}

static bool wrote(void *ctx, struct upstream_watched *w)
{
    (void)ctx;
    return list_entry(w, struct h1_ex, watch)->wrote > 0;
}

/* ---- the client ---- */

static int h1_start(struct upstream *pub, const struct upstream_request *req,
                    upstream_done_fn *done, void *ctx)
{
    struct h1_client *cl = (struct h1_client *)pub;
    struct h1_ex *x = calloc(1, sizeof(*x));
    int r;

    if (!x)
        return -ENOMEM;
    *x = (struct h1_ex){
        .cl = cl,
        .req = req,
        .done = done,
        .ctx = ctx,
        .out = BUF_INIT(H1_SCRATCH_LIMIT),
        .watch = { .req = req, .ctx = ctx },
        .may_resend =
            upstream_method_is(req->method, "GET") || upstream_method_is(req->method, "HEAD") ||
            upstream_method_is(req->method, "OPTIONS") || upstream_method_is(req->method, "TRACE"),
    };
    r = answer_reader_init(&x->rd, cl->max_capture_bytes, UPSTREAM_HEAD_MAX,
                           upstream_method_is(req->method, "HEAD"));
    if (r == 0)
        r = build_head(x); /* checks the target before anything runs */
    if (r < 0) {
        answer_reader_done(&x->rd);
        free(x);
        return r;
    }
    if (req->body_flow)
        flow_set_reader(req->body_flow, on_flow_wake, x);
    upstream_watch_touch(&cl->watchdog, &x->watch);
    ex_go(x);
    return 0;
}

static void h1_stop(struct upstream *pub)
{
    struct h1_client *cl = (struct h1_client *)pub;
    struct list *lists[] = { &cl->waiting, &cl->running, &cl->ended };
    struct list_node *n;

    for (size_t i = 0; i < ARRAY_SIZE(lists); i++) {
        while ((n = list_first(lists[i]))) {
            struct h1_ex *x = list_entry(n, struct h1_ex, node);

            ex_finish(x, lists[i] == &cl->ended ? x->end_err : -ECANCELED, false);
        }
    }
    h1_pool_stop(cl);
    upstream_watchdog_done(&cl->watchdog, cl->loop);
    loop_timer_del(cl->loop, &cl->turn_timer);
    loop_timer_del(cl->loop, &cl->idle_timer);
}

static void h1_free(struct upstream *pub)
{
    struct h1_client *cl = (struct h1_client *)pub;

    if (!cl)
        return;
    buf_done(&cl->scratch.conn);
    buf_done(&cl->scratch.xff);
    buf_done(&cl->scratch.line);
    buf_done(&cl->head);
    upstream_base_done(&cl->base);
    free(cl->host);
    free(cl->port);
    free(cl->authority);
    free(cl);
}

static const struct upstream_client_ops h1_ops = {
    .start = h1_start,
    .stop = h1_stop,
    .free = h1_free,
};

int upstream_h1_new(const struct upstream_options *opt, struct loop *loop, struct upstream **ret)
{
    struct h1_client *cl = calloc(1, sizeof(*cl));
    int r;

    if (!cl)
        return -ENOMEM;
    cl->pub.ops = &h1_ops;
    cl->loop = loop;
    cl->max_capture_bytes = opt->max_capture_bytes;
    cl->max_conns = opt->max_connections ? opt->max_connections : UINT_MAX;
    list_init(&cl->running);
    list_init(&cl->waiting);
    list_init(&cl->ended);
    list_init(&cl->idle);
    list_init(&cl->wakes);
    cl->scratch.conn = cl->scratch.xff = cl->scratch.line = BUF_INIT(H1_SCRATCH_LIMIT);
    cl->head = BUF_INIT(H1_SCRATCH_LIMIT);
    cl->turn_timer = (struct loop_timer){ .fn = on_turn, .ctx = cl, .due_ms = UINT64_MAX };
    cl->idle_timer =
        (struct loop_timer){ .fn = h1_pool_on_idle_timer, .ctx = cl, .due_ms = UINT64_MAX };
    r = upstream_base_parse(opt->base_url, &cl->base);
    if (r == 0)
        r = h1_pool_init(cl);
    if (r == 0)
        r = upstream_watchdog_init(&cl->watchdog, loop, opt->timeout_ms, opt->late_ms, wrote,
                                   time_out, cl);
    if (r == 0)
        r = loop_timer_add(loop, &cl->turn_timer);
    if (r == 0)
        r = loop_timer_add(loop, &cl->idle_timer);
    if (r < 0) {
        h1_stop(&cl->pub);
        h1_free(&cl->pub);
        return r;
    }
    *ret = &cl->pub;
    return 0;
}
