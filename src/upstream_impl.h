/* SPDX-License-Identifier: MIT */
/* What the upstream's two clients share (doc/performance.md says which
 * serves which upstream): upstream.c hands them requests on their loop's
 * thread and keeps their silences (the watchdog); upstream_request.c says
 * what an exchange sends; upstream_curl.c carries it with libcurl,
 * upstream_h1.c over HTTP/1.1 connections of its own. */
#ifndef IDEMPROXY_UPSTREAM_IMPL_H
#define IDEMPROXY_UPSTREAM_IMPL_H

#include <pthread.h>
#include <string.h>

#include <curl/curl.h>

#include "idemproxy/buf.h"
#include "idemproxy/list.h"
#include "idemproxy/loop.h"
#include "idemproxy/upstream.h"

/* A client, on the loop thread only. */
struct upstream_client_ops {
    /* Starts <req> (see upstream_submit()). Returns 0 when <done> is to run
     * later (never inside this call), or a negative errno: it never runs. */
    int (*start)(struct upstream *up, const struct upstream_request *req, upstream_done_fn *done,
                 void *ctx);
    /* Ends every exchange with -ECANCELED (their callbacks run) and lets
     * every connection go. */
    void (*stop)(struct upstream *up);
    /* Frees what the client owns, once stopped and its loop idle. */
    void (*free)(struct upstream *up);
    /* Reads its TLS files again for the exchanges that start from now on;
     * NULL for a client without TLS. Returns what upstream_reload_tls() does. */
    int (*reload_tls)(struct upstream *up);
};

/* The part of each client that upstream.c keeps: the first member of both. */
struct upstream {
    const struct upstream_client_ops *ops;
    struct loop *loop;      /* borrowed */
    pthread_mutex_t lock;   /* guards the queue, <posted> and <stopping> */
    struct list queue;      /* struct upstream_job submitted from other threads */
    bool posted;            /* <drain> is on its way to the loop */
    struct loop_task drain; /* takes the queue, on the loop thread */
    bool stopping;
};

/* The two clients. Each returns 0 with its upstream_client_ops set in
 * (*ret)->ops and the rest of *ret zeroed, or a negative errno. */
int upstream_curl_new(const struct upstream_options *opt, struct loop *loop, struct upstream **ret);
int upstream_h1_new(const struct upstream_options *opt, struct loop *loop, struct upstream **ret);

/* ---- the watchdog: timeouts bound silences ---- */

/* An exchange waiting for bytes: in one of the watchdog's lists, or in
 * none while paused. */
struct upstream_watched {
    uint64_t deadline_ms;
    struct list_node node;
    bool late; /* past --upstream-timeout with req->overdue: the late window runs */
    const struct upstream_request *req; /* the exchange's: its overdue() */
    void *ctx;                          /* ... and the context it gets */
};

/* A client's side of the watchdog, called with its context: whether bytes
 * of <w>'s request were written, and the end of <w> for a silence past its
 * timeout (its cause in words is the client's). */
typedef bool upstream_wrote_fn(void *ctx, struct upstream_watched *w);
typedef void upstream_time_out_fn(void *ctx, struct upstream_watched *w);

/* Exchanges in the order of their deadlines (each list has one timeout for
 * all, and an exchange moves to its tail whenever bytes come), and the
 * timer of each first. A silence past --upstream-timeout ends an exchange,
 * unless its request was written and it has req->overdue and there is a
 * late window: then it goes on, late, and overdue() runs; a silence past
 * the late timeout ends it. */
struct upstream_watchdog {
    struct list silent, late;
    struct loop_timer silent_timer, late_timer;
    uint64_t timeout_ms, late_ms;
    upstream_wrote_fn *wrote;
    upstream_time_out_fn *time_out;
    void *ctx;
};

/* Sets <wd> up with the client's side (called with <ctx>), and adds its
 * timers to <loop>. Returns 0 or a negative errno. */
int upstream_watchdog_init(struct upstream_watchdog *wd, struct loop *loop, uint64_t timeout_ms,
                           uint64_t late_ms, upstream_wrote_fn *wrote,
                           upstream_time_out_fn *time_out, void *ctx);

/* Takes the timers off <loop>. */
void upstream_watchdog_done(struct upstream_watchdog *wd, struct loop *loop);

/* Bytes came for <w> (or it starts, or resumes): its silence is measured
 * from now, against the timeout, or once late against the late one. */
void upstream_watch_touch(struct upstream_watchdog *wd, struct upstream_watched *w);

/* <w> waits for nobody (paused, or ended). */
static inline void upstream_watch_stop(struct upstream_watched *w) { list_remove(&w->node); }

/* ---- outcomes ---- */

/* The error a failed exchange reports (see upstream_done_fn), told by
 * whether bytes of the request were written to a connection (<wrote>). */
int upstream_failure(int err, bool wrote);

/* Fills <w> (NULL: nothing asked) for the failure <err>: <cause> if known,
 * and <more> (copied; NULL: none) for the log. */
void upstream_tell_why(struct upstream_why *w, int err, const char *cause, const char *more);

/* ---- what an exchange sends (upstream_request.c) ---- */

/* Buffers reused from one request to the next (one set per loop). */
struct upstream_scratch {
    struct buf conn, xff, line;
};

/* What upstream_each_field() passed on, for a client that would otherwise
 * add fields of its own. */
struct upstream_fields_seen {
    bool host, accept, content_type;
};

typedef int upstream_field_fn(void *ctx, struct span name, struct span value);

/* Calls <fn>(<ctx>, name, value) for each header field sent to the
 * upstream for <req> (see upstream_submit()), in order, with <s>'s buffers;
 * says in <seen> which of Host, Accept and Content-Type went. Returns 0,
 * or -ENOMEM (or <fn>'s negative errno). */
int upstream_each_field(const struct upstream_request *req, struct upstream_scratch *s,
                        upstream_field_fn *fn, void *ctx, struct upstream_fields_seen *seen);

/* The header list libcurl sends for <req>: upstream_each_field()'s, and
 * the lines that keep curl from adding fields the client did not send.
 * Returns 0, or -ENOMEM (nothing in <ret>). */
int upstream_build_headers(const struct upstream_request *req, struct upstream_scratch *s,
                           struct curl_slist **ret);

/* Whether the method <s> is <lit> (methods are case-sensitive). */
static inline bool upstream_method_is(struct span s, const char *lit)
{
    size_t n = strlen(lit);

    return s.len == n && memcmp(s.base, lit, n) == 0;
}

/* How the body of <req> is framed: none (HEAD, or a GET without one), a
 * Content-Length (<*ret_len>), or chunked (a streamed body of unknown length). */
enum upstream_framing {
    UPSTREAM_NO_BODY,
    UPSTREAM_LENGTH,
    UPSTREAM_CHUNKED,
};
enum upstream_framing upstream_body_framing(const struct upstream_request *req, uint64_t *ret_len);

#endif
