/* SPDX-License-Identifier: MIT */
/* The Redis store. The hot operations (acquire, complete, release, extend)
 * each run one embedded Lua script (EVALSHA, EVAL on NOSCRIPT) on an
 * asynchronous hiredis connection of the calling event loop's own, driven by
 * that loop: a request's ops are sent and answered on the thread that serves
 * it, without waking another. Ops queued in one loop turn go out in one write
 * (pipelining); replies call back on the loop thread, in order. Ops from
 * other threads (heartbeats, --wait retries) are queued for the first loop.
 * The operator calls (inspect, purge), the readiness PING and the --wait
 * subscriber stay on blocking connections: one per worker pool thread, used
 * by that thread only, so no lock guards them. */
#include "idemproxy/store_redis.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "idemproxy/buf.h"
#include "idemproxy/http.h"
#include "idemproxy/idemkey.h"
#include "idemproxy/list.h"
#include "idemproxy/loop.h"
#include "idemproxy/record.h"
#include "idemproxy/log.h"
#include "idemproxy/redis_conn.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/store_impl.h"
#include "idemproxy/worker.h"
#include "lua_scripts.h"

#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 1000
#define PING_INTERVAL_MS 1000
#define OP_PING _LUA_MAX /* an op that is no script: the readiness PING */
#define NOTIFY_CHANNEL "idemproxy:done" /* complete.lua and release.lua publish the key */
#define HEAD_MAX_BYTES (64u << 20)      /* far above what RECORD_MAX_HEADERS headers can need */

struct sync_conn {
    redisContext *ctx;    /* owned; NULL: not connected */
    uint64_t retry_at_ms; /* no connect attempt before this */
    uint64_t backoff_ms;  /* the wait after the last failed connect; 0: it worked */
};

struct store_redis;

/* The thread that listens to NOTIFY_CHANNEL on a connection of its own (a
 * subscribed connection can do nothing else), for --wait. */
struct subscriber {
    struct store_redis *st;
    store_notify_fn *fn;
    void *ctx;
    pthread_t thread;
    pthread_mutex_t mu; /* guards stop and fd */
    pthread_cond_t wake;
    bool stop;
    int fd; /* of the live connection, -1: none; shut down to stop the thread */
};

/* One event loop's connection for the hot operations, driven by that loop
 * (redis_conn.h), with a timer for work put off to a later turn and a task
 * for ops queued from other threads. Everything below <stopping> belongs to
 * the loop thread (or, once the loop has stopped, to the thread freeing the
 * store). */
struct link {
    struct store_redis *st;
    struct loop *loop;       /* borrowed */
    struct loop_timer timer; /* registered on <loop> for good */
    struct loop_task task;   /* posted when <queue> stops being empty */
    pthread_mutex_t mu;
    struct list queue;       /* guarded by mu: struct op from other threads */
    bool stopping;           /* guarded by mu: refuse ops from other threads */
    struct redis_conn *conn; /* NULL: none */
    bool ready;              /* <conn> is set up */
    uint64_t retry_at_ms;    /* no connect attempt before this */
    uint64_t backoff_ms;     /* the wait after the last failed connect; 0: it worked */
    int last_err;            /* what ops get inside the backoff */
    size_t sent;             /* ops on <conn>, not answered yet */
    struct list later;       /* struct op called on the loop thread, not sendable at once */
    struct list waiting;     /* waiting for the connection to be set up */
};

struct store_redis {
    struct store base;
    struct worker_pool *pool; /* borrowed */
    struct redis_url url;     /* owned */
    struct timeval timeout;
    uint64_t timeout_ms;

    /* The host's address: the loops connect to it, so that no loop thread
     * ever waits on a name lookup. Looked up when the store is made and
     * again with every readiness PING, on a pool thread. */
    pthread_mutex_t addr_mu;
    struct sockaddr_storage addr;
    socklen_t addrlen;     /* 0 while the name has not resolved */
    char resolve_why[400]; /* why it did not, for the log */
    char name[300];        /* host:port, for the log */
    pthread_mutex_t log_mu;
    char logged_why[400]; /* the last failure logged, "" once connected again */

