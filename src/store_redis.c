/* SPDX-License-Identifier: MIT */
/* The Redis store. The hot operations (acquire, complete, release, extend)
 * each run one embedded Lua script (EVALSHA, EVAL on NOSCRIPT) on a
 * connection of the calling event loop's own (redis_conn.h), driven by that
 * loop: a request's ops are sent and answered on the thread that serves it,
 * without waking another. Ops queued in one loop turn go out in one write
 * (pipelining); replies call back on the loop thread, in order. Ops from
 * other threads (heartbeats, --wait retries) are queued for the first loop.
 * The readiness PING and the operator calls (inspect, purge) are ops too, on
 * the first loop's connection; the --wait subscriber has a connection of its
 * own on that loop. No thread waits on Redis. */
#include "idemproxy/store_redis.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "idemproxy/buf.h"
#include "idemproxy/http.h"
#include "idemproxy/idemkey.h"
#include "idemproxy/list.h"
#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "idemproxy/record.h"
#include "idemproxy/redis_conn.h"
#include "idemproxy/redis_sentinel.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/store_impl.h"
#include "idemproxy/store_redis_impl.h"
#include "idemproxy/worker.h"
#include "lua_scripts.h"

#define PING_INTERVAL_MS 1000

/* ---- operations ---- */

static bool reply_str_eq(const redisReply *r, const char *s)
{
    size_t n = strlen(s);

    return (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) && r->len == n &&
           memcmp(r->str, s, n) == 0;
}

static int parse_acquire(const redisReply *r, struct store_result *res)
{
    const redisReply *h, *b;
    int err;

    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1)
        return -EPROTO;
    if (r->elements == 1 && reply_str_eq(r->element[0], "acquired"))
        res->status = STORE_ACQUIRED;
    else if (r->elements == 1 && reply_str_eq(r->element[0], "in_flight"))
        res->status = STORE_IN_FLIGHT;
    else if (r->elements == 1 && reply_str_eq(r->element[0], "mismatch"))
        res->status = STORE_MISMATCH;
    else if (r->elements == 3 && reply_str_eq(r->element[0], "completed")) {
        h = r->element[1];
        b = r->element[2];
        if (h->type != REDIS_REPLY_STRING || b->type != REDIS_REPLY_STRING)
            return -EPROTO;
        err = record_decode((struct span){ .base = h->str, .len = h->len },
                            (struct span){ .base = b->str, .len = b->len }, &res->rec);
        if (err < 0)
            return err == -ENOMEM ? err : -EPROTO;
        res->status = STORE_COMPLETED;
    } else {
        return -EPROTO;
    }
    return 0;
}

static int parse_ok_or_stale(const redisReply *r, struct store_result *res)
{
    if (reply_str_eq(r, "ok")) {
        res->status = STORE_OK;
        return 0;
    }
    if (reply_str_eq(r, "stale"))
        return -ESTALE;
    return -EPROTO;
}

/* ---- the hot operations: one pipelined connection per event loop ---- */

static struct op *op_first(const struct list *l)
{
    struct list_node *n = list_first(l);

    return n ? list_entry(n, struct op, node) : NULL;
}

static void op_free(struct op *op)
{
    if (!op)
        return;
    record_unref(op->rec);
    buf_done(&op->head);
    free(op);
}

static void set_ready(struct store_redis *st, bool ready)
{
    if (atomic_load_explicit(&st->ready, memory_order_relaxed) != ready)
        atomic_store(&st->ready, ready);
}

/* Calls <op> back with <err>, or with the result <reply> holds (err 0), and
 * frees it. On its connection's loop thread, with <op> on no list. */
static void op_finish(struct op *op, int err, const redisReply *reply)
{
    struct store_result res = { .rec = NULL };

    if (op->raw) {
        op->raw(op->raw_ctx, err, err == 0 ? reply : NULL);
        op_free(op);
        return;
    }
    if (err == 0) {
        if (reply->type == REDIS_REPLY_ERROR)
            err = -EPROTO;
        else if (op->script == OP_PING)
            res.status = STORE_OK;
        else if (op->script == LUA_ACQUIRE)
            err = parse_acquire(reply, &res);
        else
            err = parse_ok_or_stale(reply, &res);
    }
    /* Answered: the caller may rely on the store holding no reference any more. */
    record_unref(op->rec);
    op->rec = NULL;
    if (err < 0) {
        record_unref(res.rec);
        res.rec = NULL;
    }
    op->done(op->ctx, err, err == 0 ? &res : NULL);
    record_unref(res.rec);
    op_free(op);
}

