/* SPDX-License-Identifier: MIT */
/* The Redis store's notifications for --wait (store_set_notify()). */
#include <stdio.h>
#include <stdlib.h>

#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "store_redis_impl.h"

/* ---- notifications for --wait ---- */

static void sub_on_message(void *ctx, const redisReply *m)
{
    struct subscriber *sub = ctx;
    const redisReply *key = m->element[2];

    if (key->type == REDIS_REPLY_STRING && key->len > 0) /* "": a connection's probe */
        sub->fn(sub->ctx, (struct span){ key->str, key->len });
}

static void sub_on_subscribed(void *ctx, int err, const redisReply *r)
{
    struct subscriber *sub = ctx;

    if (err == 0 && r->type == REDIS_REPLY_ARRAY)
        sub->backoff_ms = 0; /* subscribed: the next failure retries at once */
    /* else: NOPERM (an ACL without &idemproxy:*) or a failure: down() or the
     * next message says more; the waiters' deadlines cover what is lost */
    if (err == 0 && r->type == REDIS_REPLY_ERROR)
        log_warn("redis %s: cannot subscribe to %s for --wait: %.*s", sub->st->name, NOTIFY_CHANNEL,
                 (int)(r->len > 200 ? 200 : r->len), r->str);
}

static void sub_on_down(void *ctx, int err, const char *why)
{
    struct subscriber *sub = ctx;

    (void)err, (void)why; /* the links log the store's failures */
    redis_conn_free(sub->conn);
    sub->conn = NULL;
    /* A cluster publishes every message on every node: any other will do. */
    sub->node = (sub->node + 1) % atomic_load(&sub->st->nnodes);
    sub->backoff_ms = sub->backoff_ms ? sub->backoff_ms * 2 : BACKOFF_FIRST_MS;
    if (sub->backoff_ms > BACKOFF_MAX_MS)
        sub->backoff_ms = BACKOFF_MAX_MS;
    sub->timer.due_ms = now_ms() + sub->backoff_ms;
}

static void sub_on_timer(void *ctx)
{
    struct subscriber *sub = ctx;
    struct store_redis *st = sub->st;
    struct redis_conn_opts o;
    struct redis_conn_handlers h = { .down = sub_on_down, .message = sub_on_message, .ctx = sub };
    char why[400], tls_name[REDIS_URL_HOST_MAX];

    if (sub->conn)
        return;
    if (store_redis_target(st, sub->node, &o, tls_name, sizeof(tls_name), &sub->generation, why,
                           sizeof(why)) < 0 ||
        redis_conn_open(sub->loop, &o, &h, &sub->conn) < 0) {
        sub->conn = NULL;
        sub_on_down(sub, -ECONNREFUSED, NULL);
        return;
    }
    if (redis_conn_subscribe(sub->conn, NOTIFY_CHANNEL, sub_on_subscribed, sub) < 0) {
        redis_conn_free(sub->conn);
        sub->conn = NULL;
        sub_on_down(sub, -ECONNRESET, NULL);
    }
}

/* On the subscriber's loop thread, or once that loop has stopped. */
static void sub_finish(void *ctx)
{
    struct subscriber *sub = ctx;

    redis_conn_free(sub->conn);
    sub->conn = NULL;
    loop_timer_del(sub->loop, &sub->timer);
}

void store_redis_notify_stop(struct subscriber *sub)
{
    if (!sub)
        return;
    loop_call(sub->loop, sub_finish, sub);
    free(sub);
}

static void sub_start(void *ctx)
{
    struct subscriber *sub = ctx;

    (void)loop_timer_add(sub->loop, &sub->timer);
}

/* The subscriber connects in the first loop's next turn (its first, when
 * called before the loops start, as the program does). */
int store_redis_set_notify(struct store *base, store_notify_fn *fn, void *ctx)
{
    struct store_redis *st = store_redis_of(base);
    struct subscriber *sub;

    if (!fn || st->sub)
        return -EINVAL;
    sub = calloc(1, sizeof(*sub));
    if (!sub)
        return -ENOMEM;
    *sub = (struct subscriber){ .st = st, .fn = fn, .ctx = ctx, .loop = st->lanes[0].loop };
    sub->timer = (struct loop_timer){ .fn = sub_on_timer, .ctx = sub, .due_ms = 0 };
    loop_call(sub->loop, sub_start, sub);
    st->sub = sub;
    return 0;
}