    struct link *links; /* owned array, one per loop */
    unsigned nlinks;
    atomic_bool stopping;    /* refuse ops called on a loop thread */
    struct sync_conn *conns; /* owned array, one per pool thread, used by that thread only */
    unsigned nconns;
    atomic_bool ready;
    struct store_calls calls;
    struct worker_every *pinger; /* owned: PINGs every PING_INTERVAL_MS */
    struct subscriber *sub;      /* owned; NULL unless store_set_notify() was called */
};

/* One accepted hot operation, owned by the store until it calls back. */
struct op {
    struct store_redis *st;
    struct link *link;     /* the connection it was sent on */
    struct list_node node; /* on the queue, later or waiting */
    bool eval;             /* Redis said NOSCRIPT: sent again as EVAL */
    enum lua_script_id script;
    store_done_fn *done;
    void *ctx;
    struct store_token tok;
    char fp[FINGERPRINT_HEX + 1]; /* acquire */
    uint64_t ttl_ms;              /* acquire, complete, extend */
    struct record *rec;           /* complete: own reference, for the body */
    struct buf head;              /* complete: the encoded head */
    size_t key_len;
    char key[];
};

/* ---- connections ---- */

/* AUTH [USER] PASSWORD, for <u> with a password. Returns argc. */
static int auth_args(const struct redis_url *u, const char **argv, size_t *lens)
{
    int argc = 0;

    argv[argc] = "AUTH";
    lens[argc++] = 4;
    if (u->user) {
        argv[argc] = u->user;
        lens[argc++] = strlen(u->user);
    }
    argv[argc] = u->password;
    lens[argc++] = strlen(u->password);
    return argc;
}

/* The error of a failed command on <c>; <saved_errno> is errno right after it. */
static int command_error(const redisContext *c, int saved_errno)
{
    switch (c->err) {
    case REDIS_ERR_IO:
        /* SO_RCVTIMEO/SO_SNDTIMEO expiring shows as EAGAIN */
        if (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK || saved_errno == ETIMEDOUT)
            return -ETIMEDOUT;
        return -ECONNRESET;
    case REDIS_ERR_PROTOCOL:
        return -EPROTO;
    case REDIS_ERR_OOM:
        return -ENOMEM;
    default: /* REDIS_ERR_EOF, REDIS_ERR_OTHER */
        return -ECONNRESET;
    }
}

static void conn_close(struct sync_conn *rc)
{
    redisFree(rc->ctx);
    rc->ctx = NULL;
}

/* Runs a setup command (AUTH, SELECT) on a new connection: anything but a
 * status reply fails the connection. */
static int conn_setup_command(redisContext *c, int argc, const char **argv, const size_t *lens)
{
    redisReply *reply = redisCommandArgv(c, argc, argv, lens);
    int err;

    if (!reply)
        return command_error(c, errno);
    err = reply->type == REDIS_REPLY_STATUS ? 0 : -EPROTO;
    freeReplyObject(reply);
    return err;
}

static int conn_open(struct store_redis *st, redisContext **ret)
{
    redisContext *c =
        redisConnectWithTimeout(st->url.hosts[0].host, (int)st->url.hosts[0].port, st->timeout);
    int saved_errno = errno, err = 0;

    if (!c)
        return -ENOMEM;
    if (c->err) {
        if (c->err == REDIS_ERR_IO &&
            (saved_errno == ETIMEDOUT || saved_errno == EAGAIN || saved_errno == EINPROGRESS))
            err = -ETIMEDOUT;
        else
            err = -ECONNREFUSED; /* refused, unreachable, or a name that does not resolve */
        goto fail;
    }
    if (redisSetTimeout(c, st->timeout) != REDIS_OK || redisEnableKeepAlive(c) != REDIS_OK) {
        err = -ECONNRESET;
        goto fail;
    }
    if (st->url.password) {
        const char *argv[3];
        size_t lens[3];
        int argc = auth_args(&st->url, argv, lens);

        err = conn_setup_command(c, argc, argv, lens);
        if (err < 0)
            goto fail;
    }
    if (st->url.db != 0) {
        char db[16];
        const char *argv[] = { "SELECT", db };
        size_t lens[] = { 6, (size_t)snprintf(db, sizeof(db), "%u", st->url.db) };

        err = conn_setup_command(c, 2, argv, lens);
        if (err < 0)
            goto fail;
    }
    *ret = c;
    return 0;

fail:
    redisFree(c);
    return err;
}