/* Fails every op of <l> with <err>. Takes the list first: a callback may
 * call again, and that op must not get this connection's error. */
static void op_list_fail(struct list *l, int err)
{
    struct list ops;
    struct op *op;

    list_init(&ops);
    list_splice(&ops, l);
    while ((op = op_first(&ops))) {
        list_remove(&op->node);
        op_finish(op, err, NULL);
    }
}

static void on_op_reply(void *ctx, int err, const redisReply *reply);
static void link_drop(struct link *k, int err, const char *why, bool backoff);
static void rediscover(struct store_redis *st);

/* Sends the script of <op> on the link's connection (EVALSHA, or EVAL once
 * Redis said NOSCRIPT): appended to the output, which goes out with every
 * other op of this loop turn in one write (pipelining). */
static int op_send(struct link *k, struct op *op)
{
    const struct lua_script *s = &lua_scripts[op->script < _LUA_MAX ? op->script : 0];
    const char *argv[8];
    size_t lens[8];
    char ttl[24];
    int argc = 0, err;

    if (op->script == OP_PING) {
        argv[argc] = "PING";
        lens[argc++] = 4;
        goto send;
    }
    if (op->script == OP_RAW) {
        const char *p = op->head.data;

        for (; argc < op->argc; argc++) {
            argv[argc] = p;
            lens[argc] = op->arglen[argc];
            p += op->arglen[argc];
        }
        goto send;
    }
    argv[argc] = op->eval ? "EVAL" : "EVALSHA";
    lens[argc++] = op->eval ? 4 : 7;
    argv[argc] = op->eval ? s->src : s->sha1;
    lens[argc++] = op->eval ? s->len : strlen(s->sha1);
    argv[argc] = "1"; /* one key */
    lens[argc++] = 1;
    argv[argc] = op->key;
    lens[argc++] = op->key_len;
    switch (op->script) {
    case LUA_ACQUIRE:
        argv[argc] = op->fp;
        lens[argc++] = FINGERPRINT_HEX;
        argv[argc] = op->tok.hex;
        lens[argc++] = STORE_TOKEN_HEX;
        break;
    case LUA_COMPLETE:
        argv[argc] = op->tok.hex;
        lens[argc++] = STORE_TOKEN_HEX;
        argv[argc] = op->head.data;
        lens[argc++] = op->head.len;
        argv[argc] = op->rec->body.data ? op->rec->body.data : "";
        lens[argc++] = op->rec->body.len;
        break;
    case LUA_INSPECT:
        argv[argc] = op->fp; /* "1": with the body, "0": without */
        lens[argc++] = 1;
        break;
    default: /* LUA_RELEASE, LUA_EXTEND */
        argv[argc] = op->tok.hex;
        lens[argc++] = STORE_TOKEN_HEX;
        break;
    }
    if (op->script != LUA_RELEASE && op->script != LUA_INSPECT) {
        lens[argc] = (size_t)snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)op->ttl_ms);
        argv[argc++] = ttl;
    }
send:
    err = redis_conn_command(k->conn, argc, argv, lens, on_op_reply, op);
    if (err == 0) {
        op->link = k;
        k->sent++;
    }
    return err;
}

/* An op's reply, or the error of its connection. */
static void on_op_reply(void *ctx, int err, const redisReply *reply)
{
    struct op *op = ctx;
    struct link *k = op->link;
    struct store_redis *st = op->st;

    k->sent--;
    if (err < 0) {
        set_ready(st, false);
        op_finish(op, err == -ECANCELED ? -ECONNRESET : err, NULL);
        return;
    }
    /* Redis answers, but an error (LOADING, MISCONF, OOM, NOAUTH…) means it
     * cannot serve us; NOSCRIPT only means the script cache was emptied. */
    if (!op->eval && redis_reply_is_error(reply, "NOSCRIPT")) {
        set_ready(st, true);
        op->eval = true; /* EVAL caches it again for the EVALSHAs after it */
        if (op_send(k, op) < 0)
            op_finish(op, -ECONNRESET, NULL);
        return;
    }
    if (st->sentinel && redis_reply_is_error(reply, "READONLY") && k->conn) {
        /* a demoted master: this op fails, the next ones go to the new one */
        op_finish(op, 0, reply);
        if (k->conn)
            link_drop(k, -EAGAIN, "READONLY: a replica now; asking the sentinels again", true);
        rediscover(st);
        return;
    }
    set_ready(st, reply->type != REDIS_REPLY_ERROR);
    op_finish(op, 0, reply);
}

