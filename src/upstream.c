/* SPDX-License-Identifier: MIT */
/* The upstream client of one loop: the one of the two clients that serves
 * the upstream's scheme (--upstream-client), the hand-over of requests
 * submitted from other threads to the loop's thread, and what both clients
 * share there: the watchdog of silences and the words of a failure. */
#include "idemproxy/upstream.h"

#include <stdlib.h>
#include <string.h>

#include "idemproxy/list.h"
#include "idemproxy/loop.h"

#include "upstream_impl.h"

/* A request submitted from another thread, until the loop starts it. */
struct upstream_job {
    const struct upstream_request *req;
    upstream_done_fn *done;
    void *ctx;
    struct list_node node;
};

/* Starts the requests queued by other threads. Loop thread. */
static void on_drain(void *ctx)
{
    struct upstream *up = ctx;
    struct list queue;
    struct list_node *n;
    bool stopping;

    list_init(&queue);
    pthread_mutex_lock(&up->lock);
    list_splice(&queue, &up->queue);
    up->posted = false;
    stopping = up->stopping;
    pthread_mutex_unlock(&up->lock);
    while ((n = list_first(&queue))) {
        struct upstream_job *j = list_entry(n, struct upstream_job, node);
        upstream_done_fn *done = j->done;
        void *done_ctx = j->ctx;
        int err = stopping ? -ECANCELED : up->ops->start(up, j->req, done, done_ctx);

        list_remove(n);
        free(j);
        if (err < 0)
            done(done_ctx, err, NULL);
    }
}

int upstream_new(const struct upstream_options *opt, struct loop *loop, struct upstream **ret)
{
    struct upstream *up = NULL;
    int r;

    if (!opt || !opt->base_url || !loop)
        return -EINVAL;
    if (opt->client == UPSTREAM_CLIENT_OWN && strncmp(opt->base_url, "http://", 7) == 0)
        r = upstream_h1_new(opt, loop, &up);
    else
        r = upstream_curl_new(opt, loop, &up);
    if (r < 0)
        return r;
    pthread_mutex_init(&up->lock, NULL);
    up->loop = loop;
    list_init(&up->queue);
    up->drain = (struct loop_task){ .fn = on_drain, .ctx = up };
    *ret = up;
    return 0;
}

int upstream_submit(struct upstream *up, const struct upstream_request *req, upstream_done_fn *done,
                    void *ctx)
{
    struct upstream_job *j;
    bool post;
    int err;

    if (loop_on_thread(up->loop))
        return up->stopping ? -ECANCELED : up->ops->start(up, req, done, ctx);
    j = malloc(sizeof(*j));
    if (!j)
        return -ENOMEM;
    *j = (struct upstream_job){ .req = req, .done = done, .ctx = ctx };
    pthread_mutex_lock(&up->lock);
    if (up->stopping) {
        pthread_mutex_unlock(&up->lock);
        free(j);
        return -ECANCELED;
    }
    list_append(&up->queue, &j->node);
    post = !up->posted;
    up->posted = true;
    /* Under the lock: the task is in <up>, which upstream_free() frees only
     * after the loop has run every task posted before it. */
    err = post ? loop_post(up->loop, &up->drain) : 0;
    if (err < 0) {
        up->posted = false;
        list_remove(&j->node); /* the loop has stopped: it never takes the queue */
    }
    pthread_mutex_unlock(&up->lock);
    if (err < 0)
        free(j);
    return err;
}

/* Refuses new requests, cancels the queued ones and stops the client. Loop
 * thread, or any once the loop has stopped; a second call does nothing. */
static void teardown(void *ctx)
{
    struct upstream *up = ctx;
    bool was;

    pthread_mutex_lock(&up->lock);
    was = up->stopping;
    up->stopping = true;
    pthread_mutex_unlock(&up->lock);
    if (was)
        return;
    on_drain(up); /* what other threads queued, cancelled */
    up->ops->stop(up);
}

static void nothing(void *ctx) { (void)ctx; }

void upstream_cancel(struct upstream *up)
{
    if (up)
        loop_call(up->loop, teardown, up);
}

int upstream_reload_tls(struct upstream *up)
{
    return up && up->ops->reload_tls ? up->ops->reload_tls(up) : 0;
}

void upstream_free(struct upstream *up)
{
    if (!up)
        return;
    upstream_cancel(up);
    /* A drain task posted before the stop may still be queued: it runs before
     * this one, and finds nothing to do. */
    loop_call(up->loop, nothing, NULL);
    pthread_mutex_destroy(&up->lock);
    up->ops->free(up);
}

/* ---- the watchdog ---- */

/* Takes off the <late> or the silent list each first entry whose deadline
 * has passed, one by one, for <fn>; re-arms its timer. */