/* The connection of the calling pool thread, connecting it if needed. While
 * a failed connect's backoff runs, fails at once with -ECONNREFUSED. */
static int conn_get(struct store_redis *st, struct sync_conn **ret)
{
    int idx = worker_current_index();
    struct sync_conn *rc;
    uint64_t now;
    int err;

    assert(idx >= 0 && (unsigned)idx < st->nconns);
    rc = &st->conns[idx];
    if (!rc->ctx) {
        now = now_ms();
        if (now < rc->retry_at_ms)
            return -ECONNREFUSED;
        err = conn_open(st, &rc->ctx);
        if (err < 0) {
            rc->backoff_ms = rc->backoff_ms ? rc->backoff_ms * 2 : BACKOFF_FIRST_MS;
            if (rc->backoff_ms > BACKOFF_MAX_MS)
                rc->backoff_ms = BACKOFF_MAX_MS;
            rc->retry_at_ms = now_ms() + rc->backoff_ms;
            return err;
        }
        rc->backoff_ms = 0;
        rc->retry_at_ms = 0;
    }
    *ret = rc;
    return 0;
}

static bool is_error_reply(const redisReply *r, const char *prefix)
{
    size_t n = strlen(prefix);

    return r->type == REDIS_REPLY_ERROR && r->len >= n && memcmp(r->str, prefix, n) == 0 &&
           (r->len == n || r->str[n] == ' ');
}

/* Runs one command on this thread's connection. Returns 0 with the reply
 * (any type, error replies included) in <ret>, or the connection's error,
 * after which the connection is closed. Updates the ready flag. */
static int command(struct store_redis *st, int argc, const char **argv, const size_t *lens,
                   redisReply **ret)
{
    struct sync_conn *rc;
    redisReply *reply;
    int err;

    err = conn_get(st, &rc);
    if (err < 0)
        goto fail;
    reply = redisCommandArgv(rc->ctx, argc, argv, lens);
    if (!reply) {
        err = command_error(rc->ctx, errno);
        conn_close(rc); /* its state is unknown: a later call starts on a fresh one */
        goto fail;
    }
    /* Redis answers, but an error (LOADING, MISCONF, OOM, NOAUTH…) means it
     * cannot serve us; NOSCRIPT only means the script cache was emptied. */
    atomic_store(&st->ready, reply->type != REDIS_REPLY_ERROR || is_error_reply(reply, "NOSCRIPT"));
    *ret = reply;
    return 0;

fail:
    atomic_store(&st->ready, false);
    return err;
}

/* Runs the script <id> with <argv>[3..argc-1] as key and arguments: EVALSHA
 * with the build-time SHA-1 first; on NOSCRIPT (SCRIPT FLUSH, a restarted
 * Redis) EVAL with the source, which also caches it again. */