static void backoff_start(struct link *k)
{
    k->backoff_ms = k->backoff_ms ? k->backoff_ms * 2 : BACKOFF_FIRST_MS;
    if (k->backoff_ms > BACKOFF_MAX_MS)
        k->backoff_ms = BACKOFF_MAX_MS;
    k->retry_at_ms = now_ms() + k->backoff_ms;
}

/* Says why the connections fail, once per new reason (every loop's link
 * retries, each with its backoff: the log gets one line, not one a retry). */
static void log_failure(struct store_redis *st, const char *why)
{
    pthread_mutex_lock(&st->log_mu);
    if (strcmp(st->logged_why, why) != 0) {
        snprintf(st->logged_why, sizeof(st->logged_why), "%s", why);
        log_warn("redis %s: %s", st->name, why);
    }
    pthread_mutex_unlock(&st->log_mu);
}

static void log_recovery(struct store_redis *st)
{
    pthread_mutex_lock(&st->log_mu);
    if (st->logged_why[0]) {
        st->logged_why[0] = '\0';
        log_info("redis %s: connected", st->name);
    }
    pthread_mutex_unlock(&st->log_mu);
}

static void link_dispatch(struct link *k, uint64_t now);

/* The connection is set up, and (Sentinel) it is the master. */
static void link_confirmed(struct link *k)
{
    k->ready = true;
    k->backoff_ms = 0;
    k->last_err = 0;
    set_ready(k->st, true);
    log_recovery(k->st);
    link_dispatch(k, now_ms());
}

/* Gives the connection up (not from inside its own I/O: from a reply
 * callback, or the loop); what it holds fails with -ECONNRESET. */
static void link_drop(struct link *k, int err, const char *why, bool backoff)
{
    struct redis_conn *c = k->conn;

    k->conn = NULL;
    k->ready = false;
    k->last_err = err;
    set_ready(k->st, false);
    if (backoff)
        backoff_start(k);
    if (why)
        log_failure(k->st, why);
    redis_conn_free(c); /* sent ops: -ECANCELED, answered as -ECONNRESET */
    op_list_fail(&k->waiting, err);
}

/* ROLE, with Sentinel: what the sentinels named may have been demoted since. */
static void on_role(void *ctx, int err, const redisReply *r)
{
    struct link *k = ctx;
    char why[200];

    if (err < 0)
        return; /* the connection failed: its down() sees to the rest */
    if (redis_reply_is_error(r, "NOPERM") ||
        (r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
         r->element[0]->type == REDIS_REPLY_STRING && r->element[0]->len == 6 &&
         memcmp(r->element[0]->str, "master", 6) == 0)) {
        /* the master (or an ACL that forbids ROLE: READONLY replies tell) */
        link_confirmed(k);
        return;
    }
    snprintf(
        why, sizeof(why), "not the master (ROLE: %.*s): asking the sentinels again",
        r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING
            ? (int)(r->element[0]->len > 32 ? 32 : r->element[0]->len)
            : 7,
        r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING
            ? r->element[0]->str
            : "unknown");
    link_drop(k, -EAGAIN, why, true);
    rediscover(k->st);
}

/* The PUBLISH probe's answer. complete.lua and release.lua PUBLISH the key
 * after changing it: a user whose ACL forbids the channel (Redis 7 denies
 * channels by default) would see the script fail after its write, so such a
 * connection is refused before any op runs on it. */
static void on_publish_probe(void *ctx, int err, const redisReply *r)
{
    struct link *k = ctx;
    const char *argv[] = { "ROLE" };
    size_t lens[] = { 4 };

    if (err < 0)
        return; /* the connection failed: its down() sees to the rest */
    if (redis_reply_is_error(r, "NOPERM")) {
        link_drop(k, -EACCES,
                  "the Redis user may not PUBLISH to " NOTIFY_CHANNEL
                  ": add &idemproxy:* to its ACL (the scripts publish after they write)",
                  true);
        return;
    }
    if (!k->st->sentinel) {
        link_confirmed(k);
        return;
    }
    if (redis_conn_command(k->conn, 1, argv, lens, on_role, k) < 0)
        link_drop(k, -ECONNRESET, NULL, true);
}

