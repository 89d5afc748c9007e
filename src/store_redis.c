/* SPDX-License-Identifier: MIT */
/* The Redis store. The hot operations (acquire, complete, release, extend)
 * each run one embedded Lua script (EVALSHA, EVAL on NOSCRIPT) on one
 * asynchronous hiredis connection, owned by one loop thread: callers queue
 * ops, the loop sends every op queued in one write (pipelining) and calls
 * back from that thread as the replies come, in order. The operator calls
 * (inspect, purge), the readiness PING and the --wait subscriber stay on
 * blocking connections: one per worker pool thread, used by that thread only,
 * so no lock guards them. */
#include "idemproxy/store_redis.h"

#include <assert.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "idemproxy/buf.h"
#include "idemproxy/record.h"
#include "idemproxy/worker.h"
#include "lua_scripts.h"

#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 1000
#define PING_INTERVAL_MS 1000
#define NOTIFY_CHANNEL "idemproxy:done" /* complete.lua and release.lua publish the key */
#define HEAD_MAX_BYTES (64u << 20)      /* far above what RECORD_MAX_HEADERS headers can need */

struct redis_conn {
    redisContext *ctx;    /* owned; NULL: not connected */
    uint64_t retry_at_ms; /* no connect attempt before this */
    uint64_t backoff_ms;  /* the wait after the last failed connect; 0: it worked */
};

struct store_redis;

/* The periodic PING job's state. The job owns it while queued (so the job
 * never touches a freed store); the store owns it otherwise. */
struct pinger {
    pthread_mutex_t mu;     /* held while a ping runs: store free waits for it */
    struct store_redis *st; /* NULL once the store is being freed */
    bool queued;
};

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

struct op;

struct op_list {
    struct op *head, *tail;
};

struct store_redis {
    struct store base;
    struct worker_pool *pool;   /* borrowed */
    struct store_redis_url url; /* owns url.password */
    struct timeval timeout;
    uint64_t timeout_ms;

    /* The hot operations: queued by any thread, run by the loop thread. */
    pthread_t loop;
    bool loop_started;
    int wake_fd; /* eventfd: written when an op lands in an empty queue */
    pthread_mutex_t mu;
    struct op_list queue; /* guarded by mu */
    bool stopping;        /* guarded by mu: refuse new ops, end the loop once idle */
    /* The loop thread's own: */
    redisAsyncContext *ac; /* NULL: not connected */
    uint64_t now;          /* now_ms() at the last wake-up */
    uint64_t connect_due_ms;
    uint64_t retry_at_ms;     /* no connect attempt before this */
    uint64_t backoff_ms;      /* the wait after the last failed connect; 0: it worked */
    unsigned setup_left;      /* AUTH, SELECT replies still awaited */
    bool tcp_up;              /* connected, maybe not set up yet */
    bool ready_to_send;       /* connected and set up */
    bool want_write;          /* hiredis has output to flush */
    bool gone;                /* hiredis let ac go; conn_gone() not run yet */
    bool drop;                /* drop ac (asked from inside hiredis) */
    int drop_err;             /* what the ops on a dropped connection get; 0: -ECONNRESET */
    bool self_queued;         /* an op was queued from the loop thread */
    struct op_list waiting;   /* taken from the queue, not sent yet */
    struct op_list sent;      /* sent, oldest first */
    struct redis_conn *conns; /* owned array, one per pool thread, used by that thread only */
    unsigned nconns;
    atomic_bool ready;
    struct store_calls calls;
    struct pinger *pinger;  /* see struct pinger for who owns it */
    struct subscriber *sub; /* owned; NULL unless store_set_notify() was called */
};

