/* SPDX-License-Identifier: MIT */
/* The Redis store. Every operation is a job on the worker pool: it runs one
 * embedded Lua script (EVALSHA, EVAL on NOSCRIPT) on the blocking hiredis
 * connection of the thread it runs on, then calls back on that thread. Each
 * connection belongs to one pool thread, so no lock guards it. */
#include "idemproxy/store_redis.h"

#include <assert.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/time.h>

#include "idemproxy/buf.h"
#include "idemproxy/record.h"
#include "idemproxy/worker.h"
#include "lua_scripts.h"

#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 1000
#define PING_INTERVAL_MS 1000
#define HEAD_MAX_BYTES (64u << 20) /* far above what RECORD_MAX_HEADERS headers can need */

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

struct store_redis {
    struct store base;
    struct worker_pool *pool;   /* borrowed */
    struct store_redis_url url; /* owns url.password */
    struct timeval timeout;
    struct redis_conn *conns; /* owned array, one per pool thread, used by that thread only */
    unsigned nconns;
    atomic_bool ready;
    struct store_calls calls;
    struct pinger *pinger; /* see struct pinger for who owns it */
};

/* One accepted operation, owned by its job. */
struct op {
    struct store_redis *st;
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

/* Sends the script of <op> and turns the reply into <res>. */
static int op_execute(struct op *op, struct store_result *res)
{
    const char *argv[8];
    size_t lens[8];
    char ttl[24];
    redisReply *reply = NULL;
    int argc = 3, err;

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
        /* The body goes out straight from the record: no copy. */
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

    err = run_script(op->st, op->script, argc, argv, lens, &reply);
    if (err < 0)
        return err;
    if (reply->type == REDIS_REPLY_ERROR)
        err = -EPROTO;
    else if (op->script == LUA_ACQUIRE)
        err = parse_acquire(reply, res);
    else
        err = parse_ok_or_stale(reply, res);
    freeReplyObject(reply);
    return err;
}

static void op_free(struct op *op)
{
    if (!op)
        return;
    record_unref(op->rec);
    buf_done(&op->head);
    free(op);
}

static void op_run(void *arg)
{
    struct op *op = arg;
    struct store_redis *st = op->st;
    struct store_result res = { .rec = NULL };
    int err;

    err = op_execute(op, &res);
    /* Sent: the caller may rely on the store holding no reference any more. */
    record_unref(op->rec);
    op->rec = NULL;
    if (err < 0) {
        record_unref(res.rec);
        res.rec = NULL;
    }
    op->done(op->ctx, err, err == 0 ? &res : NULL);
    record_unref(res.rec);
    op_free(op);
    store_calls_end(&st->calls);
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

/* Hands <op> to the pool. On failure <op> is freed and nothing calls back. */
static int op_submit(struct op *op)
{
    int err = store_calls_submit(&op->st->calls, op->st->pool, op_run, op);

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
    store_calls_done(&st->calls);

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
    atomic_init(&st->ready, false);
    store_calls_init(&st->calls);
    st->nconns = worker_pool_size(pool);
    st->conns = calloc(st->nconns, sizeof(*st->conns));
    pg = calloc(1, sizeof(*pg));
    if (!st->conns || !pg) {
        free(pg);
        redis_free(&st->base);
        return -ENOMEM;
    }
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