static void link_on_ready(void *ctx)
{
    struct link *k = ctx;
    /* an empty key: waiters ignore it */
    const char *argv[] = { "PUBLISH", NOTIFY_CHANNEL, "" };
    size_t lens[] = { 7, sizeof(NOTIFY_CHANNEL) - 1, 0 };

    if (redis_conn_command(k->conn, 3, argv, lens, on_publish_probe, k) < 0)
        link_drop(k, -ECONNRESET, NULL, true);
}

/* The connection failed; the ops sent on it got the error already. */
static void link_on_down(void *ctx, int err, const char *why)
{
    struct link *k = ctx;

    redis_conn_free(k->conn);
    k->conn = NULL;
    set_ready(k->st, false);
    if (!k->ready)
        backoff_start(k);
    k->ready = false;
    k->last_err = err;
    log_failure(k->st, why);
    op_list_fail(&k->waiting, err);
    rediscover(k->st); /* Sentinel: find the master again on every reconnect */
    k->timer.due_ms = list_is_empty(&k->later) ? k->timer.due_ms : 0;
}

static const struct redis_conn_handlers link_handlers = {
    .ready = link_on_ready,
    .down = link_on_down,
};

/* Fills <o> with where and how to connect now; <why> says why not when
 * there is nowhere yet (returns -ENXIO then). */
int store_redis_target(struct store_redis *st, struct redis_conn_opts *o, char *tls_name,
                       size_t tls_name_len, unsigned *gen, char *why, size_t why_len)
{
    *o = (struct redis_conn_opts){
        .name = st->name,
        .tls = st->tls,
        .tls_name = tls_name,
        .user = st->url.user,
        .password = st->url.password,
        .db = st->url.db,
        .timeout_ms = st->timeout_ms,
    };
    pthread_mutex_lock(&st->addr_mu);
    o->addr = st->addr;
    o->addrlen = st->addrlen;
    *gen = atomic_load(&st->generation);
    snprintf(tls_name, tls_name_len, "%s", st->tls_name[0] ? st->tls_name : st->target_host);
    if (!st->addrlen)
        snprintf(why, why_len, "%s", st->resolve_why);
    pthread_mutex_unlock(&st->addr_mu);
    return o->addrlen ? 0 : -ENXIO;
}

/* Starts a connection, with AUTH and SELECT ahead of everything. */
static int link_connect(struct link *k)
{
    struct store_redis *st = k->st;
    struct redis_conn_opts o;
    struct redis_conn_handlers h = link_handlers;
    char why[sizeof(st->resolve_why)] = "", tls_name[REDIS_URL_HOST_MAX];
    int err;

    if (store_redis_target(st, &o, tls_name, sizeof(tls_name), &k->generation, why, sizeof(why)) <
        0) {
        log_failure(st, why);
        return -ENXIO; /* the name does not resolve (yet): the PING job retries it */
    }
    h.ctx = k;
    err = redis_conn_open(k->loop, &o, &h, &k->conn);
    if (err < 0) {
        snprintf(why, sizeof(why), "cannot connect: %s", strerror(-err));
        log_failure(st, why);
    }
    return err;
}

/* Sends what waits, connects, or fails it fast inside the backoff. */
static void link_dispatch(struct link *k, uint64_t now)
{
    struct op *op;
    int err;

    list_splice(&k->waiting, &k->later);
    if (k->conn && k->generation != atomic_load(&k->st->generation))
        link_drop(k, -ECONNRESET, NULL, false); /* the master moved: go there now */
    if (list_is_empty(&k->waiting))
        return;
    if (k->conn && k->ready) {
        while ((op = op_first(&k->waiting))) {
            list_remove(&op->node);
            if (op_send(k, op) < 0)
                op_finish(op, -ECONNRESET, NULL);
        }
        return;
    }
    if (k->conn)
        return; /* being set up: its ready() or down() sees to them */
    /* Inside the backoff, ops fail fast; but once Redis is known to answer
     * again (the readiness PING or another loop's connection got through),
     * waiting out this loop's backoff (up to 1 s) would only turn away
     * requests that Redis can serve. */
    if (now < k->retry_at_ms && !atomic_load_explicit(&k->st->ready, memory_order_relaxed)) {
        op_list_fail(&k->waiting, k->last_err ? k->last_err : -ECONNREFUSED);
        return;
    }
    err = link_connect(k);
    if (err < 0) {
        set_ready(k->st, false);
        backoff_start(k);
        k->last_err = err;
        op_list_fail(&k->waiting, err);
    }
}

static void link_on_timer(void *ctx)
{
    struct link *k = ctx;

    link_dispatch(k, now_ms());
}