static int run_script(struct store_redis *st, enum lua_script_id id, int argc, const char **argv,
                      size_t *lens, redisReply **ret)
{
    const struct lua_script *s = &lua_scripts[id];
    redisReply *reply;
    int err;

    argv[0] = "EVALSHA";
    lens[0] = 7;
    argv[1] = s->sha1;
    lens[1] = strlen(s->sha1);
    argv[2] = "1"; /* one key */
    lens[2] = 1;
    err = command(st, argc, argv, lens, &reply);
    if (err == 0 && is_error_reply(reply, "NOSCRIPT")) {
        freeReplyObject(reply);
        argv[0] = "EVAL";
        lens[0] = 4;
        argv[1] = s->src;
        lens[1] = s->len;
        err = command(st, argc, argv, lens, &reply);
    }
    if (err < 0)
        return err;
    *ret = reply;
    return 0;
}

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

/* Sends the script of <op> on the link's connection (EVALSHA, or EVAL once
 * Redis said NOSCRIPT): appended to the output, which goes out with every
 * other op of this loop turn in one write (pipelining). */
static int op_send(struct link *k, struct op *op)
{
    const struct lua_script *s = &lua_scripts[op->script < OP_PING ? op->script : 0];
    const char *argv[8];
    size_t lens[8];
    char ttl[24];
    int argc = 0, err;

    if (op->script == OP_PING) {
        argv[argc] = "PING";
        lens[argc++] = 4;
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
    default: /* LUA_RELEASE, LUA_EXTEND */
        argv[argc] = op->tok.hex;
        lens[argc++] = STORE_TOKEN_HEX;
        break;
    }
    if (op->script != LUA_RELEASE) {
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

static void link_on_ready(void *ctx)
{
    struct link *k = ctx;

    k->ready = true;
    k->backoff_ms = 0;
    k->last_err = 0;
    set_ready(k->st, true);
    log_recovery(k->st);
    link_dispatch(k, now_ms());
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
    k->timer.due_ms = list_is_empty(&k->later) ? k->timer.due_ms : 0;
}

static const struct redis_conn_handlers link_handlers = {
    .ready = link_on_ready,
    .down = link_on_down,
};

/* Starts a connection, with AUTH and SELECT ahead of everything. */
static int link_connect(struct link *k)
{
    struct store_redis *st = k->st;
    struct redis_conn_opts o = {
        .name = st->name,
        .tls_name = st->url.hosts[0].host,
        .user = st->url.user,
        .password = st->url.password,
        .db = st->url.db,
        .timeout_ms = st->timeout_ms,
    };
    struct redis_conn_handlers h = link_handlers;
    char why[sizeof(st->resolve_why)] = "";
    int err;

    pthread_mutex_lock(&st->addr_mu);
    o.addr = st->addr;
    o.addrlen = st->addrlen;
    if (!st->addrlen)
        snprintf(why, sizeof(why), "%s", st->resolve_why);
    pthread_mutex_unlock(&st->addr_mu);
    if (!o.addrlen) {
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
static int op_submit(struct op *op)
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
        if (k->conn && k->ready && op_send(k, op) == 0)
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

static struct store_redis *to_redis(struct store *st) { return (struct store_redis *)st; }

static int redis_acquire(struct store *base, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                         const struct store_token *tok, uint64_t lock_ttl_ms, store_done_fn *done,
                         void *ctx)
{
    struct op *op;
    int err;

    if (!fp || lock_ttl_ms == 0)
        return -EINVAL;
    err = op_new(to_redis(base), LUA_ACQUIRE, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    fingerprint_hex(fp, op->fp);
    op->ttl_ms = lock_ttl_ms;
    return op_submit(op);
}

static int redis_complete(struct store *base, struct span key, const struct store_token *tok,
                          struct record *rec, uint64_t ttl_ms, store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    if (!rec || ttl_ms == 0)
        return -EINVAL;
    err = op_new(to_redis(base), LUA_COMPLETE, key, tok, done, ctx, &op);
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
    return op_submit(op);
}

static int redis_release(struct store *base, struct span key, const struct store_token *tok,
                         store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    err = op_new(to_redis(base), LUA_RELEASE, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    return op_submit(op);
}

static int redis_extend(struct store *base, struct span key, const struct store_token *tok,
                        uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    if (lock_ttl_ms == 0)
        return -EINVAL;
    err = op_new(to_redis(base), LUA_EXTEND, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    op->ttl_ms = lock_ttl_ms;
    return op_submit(op);
}

/* ---- for operators: inspect and purge ---- */

/* One inspect or purge call, owned by its job. */
/* Appends <s> to <b> with the glob characters of SCAN MATCH escaped. */
static int append_glob_escaped(struct buf *b, struct span s)
{
    for (size_t i = 0; i < s.len; i++) {
        int err = s.base[i] && strchr("*?[]\\", s.base[i]) ? buf_append(b, "\\", 1) : 0;

        if (err == 0)
            err = buf_append(b, &s.base[i], 1);
        if (err < 0)
            return err;
    }
    return 0;
}

static bool reply_is(const redisReply *r, int type) { return r && r->type == type; }

/* Reads one store key with the inspect script into <info>. Returns 1 when
 * filled, 0 when the key went meanwhile, or a negative errno. */
static int inspect_key(struct store_redis *st, const redisReply *k, bool with_body,
                       struct store_info *info)
{
    const char *argv[5];
    size_t lens[5];
    redisReply *r = NULL, **el;
    int err;

    argv[3] = k->str;
    lens[3] = k->len;
    argv[4] = with_body ? "1" : "0";
    lens[4] = 1;
    err = run_script(st, LUA_INSPECT, 5, argv, lens, &r);
    if (err < 0)
        return err;
    err = -EPROTO;
    if (reply_is(r, REDIS_REPLY_ARRAY) && r->elements == 0) {
        err = 0;
        goto out;
    }
    if (!reply_is(r, REDIS_REPLY_ARRAY) || r->elements != 7)
        goto out;
    el = r->element;
    if (!reply_is(el[0], REDIS_REPLY_STRING) || !reply_is(el[1], REDIS_REPLY_STRING) ||
        el[1]->len != FINGERPRINT_HEX || !reply_is(el[5], REDIS_REPLY_INTEGER) ||
        !reply_is(el[6], REDIS_REPLY_INTEGER))
        goto out;
    *info = (struct store_info){ .completed = el[0]->len == 1 && el[0]->str[0] == 'C' };
    memcpy(info->fp_hex, el[1]->str, FINGERPRINT_HEX);
    info->fp_hex[FINGERPRINT_HEX] = '\0';
    info->ttl_ms = el[5]->integer > 0 ? (uint64_t)el[5]->integer : 0;
    if (reply_is(el[2], REDIS_REPLY_STRING)) {
        long long ts = strtoll(el[2]->str, NULL, 10);

        info->age_ms = el[6]->integer > ts ? (uint64_t)(el[6]->integer - ts) : 0;
    }
    if (info->completed && reply_is(el[3], REDIS_REPLY_STRING)) {
        struct span body = { "", 0 };

        if (reply_is(el[4], REDIS_REPLY_STRING))
            body = (struct span){ el[4]->str, el[4]->len };
        err = record_decode((struct span){ el[3]->str, el[3]->len }, body, &info->rec);
        if (err < 0) {
            err = err == -ENOMEM ? err : -EPROTO;
            goto out;
        }
    }
    info->store_key = strndup(k->str, k->len);
    if (!info->store_key) {
        record_unref(info->rec);
        err = -ENOMEM;
        goto out;
    }
    err = 1;
out:
    freeReplyObject(r);
    return err;
}

/* SCANs for the keys of job->key under every scope (never KEYS: it would
 * stall Redis on a large database), then reads each with the inspect script. */
static int inspect_all(struct store_admin_job *job, struct store_info_list *list)
{
    struct span prefix = { job->prefix, job->prefix_len }, key = { job->key, job->key_len };
    struct buf pattern = BUF_INIT(4096);
    char cursor[32] = "0";
    size_t cap = 0;
    int err;

    err = append_glob_escaped(&pattern, prefix);
    for (int i = 0; err == 0 && i < IDEMKEY_SCOPE_HEX; i++)
        err = buf_append(&pattern, "?", 1);
    if (err == 0)
        err = buf_append(&pattern, ":", 1);
    if (err == 0)
        err = append_glob_escaped(&pattern, key);
    if (err < 0)
        goto out;
    do {
        const char *argv[] = { "SCAN", cursor, "MATCH", pattern.data, "COUNT", "1000" };
        size_t lens[] = { 4, strlen(cursor), 5, pattern.len, 5, 4 };
        redisReply *r = NULL;
        const redisReply *keys;

        err = command(job->st, 6, argv, lens, &r);
        if (err < 0)
            goto out;
        if (!reply_is(r, REDIS_REPLY_ARRAY) || r->elements != 2 ||
            !reply_is(r->element[0], REDIS_REPLY_STRING) || r->element[0]->len >= sizeof(cursor) ||
            !reply_is(r->element[1], REDIS_REPLY_ARRAY)) {
            freeReplyObject(r);
            err = -EPROTO;
            goto out;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len);
        cursor[r->element[0]->len] = '\0';
        keys = r->element[1];
        for (size_t i = 0; i < keys->elements && err >= 0; i++) {
            struct store_info info;

            if (!reply_is(keys->element[i], REDIS_REPLY_STRING) ||
                !idemkey_store_key_matches(
                    (struct span){ keys->element[i]->str, keys->element[i]->len }, prefix, key))
                continue;
            err = inspect_key(job->st, keys->element[i], job->with_body, &info);
            if (err == 1 && (err = store_info_list_add(list, &cap, &info)) < 0) {
                free(info.store_key);
                record_unref(info.rec);
            }
        }
        freeReplyObject(r);
    } while (err >= 0 && strcmp(cursor, "0") != 0);
out:
    buf_done(&pattern);
    return err < 0 ? err : 0;
}

static void inspect_run(void *arg)
{
    struct store_admin_job *job = arg;
    struct store_redis *st = job->st;
    struct store_info_list list = { 0 };
    int err = inspect_all(job, &list);

    if (err < 0)
        store_info_list_done(&list);
    job->list_done(job->ctx, err, &list);
    store_info_list_done(&list);
    store_admin_job_free(job);
    store_calls_end(&st->calls);
}

static void purge_run(void *arg)
{
    struct store_admin_job *job = arg;
    struct store_redis *st = job->st;
    struct store_result res = { .status = STORE_OK };
    const char *argv[] = { "DEL", job->key };
    size_t lens[] = { 3, job->key_len };
    redisReply *r = NULL;
    int err = command(st, 2, argv, lens, &r);

    if (err == 0) {
        err = !reply_is(r, REDIS_REPLY_INTEGER) ? -EPROTO : r->integer == 0 ? -ENOENT : 0;
        freeReplyObject(r);
    }
    job->done(job->ctx, err, err == 0 ? &res : NULL);
    store_admin_job_free(job);
    store_calls_end(&st->calls);
}

static int redis_inspect(struct store *base, struct span prefix, struct span key, bool with_body,
                         store_list_fn *done, void *ctx)
{
    struct store_redis *st = to_redis(base);

    if (!done || !key.base || key.len == 0)
        return -EINVAL;
    return store_admin_job_submit(
        &st->calls, st->pool, inspect_run,
        &(struct store_admin_job){
            .st = st, .list_done = done, .ctx = ctx, .with_body = with_body },
        prefix, key);
}

static int redis_purge(struct store *base, struct span store_key, store_done_fn *done, void *ctx)
{
    struct store_redis *st = to_redis(base);

    if (!done || !store_key.base || store_key.len == 0)
        return -EINVAL;
    return store_admin_job_submit(&st->calls, st->pool, purge_run,
                                  &(struct store_admin_job){ .st = st, .done = done, .ctx = ctx },
                                  (struct span){ NULL, 0 }, store_key);
}

/* ---- notifications for --wait ---- */

/* Waits <ms> or until stopped. Returns true when stopped. Takes sub->mu. */
static bool sub_sleep(struct subscriber *sub, uint64_t ms)
{
    uint64_t due = now_ms() + ms;
    struct timespec ts = { .tv_sec = (time_t)(due / 1000),
                           .tv_nsec = (long)(due % 1000) * 1000000L };
    bool stop;

    pthread_mutex_lock(&sub->mu);
    while (!sub->stop && pthread_cond_timedwait(&sub->wake, &sub->mu, &ts) == 0)
        ;
    stop = sub->stop;
    pthread_mutex_unlock(&sub->mu);
    return stop;
}

/* Subscribes and passes on every key published, until the connection fails. */
static void sub_listen(struct subscriber *sub, redisContext *c)
{
    static const struct timeval forever = { 0, 0 };
    redisReply *r = NULL;

    if (redisSetTimeout(c, forever) != REDIS_OK)
        return;
    r = redisCommand(c, "SUBSCRIBE %s", NOTIFY_CHANNEL);
    if (!r || r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        return;
    }
    freeReplyObject(r);
    while (redisGetReply(c, (void **)&r) == REDIS_OK) {
        if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
            reply_str_eq(r->element[0], "message") && r->element[2]->type == REDIS_REPLY_STRING)
            sub->fn(sub->ctx, (struct span){ r->element[2]->str, r->element[2]->len });
        freeReplyObject(r);
        r = NULL;
    }
}

static void *sub_main(void *arg)
{
    struct subscriber *sub = arg;
    uint64_t backoff = BACKOFF_FIRST_MS;

    for (;;) {
        redisContext *c = NULL;
        bool stop;

        if (conn_open(sub->st, &c) < 0) {
            if (sub_sleep(sub, backoff))
                return NULL;
            backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
            continue;
        }
        backoff = BACKOFF_FIRST_MS;
        /* Published under the lock that stop is set under: either the stopper
         * sees the descriptor and shuts it down, or this thread sees stop. */
        pthread_mutex_lock(&sub->mu);
        stop = sub->stop;
        sub->fd = stop ? -1 : c->fd;
        pthread_mutex_unlock(&sub->mu);
        if (!stop)
            sub_listen(sub, c);
        pthread_mutex_lock(&sub->mu);
        sub->fd = -1;
        stop = sub->stop;
        pthread_mutex_unlock(&sub->mu);
        redisFree(c);
        if (stop || sub_sleep(sub, BACKOFF_FIRST_MS))
            return NULL;
    }
}

static void sub_stop(struct subscriber *sub)
{
    if (!sub)
        return;
    pthread_mutex_lock(&sub->mu);
    sub->stop = true;
    if (sub->fd >= 0)
        shutdown(sub->fd, SHUT_RDWR); /* ends the blocking read */
    pthread_cond_broadcast(&sub->wake);
    pthread_mutex_unlock(&sub->mu);
    pthread_join(sub->thread, NULL);
    pthread_cond_destroy(&sub->wake);
    pthread_mutex_destroy(&sub->mu);
    free(sub);
}

static int redis_set_notify(struct store *base, store_notify_fn *fn, void *ctx)
{
    struct store_redis *st = to_redis(base);
    struct subscriber *sub;

    if (!fn || st->sub)
        return -EINVAL;
    sub = calloc(1, sizeof(*sub));
    if (!sub)
        return -ENOMEM;
    *sub = (struct subscriber){ .st = st, .fn = fn, .ctx = ctx, .fd = -1 };
    pthread_mutex_init(&sub->mu, NULL);
    pthread_cond_init(&sub->wake, NULL);
    if (pthread_create(&sub->thread, NULL, sub_main, sub) != 0) {
        pthread_cond_destroy(&sub->wake);
        pthread_mutex_destroy(&sub->mu);
        free(sub);
        return -EAGAIN;
    }
    st->sub = sub;
    return 0;
}

static bool redis_is_ready(struct store *base) { return atomic_load(&to_redis(base)->ready); }

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

    snprintf(port, sizeof(port), "%u", st->url.hosts[0].port);
    for (size_t i = 0; i < ARRAY_SIZE(families) && !addrlen; i++) {
        struct addrinfo hints = { .ai_family = families[i],
                                  .ai_socktype = SOCK_STREAM,
                                  .ai_flags = AI_NUMERICSERV };
        struct addrinfo *res = NULL;
        int r = getaddrinfo(st->url.hosts[0].host, port, &hints, &res);

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
        snprintf(why, sizeof(why), "the host name %.255s does not resolve: %.100s", st->url.hosts[0].host,
                 gai ? gai_strerror(gai) : "no address");
    pthread_mutex_lock(&st->addr_mu);
    if (addrlen) {
        st->addr = addr;
        st->addrlen = addrlen;
    } else if (!st->addrlen) {
        snprintf(st->resolve_why, sizeof(st->resolve_why), "%s", why);
    }
    pthread_mutex_unlock(&st->addr_mu);
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
    (void)op_submit(op); /* refused only while the store stops */
}

static void redis_free(struct store *base)
{
    struct store_redis *st = to_redis(base);

    sub_stop(st->sub);
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
    store_calls_done(&st->calls); /* inspect and purge */

    for (unsigned i = 0; i < st->nlinks; i++)
        pthread_mutex_destroy(&st->links[i].mu);
    free(st->links);
    for (unsigned i = 0; st->conns && i < st->nconns; i++)
        conn_close(&st->conns[i]);
    free(st->conns);
    pthread_mutex_destroy(&st->addr_mu);
    pthread_mutex_destroy(&st->log_mu);
    redis_url_done(&st->url);
    free(st);
}

static const struct store_ops redis_ops = {
    .name = "redis",
    .acquire = redis_acquire,
    .complete = redis_complete,
    .release = redis_release,
    .extend = redis_extend,
    .inspect = redis_inspect,
    .purge = redis_purge,
    .set_notify = redis_set_notify,
    .is_ready = redis_is_ready,
    .free = redis_free,
};

int store_redis_new(const char *url, struct worker_pool *pool, uint64_t timeout_ms,
                    struct loop *const *loops, unsigned nloops, struct store **ret)
{
    struct store_redis *st;
    int err;

    if (!pool || timeout_ms == 0 || !loops || nloops == 0)
        return -EINVAL;
    for (unsigned i = 0; i < nloops; i++) {
        if (!loops[i])
            return -EINVAL;
    }
    st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    err = redis_url_parse(url, &st->url, NULL, 0);
    if (err < 0) {
        free(st);
        return err;
    }
    if (st->url.tls || st->url.kind != REDIS_URL_SERVER) {
        redis_url_done(&st->url);
        free(st);
        return -ENOTSUP; /* rediss://, Sentinel and Cluster: not yet */
    }
    st->base.ops = &redis_ops;
    st->pool = pool;
    st->timeout = (struct timeval){ .tv_sec = (time_t)(timeout_ms / 1000),
                                    .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000 };
    st->timeout_ms = timeout_ms;
    atomic_init(&st->ready, false);
    atomic_init(&st->stopping, false);
    pthread_mutex_init(&st->addr_mu, NULL);
    pthread_mutex_init(&st->log_mu, NULL);
    redis_addr_format(&st->url.hosts[0], st->name, sizeof(st->name));
    resolve_host(st); /* here, before any loop runs; then by the PING job */
    store_calls_init(&st->calls);
    st->nconns = worker_pool_size(pool);
    st->conns = calloc(st->nconns, sizeof(*st->conns));
    st->links = calloc(nloops, sizeof(*st->links));
    for (unsigned i = 0; st->links && i < nloops; i++) {
        list_init(&st->links[i].queue);
        list_init(&st->links[i].later);
        list_init(&st->links[i].waiting);
    }
    if (!st->conns || !st->links) {
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