static void expire(struct upstream_watchdog *wd, bool late,
                   void (*fn)(struct upstream_watchdog *wd, struct upstream_watched *w))
{
    struct list *l = late ? &wd->late : &wd->silent;
    struct loop_timer *t = late ? &wd->late_timer : &wd->silent_timer;
    uint64_t now = now_ms();
    struct list_node *n;

    while ((n = list_first(l))) {
        struct upstream_watched *w = list_entry(n, struct upstream_watched, node);

        if (w->deadline_ms > now) {
            t->due_ms = w->deadline_ms;
            return;
        }
        list_remove(n);
        fn(wd, w);
    }
    t->due_ms = UINT64_MAX;
}

static void time_out(struct upstream_watchdog *wd, struct upstream_watched *w)
{
    wd->time_out(wd->ctx, w);
}

/* --upstream-timeout passed with nothing received. A request not sent yet
 * (still connecting, or waiting for a connection) ends here: nothing can
 * come late. One with req->overdue goes on, late; the others end. */
static void silent_one(struct upstream_watchdog *wd, struct upstream_watched *w)
{
    if (wd->late_ms == 0 || !w->req->overdue || !wd->wrote(wd->ctx, w)) {
        wd->time_out(wd->ctx, w);
        return;
    }
    w->late = true;
    upstream_watch_touch(wd, w);
    w->req->overdue(w->ctx);
}

static void on_silent(void *ctx) { expire(ctx, false, silent_one); }

static void on_late(void *ctx) { expire(ctx, true, time_out); }

int upstream_watchdog_init(struct upstream_watchdog *wd, struct loop *loop, uint64_t timeout_ms,
                           uint64_t late_ms, upstream_wrote_fn *wrote,
                           upstream_time_out_fn *time_out_fn, void *ctx)
{
    int r;

    list_init(&wd->silent);
    list_init(&wd->late);
    wd->timeout_ms = timeout_ms;
    wd->late_ms = late_ms;
    wd->wrote = wrote;
    wd->time_out = time_out_fn;
    wd->ctx = ctx;
    wd->silent_timer = (struct loop_timer){ .fn = on_silent, .ctx = wd, .due_ms = UINT64_MAX };
    wd->late_timer = (struct loop_timer){ .fn = on_late, .ctx = wd, .due_ms = UINT64_MAX };
    r = loop_timer_add(loop, &wd->silent_timer);
    if (r == 0)
        r = loop_timer_add(loop, &wd->late_timer);
    return r;
}

void upstream_watchdog_done(struct upstream_watchdog *wd, struct loop *loop)
{
    loop_timer_del(loop, &wd->silent_timer);
    loop_timer_del(loop, &wd->late_timer);
}

void upstream_watch_touch(struct upstream_watchdog *wd, struct upstream_watched *w)
{
    struct list *l = w->late ? &wd->late : &wd->silent;
    struct loop_timer *t = w->late ? &wd->late_timer : &wd->silent_timer;

    /* Every entry of a list got the same timeout, each later than the one
     * before: appended, it stays in deadline order. */
    list_remove(&w->node);
    w->deadline_ms = now_ms() + (w->late ? wd->late_ms : wd->timeout_ms);
    if (list_is_empty(l) || t->due_ms > w->deadline_ms)
        t->due_ms = w->deadline_ms;
    list_append(l, &w->node);
}

/* ---- outcomes ---- */

int upstream_failure(int err, bool wrote)
{
    switch (err) {
    case -ETIMEDOUT:
        return wrote ? err : -ENOTCONN;
    case -ECANCELED:
        return wrote ? -ESHUTDOWN : err;
    case -ECONNRESET:
    case -ECONNREFUSED:
        return wrote ? -ECONNRESET : -ECONNREFUSED;
    case -ENOMEM:
        return wrote ? -ECONNRESET : err;
    case -E2BIG:
        return err; /* it answered */
    default:        /* anything else (a loop's epoll_ctl() refused) is one of these */
        return wrote ? -ECONNRESET : -ECONNREFUSED;
    }
}

void upstream_tell_why(struct upstream_why *w, int err, const char *cause, const char *more)
{
    if (!w || err == 0)
        return;
    w->cause = cause;
    if (!w->cause && err == -ECONNRESET)
        w->cause = "the upstream's answer is malformed";
    else if (!w->cause && err == -ETIMEDOUT)
        w->cause = "no connection to the upstream within --upstream-timeout";
    else if (!w->cause && (err == -ECANCELED || err == -ESHUTDOWN))
        w->cause = "the exchange was cancelled: the proxy is stopping";
    free(w->more);
    w->more = more && more[0] ? strdup(more) : NULL; /* none on OOM: the cause is enough */
}