/* One accepted hot operation, owned by the store until it calls back. */
struct op {
    struct store_redis *st;
    struct op *prev, *next; /* on the queue, waiting or sent */
    uint64_t sent_ms;
    bool eval; /* Redis said NOSCRIPT: sent again as EVAL */
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

/* ---- redis:// URLs ---- */

static int hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decodes [<p>, <end>) into a new string (NULL for an empty one). */
static int decode_userinfo_part(const char *p, const char *end, char **ret)
{
    char *s, *o;

    if (p == end) {
        *ret = NULL;
        return 0;
    }
    s = malloc((size_t)(end - p) + 1);
    if (!s)
        return -ENOMEM;
    for (o = s; p < end; p++) {
        if (*p == '%') {
            int hi = end - p > 2 ? hex_val(p[1]) : -1, lo = hi >= 0 ? hex_val(p[2]) : -1;

            if (lo < 0 || (hi == 0 && lo == 0)) {
                free(s);
                return -EINVAL; /* a bad escape, or %00 which AUTH could not carry */
            }
            *o++ = (char)(hi << 4 | lo);
            p += 2;
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
    *ret = s;
    return 0;
}

/* Parses all of [<p>, <end>) as a decimal number no larger than <max>. */
static bool parse_uint(const char *p, const char *end, unsigned long max, unsigned long *ret)
{
    unsigned long v = 0;

    if (p == end || end - p > 10)
        return false;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9')
            return false;
        v = v * 10 + (unsigned long)(*p - '0');
    }
    if (v > max)
        return false;
    *ret = v;
    return true;
}

static bool is_host_char(char c)
{
    return (unsigned char)c > 0x20 && (unsigned char)c < 0x7f && !strchr("[]@/?#%", c);
}

int store_redis_parse_url(const char *url, struct store_redis_url *ret)
{
    static const char scheme[] = "redis://";
    struct store_redis_url u = { .port = 6379, .db = 0 };
    const char *p, *at, *host, *host_end, *end, *port = NULL, *path;
    unsigned long v;
    int r;

    if (!url || strncasecmp(url, scheme, sizeof(scheme) - 1) != 0)
        return -EINVAL;
    p = url + sizeof(scheme) - 1;
    /* The path can only be /<db>, so the last '@' ends the userinfo: a
     * password may then hold '/', '?' or '#' without being percent-encoded. */
    at = strrchr(p, '@');
    host = at ? at + 1 : p;
    end = host + strcspn(host, "/?#");
    path = end;

    if (*host == '[') {
        host_end = memchr(host, ']', (size_t)(end - host));
        if (!host_end)
            return -EINVAL;
        host++;
        if (host_end + 1 < end) {
            if (host_end[1] != ':')
                return -EINVAL;
            port = host_end + 2;
        }
        for (const char *c = host; c < host_end; c++) {
            if (!(*c == ':' || *c == '.' || hex_val(*c) >= 0))
                return -EINVAL;
        }
    } else {
        host_end = memchr(host, ':', (size_t)(end - host));
        if (host_end)
            port = host_end + 1;
        else
            host_end = end;
        for (const char *c = host; c < host_end; c++) {
            if (!is_host_char(*c))
                return -EINVAL;
        }
    }
    if (host_end == host || (size_t)(host_end - host) >= sizeof(u.host))
        return -EINVAL;
    memcpy(u.host, host, (size_t)(host_end - host));
    u.host[host_end - host] = '\0';

    if (port) {
        if (!parse_uint(port, end, 65535, &v) || v == 0)
            return -EINVAL;
        u.port = (unsigned)v;
    }
    if (*path == '/' && path[1] != '\0') {
        if (!parse_uint(path + 1, path + strlen(path), 2147483647ul, &v))
            return -EINVAL;
        u.db = (unsigned)v;
    } else if (*path != '\0' && strcmp(path, "/") != 0) {
        return -EINVAL; /* a query or a fragment: no options are understood */
    }

    if (at) {
        /* user:password (the user ignored), or a lone password as redis-cli reads it. */
        const char *colon = memchr(p, ':', (size_t)(at - p));

        r = decode_userinfo_part(colon ? colon + 1 : p, at, &u.password);
        if (r < 0)
            return r;
    }
    *ret = u;
    return 0;
}

/* ---- connections ---- */

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

static void conn_close(struct redis_conn *rc)
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
    redisContext *c = redisConnectWithTimeout(st->url.host, (int)st->url.port, st->timeout);
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
        const char *argv[] = { "AUTH", st->url.password };
        size_t lens[] = { 4, strlen(st->url.password) };

        err = conn_setup_command(c, 2, argv, lens);
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
static int conn_get(struct store_redis *st, struct redis_conn **ret)
{
    int idx = worker_current_index();
    struct redis_conn *rc;
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
    struct redis_conn *rc;
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

/* ---- the hot operations: one pipelined connection, one loop thread ---- */

static void op_list_push(struct op_list *l, struct op *op)
{
    op->next = NULL;
    op->prev = l->tail;
    if (l->tail)
        l->tail->next = op;
    else
        l->head = op;
    l->tail = op;
}

static void op_list_unlink(struct op_list *l, struct op *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        l->head = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        l->tail = op->prev;
    op->prev = op->next = NULL;
}

/* Moves all of <from> to the end of <to>. */
static void op_list_splice(struct op_list *to, struct op_list *from)
{
    if (!from->head)
        return;
    if (to->tail) {
        to->tail->next = from->head;
        from->head->prev = to->tail;
    } else {
        to->head = from->head;
    }
    to->tail = from->tail;
    *from = (struct op_list){ NULL, NULL };
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
 * frees it. Loop thread only, with <op> on no list. */
static void op_finish(struct op *op, int err, const redisReply *reply)
{
    struct store_result res = { .rec = NULL };

    if (err == 0) {
        if (reply->type == REDIS_REPLY_ERROR)
            err = -EPROTO;
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

/* Fails every op of <l> with <err>. */
static void op_list_fail(struct op_list *l, int err)
{
    struct op *op;

    while ((op = l->head)) {
        op_list_unlink(l, op);
        op_finish(op, err, NULL);
    }
}

static void on_reply(redisAsyncContext *ac, void *r, void *privdata);

/* Queues the script of <op> on the connection (EVALSHA, or EVAL once Redis
 * said NOSCRIPT): hiredis formats it into its output buffer, a copy of the
 * body too, which the next write sends along with every other op queued. */
static int op_send(struct store_redis *st, struct op *op)
{
    const struct lua_script *s = &lua_scripts[op->script];
    const char *argv[8];
    size_t lens[8];
    char ttl[24];
    int argc = 0;

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
    if (redisAsyncCommandArgv(st->ac, on_reply, op, argc, argv, lens) != REDIS_OK)
        return -ECONNRESET;
    op->sent_ms = st->now;
    op_list_push(&st->sent, op);
    return 0;
}

/* A reply to an op, or NULL when hiredis lets the connection go (then once
 * for every op still waiting, before its cleanup hook runs). */
static void on_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    struct store_redis *st = ac->data;
    struct op *op = privdata;
    const redisReply *reply = r;

    op_list_unlink(&st->sent, op);
    if (!reply) {
        set_ready(st, false);
        op_finish(op, st->drop_err ? st->drop_err : -ECONNRESET, NULL);
        return;
    }
    /* Redis answers, but an error (LOADING, MISCONF, OOM, NOAUTH…) means it
     * cannot serve us; NOSCRIPT only means the script cache was emptied. */
    if (reply->type == REDIS_REPLY_ERROR && !op->eval && is_error_reply(reply, "NOSCRIPT")) {
        set_ready(st, true);
        op->eval = true; /* EVAL caches it again for the EVALSHAs after it */
        if (op_send(st, op) < 0)
            op_finish(op, -ECONNRESET, NULL);
        return;
    }
    set_ready(st, reply->type != REDIS_REPLY_ERROR);
    op_finish(op, 0, reply);
}

/* A reply to AUTH or SELECT: anything but a status fails the connection. */
static void on_setup_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    struct store_redis *st = ac->data;
    const redisReply *reply = r;

    (void)privdata;
    if (!reply)
        return; /* going: conn_gone() fails what waited for it */
    if (reply->type != REDIS_REPLY_STATUS) {
        st->drop_err = -EPROTO;
        st->drop = true; /* not from inside hiredis: the loop drops it */
        return;
    }
    if (--st->setup_left == 0)
        st->ready_to_send = true;
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    struct store_redis *st = ac->data;
    int saved_errno = errno; /* redisCheckSocketError() left SO_ERROR there */

    if (status != REDIS_OK) {
        st->drop_err = saved_errno == ETIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED;
        return; /* hiredis frees the context next */
    }
    st->tcp_up = true;
    if (st->setup_left == 0)
        st->ready_to_send = true;
}

/* The event adapter: hiredis says when it has output to flush; the loop
 * always polls for input (no read hooks needed). */
static void ev_add_write(void *p) { ((struct store_redis *)p)->want_write = true; }
static void ev_del_write(void *p) { ((struct store_redis *)p)->want_write = false; }

/* Runs once per context, however it goes (error, EOF, redisAsyncFree), after
 * hiredis called back every op it held. */
static void ev_cleanup(void *p)
{
    struct store_redis *st = p;

    st->ac = NULL;
    st->gone = true;
}

static void backoff_start(struct store_redis *st)
{
    st->backoff_ms = st->backoff_ms ? st->backoff_ms * 2 : BACKOFF_FIRST_MS;
    if (st->backoff_ms > BACKOFF_MAX_MS)
        st->backoff_ms = BACKOFF_MAX_MS;
    st->retry_at_ms = now_ms() + st->backoff_ms;
}

/* After hiredis let the context go: fails the ops that waited for it to be
 * set up, and backs off when it never was. */
static void conn_gone(struct store_redis *st)
{
    int err = st->drop_err ? st->drop_err : st->tcp_up ? -ECONNRESET : -ECONNREFUSED;

    st->gone = false;
    set_ready(st, false);
    if (!st->ready_to_send)
        backoff_start(st);
    st->ready_to_send = st->tcp_up = st->drop = false;
    st->want_write = false;
    st->drop_err = 0;
    op_list_fail(&st->sent, err); /* empty: hiredis called them back */
    op_list_fail(&st->waiting, err);
}

/* Drops the connection from the loop (never from inside hiredis): hiredis
 * calls back every op it holds, with <err>. */
static void conn_drop(struct store_redis *st, int err)
{
    st->drop_err = err;
    redisAsyncFree(st->ac);
    if (st->gone)
        conn_gone(st);
}

/* Starts a non-blocking connect, with AUTH and SELECT queued behind it. */
static void conn_start(struct store_redis *st)
{
    redisAsyncContext *ac = redisAsyncConnect(st->url.host, (int)st->url.port);
    int saved_errno = errno;

    if (!ac || ac->err) {
        if (ac)
            redisAsyncFree(ac);
        set_ready(st, false);
        backoff_start(st);
        op_list_fail(&st->waiting, !ac                        ? -ENOMEM
                                   : saved_errno == ETIMEDOUT ? -ETIMEDOUT
                                                              : -ECONNREFUSED);
        return;
    }
    ac->data = st;
    ac->ev.data = st;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    ac->ev.cleanup = ev_cleanup;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisEnableKeepAlive(&ac->c);
    st->ac = ac;
    st->connect_due_ms = st->now + st->timeout_ms;
    st->setup_left = 0;
    /* Queued first: no op goes out before both answered. */
    if (st->url.password) {
        const char *argv[] = { "AUTH", st->url.password };
        size_t lens[] = { 4, strlen(st->url.password) };

        if (redisAsyncCommandArgv(ac, on_setup_reply, NULL, 2, argv, lens) == REDIS_OK)
            st->setup_left++;
    }
    if (st->url.db != 0) {
        char db[16];
        const char *argv[] = { "SELECT", db };
        size_t lens[] = { 6, (size_t)snprintf(db, sizeof(db), "%u", st->url.db) };

        if (redisAsyncCommandArgv(ac, on_setup_reply, NULL, 2, argv, lens) == REDIS_OK)
            st->setup_left++;
    }
}

/* Sends what waits, connects, or fails it fast inside the backoff. */
static void loop_dispatch(struct store_redis *st)
{
    struct op *op;

    if (!st->waiting.head)
        return;
    if (st->ac && st->ready_to_send) {
        while ((op = st->waiting.head)) {
            op_list_unlink(&st->waiting, op);
            if (op_send(st, op) < 0)
                op_finish(op, -ECONNRESET, NULL);
        }
    } else if (!st->ac) {
        if (st->now < st->retry_at_ms) {
            set_ready(st, false);
            op_list_fail(&st->waiting, -ECONNREFUSED);
        } else {
            conn_start(st);
        }
    }
}

/* Drops a connection that does not answer within --store-timeout: every op
 * on it fails with -ETIMEDOUT, and a late reply can never be read as the
 * answer to a later op. */
static void loop_check_timeouts(struct store_redis *st)
{
    if (!st->ac)
        return;
    if (!st->ready_to_send && st->now >= st->connect_due_ms)
        conn_drop(st, -ETIMEDOUT);
    else if (st->ready_to_send && st->sent.head &&
             st->now >= st->sent.head->sent_ms + st->timeout_ms)
        conn_drop(st, -ETIMEDOUT);
}

/* The poll() timeout: until the earliest deadline, -1 for none. */
static int loop_poll_timeout(const struct store_redis *st)
{
    uint64_t due;

    if (!st->ac)
        return -1;
    if (!st->ready_to_send)
        due = st->connect_due_ms;
    else if (st->sent.head)
        due = st->sent.head->sent_ms + st->timeout_ms;
    else
        return -1;
    if (due <= st->now)
        return 0;
    return due - st->now > INT_MAX ? INT_MAX : (int)(due - st->now);
}

static _Thread_local struct store_redis *loop_store; /* set on a loop thread */

static void *loop_main(void *arg)
{
    struct store_redis *st = arg;

    loop_store = st;
    for (;;) {
        struct pollfd pfd[2] = { { .fd = st->wake_fd, .events = POLLIN }, { .fd = -1 } };
        struct op_list batch;
        bool stopping;
        int n;

        if (st->ac) {
            pfd[1].fd = st->ac->c.fd;
            /* Always read: EOF while idle shows at once. Write while the
             * connect is in progress: that is how it completes. */
            pfd[1].events = POLLIN;
            if (st->want_write || !(st->ac->c.flags & REDIS_CONNECTED))
                pfd[1].events |= POLLOUT;
        }
        n = poll(pfd, 2, st->self_queued ? 0 : loop_poll_timeout(st));
        st->self_queued = false;
        st->now = now_ms();
        if (n > 0 && (pfd[0].revents & POLLIN)) {
            uint64_t v;

            if (read(st->wake_fd, &v, sizeof(v)) < 0) {
                /* EAGAIN: another read took it */
            }
        }
        if (n > 0 && st->ac && pfd[1].revents) {
            if (pfd[1].revents & (POLLIN | POLLHUP | POLLERR))
                redisAsyncHandleRead(st->ac);
            if (st->ac && (pfd[1].revents & POLLOUT))
                redisAsyncHandleWrite(st->ac);
        }
        if (st->gone)
            conn_gone(st);
        if (st->drop && st->ac)
            conn_drop(st, st->drop_err);
        loop_check_timeouts(st);

        pthread_mutex_lock(&st->mu);
        batch = st->queue;
        st->queue = (struct op_list){ NULL, NULL };
        stopping = st->stopping;
        pthread_mutex_unlock(&st->mu);
        op_list_splice(&st->waiting, &batch);
        loop_dispatch(st);
        /* Write at once what was just queued, rather than after one more poll(). */
        if (st->ac && st->want_write && (st->ac->c.flags & REDIS_CONNECTED))
            redisAsyncHandleWrite(st->ac);
        if (st->gone)
            conn_gone(st);
        if (stopping && !st->waiting.head && !st->sent.head && !st->self_queued) {
            pthread_mutex_lock(&st->mu);
            stopping = !st->queue.head; /* nothing was queued from a callback meanwhile */
            pthread_mutex_unlock(&st->mu);
            if (stopping)
                break;
        }
    }
    if (st->ac)
        conn_drop(st, -ECONNRESET); /* idle: no op is left on it */
    return NULL;
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

/* Hands <op> to the loop thread. On failure (-ECANCELED: the store is being
 * freed) <op> is freed and nothing calls back. */
static int op_submit(struct op *op)
{
    struct store_redis *st = op->st;
    bool wake;

    pthread_mutex_lock(&st->mu);
    if (st->stopping) {
        pthread_mutex_unlock(&st->mu);
        op_free(op);
        return -ECANCELED;
    }
    /* Only the first op of a batch wakes the loop: it takes the whole queue. */
    wake = !st->queue.head;
    op_list_push(&st->queue, op);
    pthread_mutex_unlock(&st->mu);
    if (wake) {
        if (loop_store == st) {
            st->self_queued = true; /* from a callback: the loop looks again before it sleeps */
        } else {
            uint64_t one = 1;

            if (write(st->wake_fd, &one, sizeof(one)) < 0) {
                /* EAGAIN: the counter is full, so a wake-up is pending anyway */
            }
        }
    }
    return 0;
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
struct admin_job {
    struct store_redis *st;
    store_list_fn *list_done; /* inspect */
    store_done_fn *done;      /* purge */
    void *ctx;
    bool with_body;
    char *prefix, *key; /* owned; purge: key is the store key */
    size_t prefix_len, key_len;
};

static void admin_job_free(struct admin_job *job)
{
    free(job->prefix);
    free(job->key);
    free(job);
}

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
static int inspect_all(struct admin_job *job, struct store_info_list *list)
{
    struct span prefix = { job->prefix, job->prefix_len }, key = { job->key, job->key_len };
    struct buf pattern = BUF_INIT(4096);
    char cursor[32] = "0";
    size_t cap = 0;
    int err;

    err = append_glob_escaped(&pattern, prefix);
    for (int i = 0; err == 0 && i < STORE_SCOPE_HEX; i++)
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
                !store_key_matches((struct span){ keys->element[i]->str, keys->element[i]->len },
                                   prefix, key))
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
    struct admin_job *job = arg;
    struct store_redis *st = job->st;
    struct store_info_list list = { 0 };
    int err = inspect_all(job, &list);

    if (err < 0)
        store_info_list_done(&list);
    job->list_done(job->ctx, err, &list);
    store_info_list_done(&list);
    admin_job_free(job);
    store_calls_end(&st->calls);
}

static void purge_run(void *arg)
{
    struct admin_job *job = arg;
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
    admin_job_free(job);
    store_calls_end(&st->calls);
}

static int admin_job_submit(struct store_redis *st, struct admin_job *job, worker_fn *fn,
                            struct span prefix, struct span key)
{
    int err;

    job->st = st;
    job->prefix = strndup(prefix.base ? prefix.base : "", prefix.len);
    job->key = strndup(key.base, key.len);
    job->prefix_len = prefix.len;
    job->key_len = key.len;
    if (!job->prefix || !job->key) {
        admin_job_free(job);
        return -ENOMEM;
    }
    err = store_calls_submit(&st->calls, st->pool, fn, job);
    if (err < 0)
        admin_job_free(job);
    return err;
}

static int redis_inspect(struct store *base, struct span prefix, struct span key, bool with_body,
                         store_list_fn *done, void *ctx)
{
    struct admin_job *job;

    if (!done || !key.base || key.len == 0)
        return -EINVAL;
    job = calloc(1, sizeof(*job));
    if (!job)
        return -ENOMEM;
    job->list_done = done;
    job->ctx = ctx;
    job->with_body = with_body;
    return admin_job_submit(to_redis(base), job, inspect_run, prefix, key);
}

static int redis_purge(struct store *base, struct span store_key, store_done_fn *done, void *ctx)
{
    struct admin_job *job;

    if (!done || !store_key.base || store_key.len == 0)
        return -EINVAL;
    job = calloc(1, sizeof(*job));
    if (!job)
        return -ENOMEM;
    job->done = done;
    job->ctx = ctx;
    return admin_job_submit(to_redis(base), job, purge_run, (struct span){ NULL, 0 }, store_key);
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

/* ---- readiness ---- */

static void pinger_destroy(struct pinger *pg)
{
    if (!pg)
        return;
    pthread_mutex_destroy(&pg->mu);
    free(pg);
}

/* PINGs Redis every PING_INTERVAL_MS so that /readyz follows Redis without traffic. */
static void ping_run(void *arg)
{
    struct pinger *pg = arg;
    struct store_redis *st;

    pthread_mutex_lock(&pg->mu);
    st = pg->st;
    if (!st) {
        pthread_mutex_unlock(&pg->mu);
        pinger_destroy(pg); /* the store is gone and left it to this job */
        return;
    }
    {
        const char *argv[] = { "PING" };
        size_t lens[] = { 4 };
        redisReply *reply = NULL;

        if (command(st, 1, argv, lens, &reply) == 0)
            freeReplyObject(reply);
    }
    pg->queued = worker_submit_after(st->pool, PING_INTERVAL_MS, ping_run, pg) == 0;
    pthread_mutex_unlock(&pg->mu);
}

static void redis_free(struct store *base)
{
    struct store_redis *st = to_redis(base);

    sub_stop(st->sub);
    if (st->pinger) {
        struct pinger *pg = st->pinger;
        bool queued;

        pthread_mutex_lock(&pg->mu); /* waits for a ping in progress */
        pg->st = NULL;
        queued = pg->queued;
        pthread_mutex_unlock(&pg->mu);
        if (!queued)
            pinger_destroy(pg);
    }
    if (st->loop_started) {
        uint64_t one = 1;

        /* The loop calls back everything accepted before it ends. */
        pthread_mutex_lock(&st->mu);
        st->stopping = true;
        pthread_mutex_unlock(&st->mu);
        if (write(st->wake_fd, &one, sizeof(one)) < 0) {
            /* EAGAIN: a wake-up is pending anyway */
        }
        pthread_join(st->loop, NULL);
    }
    store_calls_done(&st->calls); /* inspect and purge */

    if (st->wake_fd >= 0)
        close(st->wake_fd);
    pthread_mutex_destroy(&st->mu);
    for (unsigned i = 0; st->conns && i < st->nconns; i++)
        conn_close(&st->conns[i]);
    free(st->conns);
    free(st->url.password);
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
                    struct store **ret)
{
    struct store_redis *st;
    struct pinger *pg;
    int err;

    if (!pool || timeout_ms == 0)
        return -EINVAL;
    st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    err = store_redis_parse_url(url, &st->url);
    if (err < 0) {
        free(st);
        return err;
    }
    st->base.ops = &redis_ops;
    st->pool = pool;
    st->timeout = (struct timeval){ .tv_sec = (time_t)(timeout_ms / 1000),
                                    .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000 };
    st->timeout_ms = timeout_ms;
    atomic_init(&st->ready, false);
    store_calls_init(&st->calls);
    pthread_mutex_init(&st->mu, NULL);
    st->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    st->nconns = worker_pool_size(pool);
    st->conns = calloc(st->nconns, sizeof(*st->conns));
    pg = calloc(1, sizeof(*pg));
    if (!st->conns || !pg || st->wake_fd < 0) {
        err = st->wake_fd < 0 ? -errno : -ENOMEM;
        free(pg);
        redis_free(&st->base);
        return err;
    }
    if (pthread_create(&st->loop, NULL, loop_main, st) != 0) {
        free(pg);
        redis_free(&st->base);
        return -EAGAIN;
    }
    st->loop_started = true;
    pthread_mutex_init(&pg->mu, NULL);
    pg->st = st;
    st->pinger = pg;
    /* The first ping at once: /readyz should not wait a whole interval. */
    pthread_mutex_lock(&pg->mu);
    pg->queued = worker_submit_after(pool, 0, ping_run, pg) == 0;
    pthread_mutex_unlock(&pg->mu);
    *ret = &st->base;
    return 0;
}