/* Takes the ops other threads queued. */
static void link_take_queue(struct link *k)
{
    pthread_mutex_lock(&k->mu);
    list_splice(&k->later, &k->queue);
    pthread_mutex_unlock(&k->mu);
}

static void link_on_task(void *ctx)
{
    struct link *k = ctx;

    link_take_queue(k);
    link_dispatch(k, now_ms());
}

/* Runs the link until every op it accepted has called back, then closes its
 * connection. On the loop thread, or on any thread once the loop has
 * stopped: either way nothing else drives it meanwhile. No op is accepted
 * any more. */
static void link_finish(void *ctx)
{
    struct link *k = ctx;

    for (;;) {
        bool idle;

        link_take_queue(k);
        link_dispatch(k, now_ms());
        pthread_mutex_lock(&k->mu);
        idle = list_is_empty(&k->queue) && list_is_empty(&k->later) && list_is_empty(&k->waiting) &&
               k->sent == 0;
        pthread_mutex_unlock(&k->mu);
        if (idle)
            break;
        if (k->conn)
            redis_conn_drive(k->conn, 100);
    }
    redis_conn_free(k->conn); /* idle: no op is left on it */
    k->conn = NULL;
    loop_timer_del(k->loop, &k->timer); /* the loop may go on without the store */
}

static int op_new(struct store_redis *st, enum lua_script_id script, struct span key,
                  const struct store_token *tok, store_done_fn *done, void *ctx, struct op **ret)
{
    struct op *op;

    if (!store_call_is_valid(key, tok, done))
        return -EINVAL;
    op = calloc(1, sizeof(*op) + key.len);
    if (!op)
        return -ENOMEM;
    op->st = st;
    op->script = script;
    op->done = done;
    op->ctx = ctx;
    op->tok = *tok;
    op->head = BUF_INIT(HEAD_MAX_BYTES);
    op->key_len = key.len;
    memcpy(op->key, key.base, key.len);
    *ret = op;
    return 0;
}

/* Hands <op> to a connection. On one of the store's loop threads, that
 * loop's own: sent at once when it can be (written once the socket is
 * writable), never called back inside this call. From any other thread,
 * queued for the first loop under its lock. On failure (-ECANCELED: the
 * store is being freed or the loop has stopped) <op> is freed and nothing
 * calls back. */
int store_redis_op_submit(struct op *op)
{
    struct store_redis *st = op->st;
    struct loop *cur = loop_current();
    struct link *k = &st->links[0];
    bool was_empty;
    int err = 0;

    for (unsigned i = 0; cur && i < st->nlinks; i++) {
        if (st->links[i].loop != cur)
            continue;
        k = &st->links[i];
        if (atomic_load_explicit(&st->stopping, memory_order_relaxed)) {
            op_free(op);
            return -ECANCELED;
        }
        if (k->conn && k->ready && k->generation == atomic_load(&st->generation) &&
            op_send(k, op) == 0)
            return 0;
        /* Connecting, or the connection is going: the timer sees to it this turn. */
        list_append(&k->later, &op->node);
        k->timer.due_ms = 0;
        return 0;
    }
    pthread_mutex_lock(&k->mu);
    if (k->stopping) {
        err = -ECANCELED;
    } else {
        /* Only the first op of a batch posts the task: it takes the whole queue. */
        was_empty = list_is_empty(&k->queue);
        list_append(&k->queue, &op->node);
        if (was_empty && (err = loop_post(k->loop, &k->task)) < 0)
            list_remove(&op->node);
    }
    pthread_mutex_unlock(&k->mu);
    if (err < 0)
        op_free(op);
    return err;
}

struct store_redis *store_redis_of(struct store *st) { return (struct store_redis *)st; }

static int redis_acquire(struct store *base, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                         const struct store_token *tok, uint64_t lock_ttl_ms, store_done_fn *done,
                         void *ctx)
{
    struct op *op;
    int err;

    if (!fp || lock_ttl_ms == 0)
        return -EINVAL;
    err = op_new(store_redis_of(base), LUA_ACQUIRE, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    fingerprint_hex(fp, op->fp);
    op->ttl_ms = lock_ttl_ms;
    return store_redis_op_submit(op);
}

static int redis_complete(struct store *base, struct span key, const struct store_token *tok,
                          struct record *rec, uint64_t ttl_ms, store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    if (!rec || ttl_ms == 0)
        return -EINVAL;
    err = op_new(store_redis_of(base), LUA_COMPLETE, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    /* Encoded here so that a record that cannot be stored is refused at once. */
    err = record_encode_head(rec, &op->head);
    if (err < 0) {
        op_free(op);
        return err;
    }
    op->rec = record_ref(rec);
    op->ttl_ms = ttl_ms;
    return store_redis_op_submit(op);
}

static int redis_release(struct store *base, struct span key, const struct store_token *tok,
                         store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    err = op_new(store_redis_of(base), LUA_RELEASE, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    return store_redis_op_submit(op);
}

static int redis_extend(struct store *base, struct span key, const struct store_token *tok,
                        uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    if (lock_ttl_ms == 0)
        return -EINVAL;
    err = op_new(store_redis_of(base), LUA_EXTEND, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    op->ttl_ms = lock_ttl_ms;
    return store_redis_op_submit(op);
}

/* An op that hands <fn> its reply as it is: the command <argv> (OP_RAW),
 * or the inspect script on <key>. Returns 0 or a negative errno (nothing
 * calls back then). */
int store_redis_raw(struct store_redis *st, enum lua_script_id script, int argc, const char **argv,
                    const size_t *lens, redis_reply_fn *fn, void *ctx)
{
    struct op *op;
    size_t key_len = script == LUA_INSPECT ? lens[0] : 0;

    if (argc > (int)ARRAY_SIZE(op->arglen))
        return -EINVAL;
    op = calloc(1, sizeof(*op) + key_len);
    if (!op)
        return -ENOMEM;
    op->st = st;
    op->script = script;
    op->raw = fn;
    op->raw_ctx = ctx;
    op->head = BUF_INIT(SIZE_MAX);
    if (script == LUA_INSPECT) {
        memcpy(op->key, argv[0], key_len);
        op->key_len = key_len;
        op->fp[0] = argv[1][0];
    } else {
        op->argc = argc;
        for (int i = 0; i < argc; i++) {
            op->arglen[i] = lens[i];
            if (buf_append(&op->head, argv[i], lens[i]) < 0) {
                op_free(op);
                return -ENOMEM;
            }
        }
    }
    return store_redis_op_submit(op);
}

static bool redis_is_ready(struct store *base) { return atomic_load(&store_redis_of(base)->ready); }

static int redis_metrics(struct store *base, store_metric_fn *emit, void *ctx)
{
    struct store_redis *st = store_redis_of(base);
    int err = emit(ctx, "idemproxy_redis_connected", "gauge",
                   "1 while the (current) Redis master answers", redis_is_ready(base) ? 1 : 0);

    if (err == 0)
        err = emit(ctx, "idemproxy_redis_failovers_total", "counter",
                   "times the sentinels named another master", atomic_load(&st->failovers));
    return err;
}

/* Looks the host of <st> up (blocking: never on a loop thread) and keeps an
 * address for the loops' connects, IPv4 first (a non-blocking connect takes
 * one address only; Redis listens on IPv4 more often than not, and
 * "localhost" may list ::1 first). A failed lookup keeps the last address,
 * and says why when there is none. */
static void resolve_host(struct store_redis *st)
{
    static const int families[] = { AF_INET, AF_INET6 };
    struct sockaddr_storage addr;
    socklen_t addrlen = 0;
    char port[8], why[sizeof(st->resolve_why)] = "";
    int gai = 0;

    char host[REDIS_URL_HOST_MAX];

    pthread_mutex_lock(&st->addr_mu);
    snprintf(host, sizeof(host), "%s", st->target_host);
    snprintf(port, sizeof(port), "%u", st->target_port);
    pthread_mutex_unlock(&st->addr_mu);
    if (st->sentinel)
        redis_sentinel_resolve(st->sentinel);
    if (!host[0])
        return; /* no master known yet: the sentinels are being asked */
    for (size_t i = 0; i < ARRAY_SIZE(families) && !addrlen; i++) {
        struct addrinfo hints = { .ai_family = families[i],
                                  .ai_socktype = SOCK_STREAM,
                                  .ai_flags = AI_NUMERICSERV };
        struct addrinfo *res = NULL;
        int r = getaddrinfo(host, port, &hints, &res);

        if (r == 0 && res && res->ai_addrlen <= sizeof(addr)) {
            memcpy(&addr, res->ai_addr, res->ai_addrlen);
            addrlen = res->ai_addrlen;
        } else if (r != 0 && gai == 0) {
            gai = r;
        }
        if (res)
            freeaddrinfo(res);
    }
    if (!addrlen)
        snprintf(why, sizeof(why), "the host name %.255s does not resolve: %.100s", host,
                 gai ? gai_strerror(gai) : "no address");
    pthread_mutex_lock(&st->addr_mu);
    if (strcmp(host, st->target_host) != 0) {
        /* the target moved meanwhile: this answer is for the old one */
    } else if (addrlen) {
        st->addr = addr;
        st->addrlen = addrlen;
    } else if (!st->addrlen) {
        snprintf(st->resolve_why, sizeof(st->resolve_why), "%s", why);
    }
    pthread_mutex_unlock(&st->addr_mu);
}

/* ---- Sentinel: the master moves ---- */

/* The sentinels named the master <host>:<port> (on the first loop's thread).
 * A new one takes effect at once: every connection to the old one goes the
 * next time it is used. An IP address needs no lookup; a name is looked up
 * by the next PING job. */
static void on_master(void *ctx, const char *host, unsigned port)
{
    struct store_redis *st = ctx;
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV };
    struct addrinfo *res = NULL;
    char p[8];
    bool moved;

    snprintf(p, sizeof(p), "%u", port);
    pthread_mutex_lock(&st->addr_mu);
    moved = strcmp(st->target_host, host) != 0 || st->target_port != port;
    if (moved) {
        if (st->target_host[0])
            atomic_fetch_add(&st->failovers, 1);
        snprintf(st->target_host, sizeof(st->target_host), "%s", host);
        st->target_port = port;
        st->addrlen = 0;
        snprintf(st->resolve_why, sizeof(st->resolve_why),
                 "the master %.255s:%u the sentinels named does not resolve (yet)", host, port);
        if (getaddrinfo(host, p, &hints, &res) == 0 && res && res->ai_addrlen <= sizeof(st->addr)) {
            memcpy(&st->addr, res->ai_addr, res->ai_addrlen);
            st->addrlen = res->ai_addrlen;
        }
        atomic_fetch_add(&st->generation, 1);
    }
    pthread_mutex_unlock(&st->addr_mu);
    if (res)
        freeaddrinfo(res);
}

/* Asks the sentinels again: a connection failed, or found a replica. */
static void rediscover(struct store_redis *st)
{
    if (st->sentinel)
        redis_sentinel_ask(st->sentinel);
}

/* ---- readiness ---- */

static void ping_done(void *ctx, int err, const struct store_result *res)
{
    (void)ctx, (void)err, (void)res; /* on_op_reply() set the ready flag */
}

/* Every PING_INTERVAL_MS, on a pool thread: looks the host up again, and
 * PINGs Redis on the first loop's connection (connecting it when it has
 * none), so that /readyz follows Redis without traffic. */
static void ping_run(void *arg)
{
    struct store_redis *st = arg;
    struct op *op;

    resolve_host(st); /* for the loops' next connects */
    op = calloc(1, sizeof(*op));
    if (!op)
        return;
    op->st = st;
    op->script = OP_PING;
    op->done = ping_done;
    op->head = BUF_INIT(0);
    (void)store_redis_op_submit(op); /* refused only while the store stops */
}

static void redis_free(struct store *base)
{
    struct store_redis *st = store_redis_of(base);

    store_redis_notify_stop(st->sub);
    worker_every_stop(st->pinger); /* waits for a ping in progress */
    /* Refuse new ops everywhere first: a callback run while one connection
     * finishes could otherwise call on another that has finished already. */
    atomic_store(&st->stopping, true);
    for (unsigned i = 0; i < st->nlinks; i++) {
        pthread_mutex_lock(&st->links[i].mu);
        st->links[i].stopping = true;
        pthread_mutex_unlock(&st->links[i].mu);
    }
    /* Each is finished by its loop thread, or right here once its loop has
     * stopped: everything accepted calls back before this returns. */
    for (unsigned i = 0; i < st->nlinks; i++)
        loop_call(st->links[i].loop, link_finish, &st->links[i]);
    redis_sentinel_free(st->sentinel); /* no link is left to ask it */
    store_calls_done(&st->calls);      /* inspect and purge */

    for (unsigned i = 0; i < st->nlinks; i++)
        pthread_mutex_destroy(&st->links[i].mu);
    free(st->links);
    pthread_mutex_destroy(&st->addr_mu);
    pthread_mutex_destroy(&st->log_mu);
    redis_url_done(&st->url);
    redis_tls_free(st->tls);
    free(st);
}

static const struct store_ops redis_ops = {
    .name = "redis",
    .acquire = redis_acquire,
    .complete = redis_complete,
    .release = redis_release,
    .extend = redis_extend,
    .inspect = store_redis_inspect,
    .purge = store_redis_purge,
    .set_notify = store_redis_set_notify,
    .is_ready = redis_is_ready,
    .metrics = redis_metrics,
    .free = redis_free,
};

int store_redis_new(const struct store_redis_opts *o, struct worker_pool *pool,
                    struct loop *const *loops, unsigned nloops, struct store **ret, char *why,
                    size_t why_len)
{
    struct store_redis *st;
    int err;

    if (why && why_len)
        why[0] = '\0';
    if (!pool || o->timeout_ms == 0 || !loops || nloops == 0)
        return -EINVAL;
    for (unsigned i = 0; i < nloops; i++) {
        if (!loops[i])
            return -EINVAL;
    }
    st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    err = redis_url_parse(o->url, &st->url, why, why_len);
    if (err < 0) {
        free(st);
        return err;
    }
    if (st->url.kind == REDIS_URL_SEEDS) {
        redis_url_done(&st->url);
        free(st);
        return -ENOTSUP; /* Cluster: not yet */
    }
    if (o->password) {
        char *pw = strdup(o->password);

        if (!pw) {
            redis_url_done(&st->url);
            free(st);
            return -ENOMEM;
        }
        if (st->url.password) {
            explicit_bzero(st->url.password, strlen(st->url.password));
            free(st->url.password);
        }
        st->url.password = pw;
    }
    if (st->url.tls) {
        err = redis_tls_new(&o->tls, &st->tls, why, why_len);
        if (err < 0) {
            redis_url_done(&st->url);
            free(st);
            return err;
        }
    }
    snprintf(st->tls_name, sizeof(st->tls_name), "%s",
             o->tls_server_name ? o->tls_server_name : ""); /* "": the target's host */
    st->base.ops = &redis_ops;
    st->pool = pool;
    st->timeout_ms = o->timeout_ms;
    atomic_init(&st->ready, false);
    atomic_init(&st->stopping, false);
    pthread_mutex_init(&st->addr_mu, NULL);
    pthread_mutex_init(&st->log_mu, NULL);
    if (st->url.kind == REDIS_URL_SENTINEL) {
        snprintf(st->name, sizeof(st->name), "master '%.200s'", st->url.master);
        snprintf(st->resolve_why, sizeof(st->resolve_why),
                 "no master known yet: the sentinels are being asked");
    } else {
        redis_addr_format(&st->url.hosts[0], st->name, sizeof(st->name));
        snprintf(st->target_host, sizeof(st->target_host), "%s", st->url.hosts[0].host);
        st->target_port = st->url.hosts[0].port;
    }
    resolve_host(st); /* here, before any loop runs; then by the PING job */
    store_calls_init(&st->calls);
    st->links = calloc(nloops, sizeof(*st->links));
    for (unsigned i = 0; st->links && i < nloops; i++) {
        list_init(&st->links[i].queue);
        list_init(&st->links[i].later);
        list_init(&st->links[i].waiting);
    }
    if (!st->links) {
        redis_free(&st->base);
        return -ENOMEM;
    }
    for (unsigned i = 0; i < nloops; i++) {
        struct link *k = &st->links[i];

        k->st = st;
        k->loop = loops[i];
        k->timer = (struct loop_timer){ .fn = link_on_timer, .ctx = k, .due_ms = UINT64_MAX };
        k->task = (struct loop_task){ .fn = link_on_task, .ctx = k };
        pthread_mutex_init(&k->mu, NULL);
        st->nlinks++;
        (void)loop_timer_add(loops[i], &k->timer); /* taken back by link_finish() */
    }
    if (st->url.kind == REDIS_URL_SENTINEL) {
        err = redis_sentinel_new(loops[0],
                                 &(struct redis_sentinel_opts){ .url = &st->url,
                                                                .tls = st->tls,
                                                                .timeout_ms = st->timeout_ms,
                                                                .master = on_master,
                                                                .ctx = st },
                                 &st->sentinel);
        if (err < 0) {
            redis_free(&st->base);
            return err;
        }
    }
    /* The first ping at once (it waits for the first loop to start): /readyz
     * should not wait a whole interval. */
    err = worker_every_start(pool, 0, PING_INTERVAL_MS, ping_run, st, &st->pinger);
    if (err < 0) {
        redis_free(&st->base);
        return err;
    }
    *ret = &st->base;
    return 0;
}
