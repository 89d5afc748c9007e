/* SPDX-License-Identifier: MIT */
/* The Redis store. The hot operations (acquire, complete, release, extend)
 * each run one embedded Lua script (EVALSHA, EVAL on NOSCRIPT) on a
 * connection of the calling event loop's own (redis_conn.h), driven by that
 * loop: a request's ops are sent and answered on the thread that serves it,
 * without waking another. Ops queued in one loop turn go out in one write
 * (pipelining); replies call back on the loop thread, in order. Ops from
 * other threads (heartbeats, --wait retries) are queued for the first loop.
 * The readiness PING and the operator calls (inspect, purge) are ops too, on
 * the first loop's connections; the --wait subscriber has a connection of
 * its own on that loop. No thread waits on Redis.
 *
 * One server, the master the sentinels name, or a Redis Cluster: a loop has
 * one connection per node it sends to. A cluster is found by asking CLUSTER
 * SLOTS (a server without cluster support says so); each op then goes to the
 * master of its key's slot, follows MOVED (the slot moved: the map learns it
 * and is read again, at most once a second) and ASK (this op only, after
 * ASKING), and is sent again with backoff on TRYAGAIN, CLUSTERDOWN or a lost
 * connection until --store-timeout has passed: every script is idempotent
 * for its fencing token, so a second run of one changes nothing. */
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
#include "idemproxy/redis_cluster.h"
#include "idemproxy/redis_conn.h"
#include "idemproxy/redis_sentinel.h"
#include "idemproxy/redis_url.h"
#include "store_impl.h"
#include "store_redis_impl.h"
#include "idemproxy/worker.h"
#include "lua_scripts.h"

#define PING_INTERVAL_MS 1000
#define REFRESH_MIN_MS 1000   /* a slot map is asked for at most once a second */
#define REFRESH_IDLE_MS 10000 /* and every 10 s when nothing asked for one */
#define REDIRECTS_MAX 5       /* MOVED and ASK followed by one op */
#define RETRY_FIRST_MS 20     /* the first wait before an op is sent again (cluster) */
#define RETRY_MAX_MS 200
#define SLOT_NONE UINT16_MAX /* no master known for the slot */
#define GIVE_BACK_MAX 4096   /* give-backs being retried at once; past that, locks expire */

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
    else if (r->elements == 4 && reply_str_eq(r->element[0], "unknown")) {
        h = r->element[1];
        b = r->element[2];
        if (h->type != REDIS_REPLY_STRING || b->type != REDIS_REPLY_STRING ||
            store_cause_parse((struct span){ h->str, h->len }, &res->cause) < 0)
            return -EPROTO;
        res->about = (struct span){ .base = b->str, .len = b->len };
        res->became = reply_str_eq(r->element[3], "1");
        res->status = STORE_UNKNOWN;
    } else if (r->elements == 3 && reply_str_eq(r->element[0], "completed")) {
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

/* ---- nodes ---- */

struct store_redis *store_redis_of(struct store *st) { return (struct store_redis *)st; }

static struct node *node_at(struct store_redis *st, unsigned i)
{
    return i < atomic_load_explicit(&st->nnodes, memory_order_acquire) ? st->nodes[i] : NULL;
}

static void node_set_up(struct node *n, bool up)
{
    if (atomic_load_explicit(&n->up, memory_order_relaxed) != up)
        atomic_store(&n->up, up);
}

/* Points <n> at <host>:<port> (under addr_mu): an IP address is its
 * address at once, a name waits for the PING job's lookup. */
static void node_set_addr(struct node *n, const char *host, unsigned port)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV };
    struct addrinfo *res = NULL;
    char p[8];

    snprintf(n->host, sizeof(n->host), "%s", host);
    n->port = port;
    n->addrlen = 0;
    snprintf(n->resolve_why, sizeof(n->resolve_why), "%.255s:%u does not resolve (yet)", host,
             port);
    snprintf(p, sizeof(p), "%u", port);
    if (getaddrinfo(host, p, &hints, &res) == 0 && res && res->ai_addrlen <= sizeof(n->addr)) {
        memcpy(&n->addr, res->ai_addr, res->ai_addrlen);
        n->addrlen = res->ai_addrlen;
    }
    if (res)
        freeaddrinfo(res);
    atomic_fetch_add(&n->generation, 1);
}

/* The index of the node at <a>, added when it is new. Any thread; no name
 * lookup. Returns it, or -E2BIG past NODE_MAX, -ENOMEM. */
static int node_get(struct store_redis *st, const struct redis_addr *a)
{
    unsigned n;
    int ret = -E2BIG;

    pthread_mutex_lock(&st->addr_mu);
    n = atomic_load(&st->nnodes);
    for (unsigned i = 0; i < n; i++) {
        if (st->nodes[i]->port == a->port && strcasecmp(st->nodes[i]->host, a->host) == 0) {
            ret = (int)i;
            goto out;
        }
    }
    if (n < NODE_MAX) {
        struct node *nd = calloc(1, sizeof(*nd));

        ret = -ENOMEM;
        if (!nd)
            goto out;
        redis_addr_format(a, nd->name, sizeof(nd->name)); /* never changes: read freely */
        node_set_addr(nd, a->host, a->port);
        st->nodes[n] = nd;
        atomic_store_explicit(&st->nnodes, n + 1, memory_order_release);
        ret = (int)n;
    }
out:
    pthread_mutex_unlock(&st->addr_mu);
    return ret;
}

static bool is_cluster(struct store_redis *st)
{
    return atomic_load_explicit(&st->mode, memory_order_relaxed) == MODE_CLUSTER;
}

unsigned store_redis_masters(struct store_redis *st, unsigned *ret)
{
    bool seen[NODE_MAX] = { false };
    unsigned n = 0;

    if (!is_cluster(st)) {
        ret[0] = 0;
        return 1;
    }
    for (unsigned s = 0; s < REDIS_CLUSTER_SLOTS; s++) {
        unsigned i = atomic_load_explicit(&st->slots[s], memory_order_relaxed);

        if (i != SLOT_NONE && i < NODE_MAX && !seen[i]) {
            seen[i] = true;
            ret[n++] = i;
        }
    }
    return n;
}

/* Ready: one server (node 0) answers; a cluster: every slot has a master
 * and each of them answers. */
/* The nodes that are masters now: node 0 alone unless a cluster. Returns
 * how many are in <ret>. */
static unsigned current_masters(struct store_redis *st, unsigned ret[NODE_MAX])
{
    if (is_cluster(st))
        return store_redis_masters(st, ret);
    ret[0] = 0;
    return 1;
}

static bool redis_is_ready(struct store *base)
{
    struct store_redis *st = store_redis_of(base);
    unsigned masters[NODE_MAX], n;

    for (unsigned s = 0; is_cluster(st) && s < REDIS_CLUSTER_SLOTS; s++) {
        if (atomic_load_explicit(&st->slots[s], memory_order_relaxed) == SLOT_NONE)
            return false;
    }
    n = current_masters(st, masters);
    for (unsigned i = 0; i < n; i++) {
        struct node *nd = node_at(st, masters[i]);

        if (!nd || !atomic_load(&nd->up))
            return false;
    }
    return n > 0;
}

/* True while every master (as far as known) said it keeps its writes. */
static bool redis_is_durable(struct store_redis *st)
{
    unsigned masters[NODE_MAX], n = current_masters(st, masters);

    for (unsigned i = 0; i < n; i++) {
        struct node *nd = node_at(st, masters[i]);

        if (!nd || atomic_load(&nd->durable) != NODE_DURABLE_YES)
            return false;
    }
    return n > 0;
}

/* ---- the hot operations: one pipelined connection per event loop and node ---- */

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

/* The result <reply> holds for <op>. */
static int op_parse(const struct op *op, const redisReply *reply, struct store_result *res)
{
    if (reply->type == REDIS_REPLY_ERROR)
        return -EPROTO;
    if (op->script == OP_PING) {
        res->status = STORE_OK;
        return 0;
    }
    if (op->script == LUA_ACQUIRE)
        return parse_acquire(reply, res);
    if (op->script == LUA_RESOLVE && reply_str_eq(reply, "gone"))
        return -ENOENT;
    if (op->script == LUA_RESOLVE && reply_str_eq(reply, "not_unknown"))
        return -EBUSY;
    return parse_ok_or_stale(reply, res);
}

static void give_back(struct op *acq);

/* Calls <op> back with <err>, or <res> (err 0), and frees it. */
static void op_deliver(struct op *op, int err, const struct store_result *res)
{
    /* Answered: the caller may rely on the store holding no reference any more. */
    record_unref(op->rec);
    op->rec = NULL;
    list_remove(&op->wait_node);
    if (err < 0 && op->script == LUA_ACQUIRE && op->sent)
        give_back(op);
    op->done(op->ctx, err, err == 0 ? res : NULL);
    op_free(op);
}

/* Calls <op> back with <err>, or with the result <reply> holds (err 0), and
 * frees it; with --redis-wait-replicas, a write is held for the WAIT sent
 * after it instead. On its lane's loop thread, with <op> on no list. */
static void op_finish(struct op *op, int err, const redisReply *reply)
{
    struct store_result res = { .rec = NULL };

    if (op->raw) {
        op->raw(op->raw_ctx, err, err == 0 ? reply : NULL);
        op_free(op);
        return;
    }
    if (err == 0)
        err = op_parse(op, reply, &res);
    if (err == 0 && op->wait && (res.status == STORE_ACQUIRED || res.status == STORE_OK)) {
        op->held = res.status; /* no record: only a replay carries one */
        list_append(&op->link->held, &op->wait_node);
        return;
    }
    if (err < 0) {
        record_unref(res.rec);
        res.rec = NULL;
    }
    op_deliver(op, err, &res);
    record_unref(res.rec);
}

static int op_new(struct store_redis *st, enum lua_script_id script, struct span key,
                  const struct store_token *tok, store_done_fn *done, void *ctx, struct op **ret);

static void give_back_done(void *ctx, int err, const struct store_result *res)
{
    struct store_redis *st = ctx;

    (void)err, (void)res; /* one not given back expires within --lock-ttl */
    atomic_fetch_sub(&st->releases_pending, 1);
}

/* <acq>, an acquire that was sent, failed: its answer was lost (the
 * connection failed, or timed out) or too few replicas confirmed it. Its
 * script may have taken the lock all the same, and the request will not go
 * upstream, so the lock is given back with its token (a release that finds
 * nothing, or another holder, changes nothing), retried on any failure
 * until the lock would have expired by itself: the key must not answer 409
 * for a whole --lock-ttl. */
static void give_back(struct op *acq)
{
    struct store_redis *st = acq->st;
    struct op *rel;

    if (atomic_fetch_add(&st->releases_pending, 1) >= GIVE_BACK_MAX)
        goto skip; /* a store down for long: the locks expire by themselves */
    if (op_new(st, LUA_RELEASE, (struct span){ acq->key, acq->key_len }, &acq->tok, give_back_done,
               st, &rel) < 0)
        goto skip;
    rel->wait = false; /* no need: an expired lock frees the key as well */
    rel->give_back = true;
    rel->life_ms = acq->ttl_ms;
    if (store_redis_op_submit(rel) < 0)
        goto skip; /* stopping: freed, and nothing calls back */
    return;
skip:
    atomic_fetch_sub(&st->releases_pending, 1);
}

/* The WAIT after <op>'s write answered that <acked> replicas have it (-1:
 * no answer). Short of --redis-wait-replicas, an acquire's lock might not
 * survive a failover, so it is given back (fenced by its token) and the
 * request refused before it reaches the upstream; any other write is
 * answered as it went, and counted. */
static void op_acked(struct op *op, long long acked)
{
    struct store_redis *st = op->st;
    struct store_result res = { .status = op->held };

    list_remove(&op->wait_node);
    if (acked >= (long long)st->wait_replicas) {
        op_deliver(op, 0, &res);
        return;
    }
    atomic_fetch_add_explicit(&st->unreplicated[op->script], 1, memory_order_relaxed);
    if (op->script != LUA_ACQUIRE) {
        op_deliver(op, 0, &res);
        return;
    }
    op_deliver(op, -EREMOTEIO, NULL); /* which gives the lock back */
}

/* Answers the writes held on <k> up to number <seq>, told that <acked>
 * replicas have them. */
static void link_acked(struct link *k, uint64_t seq, long long acked)
{
    struct list_node *n;
    struct op *op;

    while ((n = list_first(&k->held))) {
        op = list_entry(n, struct op, wait_node);
        if (op->write_seq > seq)
            break;
        op_acked(op, acked);
    }
}

/* One WAIT on <link>, covering its writes up to number <seq>. */
struct wait_call {
    struct link *link;
    uint64_t seq;
};

static void on_wait(void *ctx, int err, const redisReply *reply)
{
    struct wait_call *w = ctx;
    struct link *k = w->link;

    k->sent--;
    link_acked(k, w->seq,
               err == 0 && reply->type == REDIS_REPLY_INTEGER ? reply->integer : -1);
    free(w);
}

/* Sends a WAIT after the writes sent on <k> since the last one: one WAIT
 * covers every write queued before it (Redis answers it once the replicas
 * have them all, or at its timeout). */
static void link_send_wait(struct link *k)
{
    struct store_redis *st = k->lane->st;
    char n[16], ms[24];
    const char *argv[] = { "WAIT", n, ms };
    size_t lens[3] = { 4 };
    struct wait_call *w;

    if (k->writes_sent == k->writes_covered || !k->conn)
        return;
    w = malloc(sizeof(*w));
    if (!w)
        return; /* the next write's WAIT covers these too */
    *w = (struct wait_call){ .link = k, .seq = k->writes_sent };
    lens[1] = (size_t)snprintf(n, sizeof(n), "%u", st->wait_replicas);
    lens[2] = (size_t)snprintf(ms, sizeof(ms), "%llu", (unsigned long long)st->wait_timeout_ms);
    if (redis_conn_command(k->conn, 3, argv, lens, on_wait, w) < 0) {
        free(w);
        return; /* a dead connection: its down() answers what it held */
    }
    k->sent++;
    k->writes_covered = k->writes_sent;
}

static void cluster_refresh(struct store_redis *st);

/* Whether an op that failed with <err> may be sent again: the cluster is
 * moving (TRYAGAIN, CLUSTERDOWN: -EAGAIN), or its connection failed, which
 * a failover does. A second run of any script is harmless (its token). */
static bool is_retryable(int err)
{
    return err == -EAGAIN || err == -ECONNRESET || err == -ECONNREFUSED || err == -ENXIO ||
           err == -EHOSTUNREACH || err == -ENETUNREACH;
}

/* <op> failed with <err>: on a cluster, tried again after a backoff while
 * --store-timeout lasts (a give-back: on any store, until its deadline);
 * else (or then) called back with <err>. On its lane's loop thread, with
 * <op> on no list. */
static void op_fail(struct op *op, int err)
{
    struct store_redis *st = op->st;
    struct lane *ln = op->lane;
    uint64_t now = now_ms(), max = op->give_back ? BACKOFF_MAX_MS : RETRY_MAX_MS;

    /* An op for one given node (a PING, CLUSTER SLOTS, a SCAN page) would only
     * meet the same failure again: its caller moves on instead. */
    if (!(op->give_back || (is_cluster(st) && is_retryable(err))) || op->to >= 0 ||
        atomic_load(&st->stopping) || now + op->backoff_ms >= op->deadline_ms) {
        op_finish(op, err, NULL);
        return;
    }
    op->via = -1;
    op->asking = false;
    op->not_before_ms = now + op->backoff_ms;
    op->backoff_ms = op->backoff_ms * 2 > max ? max : op->backoff_ms * 2;
    list_append(&ln->later, &op->node);
    if (ln->timer.due_ms > op->not_before_ms)
        ln->timer.due_ms = op->not_before_ms;
    if (is_cluster(st))
        cluster_refresh(st); /* where the slot lives may have changed */
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
        op_fail(op, err);
    }
}

static void on_op_reply(void *ctx, int err, const redisReply *reply);
static void link_drop(struct link *k, int err, const char *why, bool backoff);

static void on_asking(void *ctx, int err, const redisReply *reply)
{
    (void)ctx, (void)err, (void)reply; /* the command after it tells */
}

/* Writes <v> in decimal into <out> (21 bytes at least), NUL-terminated;
 * returns its length. On every op's path: snprintf() costs several times more. */
static size_t u64_text(uint64_t v, char *out)
{
    char tmp[20];
    size_t n = 0;

    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = '\0';
    return n;
}

/* Sends the script of <op> on the link's connection (EVALSHA, or EVAL once
 * Redis said NOSCRIPT): appended to the output, which goes out with every
 * other op of this loop turn in one write (pipelining). */
static int op_send(struct link *k, struct op *op)
{
    const struct lua_script *s = &lua_scripts[op->script < _LUA_MAX ? op->script : 0];
    const char *argv[10];
    size_t lens[10];
    char ttl[24], keep[24];
    int argc = 0, err;

    if (op->asking) {
        const char *asking[] = { "ASKING" };
        size_t asking_len[] = { 6 };

        err = redis_conn_command(k->conn, 1, asking, asking_len, on_asking, NULL);
        if (err < 0)
            return err;
        op->asking = false;
    }
    op->via = -1; /* an ASK holds for one send */
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
        lens[argc] = u64_text(op->ttl_ms, ttl);
        argv[argc++] = ttl;
        lens[argc] = u64_text(op->keep_ms, keep);
        argv[argc++] = keep;
        argv[argc] = op->take_over ? "1" : "0";
        lens[argc++] = 1;
        argv[argc] = op->head.data ? op->head.data : "";
        lens[argc++] = op->head.len;
        goto send;
    case LUA_UNKNOWN:
        argv[argc] = op->tok.hex;
        lens[argc++] = STORE_TOKEN_HEX;
        argv[argc] = store_cause_name(op->cause);
        lens[argc] = strlen(argv[argc]);
        argc++;
        argv[argc] = op->head.data ? op->head.data : "";
        lens[argc++] = op->head.len;
        break;
    case LUA_RESOLVE:
        argv[argc] = op->head.data;
        lens[argc++] = op->head.len;
        argv[argc] = op->rec->body.data ? op->rec->body.data : "";
        lens[argc++] = op->rec->body.len;
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
        lens[argc] = u64_text(op->ttl_ms, ttl);
        argv[argc++] = ttl;
    }
send:
    err = redis_conn_command(k->conn, argc, argv, lens, on_op_reply, op);
    if (err == 0) {
        op->link = k;
        op->sent = true;
        k->sent++;
        if (op->wait) {
            op->write_seq = ++k->writes_sent;
            k->lane->timer.due_ms = 0; /* its WAIT goes after this turn's other writes */
        }
    }
    return err;
}

/* The node <op> goes to now: the one an ASK named, the one it was given,
 * or its slot's master (node 0 until a cluster is known; any node that
 * answers while the slot has no known master: it redirects). */
static unsigned op_route(struct store_redis *st, const struct op *op)
{
    unsigned n = atomic_load_explicit(&st->nnodes, memory_order_acquire), i;

    if (op->via >= 0)
        return (unsigned)op->via;
    if (op->to >= 0)
        return (unsigned)op->to;
    if (!is_cluster(st))
        return 0;
    i = atomic_load_explicit(&st->slots[op->slot], memory_order_relaxed);
    if (i < n)
        return i;
    for (i = 0; i < n; i++) {
        if (atomic_load_explicit(&st->nodes[i]->up, memory_order_relaxed))
            return i;
    }
    return 0;
}

/* The lane's link to node <index>, made on first use. Loop thread. */
static struct link *lane_link(struct lane *ln, unsigned index)
{
    struct link *k = ln->links[index];

    if (k)
        return k;
    k = calloc(1, sizeof(*k));
    if (!k)
        return NULL;
    k->lane = ln;
    k->index = index;
    k->node = ln->st->nodes[index];
    list_init(&k->waiting);
    list_init(&k->held);
    ln->links[index] = k;
    return k;
}

static bool link_is_current(const struct link *k)
{
    return k->conn && k->ready && k->generation == atomic_load(&k->node->generation);
}

/* Sends <op> on the lane's connection to its node when that is set up, or
 * leaves it waiting there for the lane's timer (this turn). Loop thread.
 * Returns 0, or -ENOMEM (nothing was done with <op>). */
static int lane_send(struct lane *ln, struct op *op)
{
    struct link *k = lane_link(ln, op_route(ln->st, op));

    if (!k)
        return -ENOMEM;
    if (link_is_current(k) && op_send(k, op) == 0)
        return 0;
    list_append(&k->waiting, &op->node);
    ln->timer.due_ms = 0;
    return 0;
}

static void lane_resend(struct lane *ln, struct op *op)
{
    if (lane_send(ln, op) < 0)
        op_finish(op, -ENOMEM, NULL);
}

/* MOVED or ASK: <op> goes where Redis says. MOVED also teaches the map and
 * asks for a fresh one; ASK holds for this op's next send only. Returns
 * false when <reply> is no usable redirection (the op fails with it). */
static bool follow_redirect(struct link *k, struct op *op, const redisReply *reply)
{
    struct store_redis *st = op->st;
    struct redis_redirect rd;
    char self[REDIS_URL_HOST_MAX];
    int i;

    if (op->redirects >= REDIRECTS_MAX)
        return false;
    pthread_mutex_lock(&st->addr_mu);
    snprintf(self, sizeof(self), "%s", k->node->host);
    pthread_mutex_unlock(&st->addr_mu);
    if (redis_redirect_parse(reply->str, reply->len, self, &rd) < 0)
        return false;
    i = node_get(st, &rd.addr);
    if (i < 0)
        return false;
    op->redirects++;
    atomic_fetch_add_explicit(&st->redirections, 1, memory_order_relaxed);
    atomic_store(&st->mode, MODE_CLUSTER);
    if (rd.kind == REDIS_REDIRECT_MOVED) {
        atomic_store_explicit(&st->slots[rd.slot], (uint16_t)i, memory_order_relaxed);
        cluster_refresh(st);
    } else {
        op->via = i;
        op->asking = true;
    }
    lane_resend(k->lane, op);
    return true;
}

/* An op's reply, or the error of its connection. */
static void on_op_reply(void *ctx, int err, const redisReply *reply)
{
    struct op *op = ctx;
    struct link *k = op->link;
    struct store_redis *st = op->st;

    k->sent--;
    if (err < 0) {
        node_set_up(k->node, false);
        op_fail(op, err == -ECANCELED ? -ECONNRESET : err);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        /* NOSCRIPT only means the script cache was emptied (or this node,
         * a promoted replica, never had it). */
        if (!op->eval && redis_reply_is_error(reply, "NOSCRIPT")) {
            node_set_up(k->node, true);
            op->eval = true; /* EVAL caches it again for the EVALSHAs after it */
            if (op_send(k, op) < 0)
                op_fail(op, -ECONNRESET);
            return;
        }
        if ((redis_reply_is_error(reply, "MOVED") || redis_reply_is_error(reply, "ASK")) &&
            follow_redirect(k, op, reply)) {
            node_set_up(k->node, true);
            return;
        }
        if (redis_reply_is_error(reply, "TRYAGAIN") || redis_reply_is_error(reply, "CLUSTERDOWN")) {
            atomic_store(&st->mode, MODE_CLUSTER);
            op_fail(op, -EAGAIN);
            return;
        }
        if (st->sentinel && redis_reply_is_error(reply, "READONLY") && k->conn) {
            /* a demoted master: this op fails, the next ones go to the new one */
            op_finish(op, 0, reply);
            if (k->conn)
                link_drop(k, -EAGAIN, "READONLY: a replica now; asking the sentinels again", true);
            return;
        }
    }
    /* Redis answers, but an error (LOADING, MISCONF, OOM, NOAUTH…) to one of
     * ours means it cannot serve us; an operator's command (or CLUSTER SLOTS
     * on a server without cluster support) may be refused by a healthy one. */
    if (!op->raw)
        node_set_up(k->node, reply->type != REDIS_REPLY_ERROR);
    op_finish(op, 0, reply);
}

static void backoff_start(struct link *k)
{
    k->backoff_ms = k->backoff_ms ? k->backoff_ms * 2 : BACKOFF_FIRST_MS;
    if (k->backoff_ms > BACKOFF_MAX_MS)
        k->backoff_ms = BACKOFF_MAX_MS;
    k->retry_at_ms = now_ms() + k->backoff_ms;
}

/* What the log calls node <n>: the store's name unless it is a cluster's node. */
static void node_log_name(struct store_redis *st, const struct node *n, char *out, size_t len)
{
    snprintf(out, len, "%s", is_cluster(st) ? n->name : st->name);
}

/* Says why the connections fail, once per new reason (every loop's link
 * retries, each with its backoff: the log gets one line, not one a retry). */
static void log_failure(struct store_redis *st, const struct node *n, const char *why)
{
    char name[sizeof(n->name)], line[sizeof(st->logged_why)];

    node_log_name(st, n, name, sizeof(name));
    snprintf(line, sizeof(line), "%.300s: %.400s", name, why);
    pthread_mutex_lock(&st->log_mu);
    if (strcmp(st->logged_why, line) != 0) {
        memcpy(st->logged_why, line, sizeof(line));
        log_warn("redis %s", line);
    }
    pthread_mutex_unlock(&st->log_mu);
}

/* Says that node <n> answers again, when its failure was the last logged. */
static void log_recovery(struct store_redis *st, const struct node *n)
{
    char name[sizeof(n->name)];
    size_t len;

    node_log_name(st, n, name, sizeof(name));
    len = strlen(name);
    pthread_mutex_lock(&st->log_mu);
    if (strncmp(st->logged_why, name, len) == 0 && st->logged_why[len] == ':') {
        st->logged_why[0] = '\0';
        log_info("redis %s: connected", name);
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
    node_set_up(k->node, true);
    log_recovery(k->lane->st, k->node);
    link_dispatch(k, now_ms());
}

/* Sentinel: the link failed, so the master may have moved; the next
 * connection waits for the sentinels' answer to a question asked now. */
static void link_rediscover(struct link *k)
{
    struct store_redis *st = k->lane->st;

    if (st->sentinel)
        k->fresh_after = redis_sentinel_ask(st->sentinel);
}

/* Whether the sentinels answered a question sent after ticket <t>. */
static bool sentinel_answered(struct store_redis *st, uint64_t t)
{
    return atomic_load(&st->sentinel_fresh) >= t;
}

/* Gives the connection up (not from inside its own I/O: from a reply
 * callback, or the loop); what it holds fails with -ECONNRESET. With
 * <backoff> it failed (with Sentinel: ask where the master is now), without
 * it the master moved (the sentinels' answer that moved it is fresh). */
static void link_drop(struct link *k, int err, const char *why, bool backoff)
{
    struct redis_conn *c = k->conn;

    k->conn = NULL;
    k->ready = false;
    k->confirming = false;
    k->last_err = err;
    if (backoff)
        link_rediscover(k);
    node_set_up(k->node, false);
    if (backoff)
        backoff_start(k);
    if (why)
        log_failure(k->lane->st, k->node, why);
    redis_conn_free(c); /* sent ops: -ECANCELED, answered as -ECONNRESET */
    link_acked(k, UINT64_MAX, -1); /* writes whose WAIT was not sent yet */
    k->writes_sent = k->writes_covered = 0;
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
        /* It says it is the master (or an ACL forbids ROLE: READONLY replies
         * tell), but a master that was frozen while the sentinels promoted
         * another says so too until they demote it, and this set-up may have
         * waited on it all that time. Nothing is sent before the sentinels,
         * asked now, name this address again: the answer wakes the lane
         * (link_dispatch()), or moves the master and drops this connection. */
        k->confirming = true;
        k->fresh_after = redis_sentinel_ask(k->lane->st->sentinel);
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
    if (!k->lane->st->sentinel) {
        link_confirmed(k);
        return;
    }
    if (redis_conn_command(k->conn, 1, argv, lens, on_role, k) < 0)
        link_drop(k, -ECONNRESET, NULL, true);
}

/* INFO persistence: whether the node keeps an append-only file. */
static void on_info_persistence(void *ctx, int err, const redisReply *r)
{
    struct link *k = ctx;
    const char *at;

    if (err < 0)
        return;
    k->aof = -1;
    if (r->type == REDIS_REPLY_STRING) {
        at = strstr(r->str, "aof_enabled:"); /* hiredis ends a reply's string with a NUL */
        if (at && at + 12 < r->str + r->len)
            k->aof = at[12] == '1';
    }
}

/* CONFIG GET appendfsync, where the ACL allows it (managed Redis often does
 * not): with INFO's answer, whether the node keeps what it acknowledged
 * through a restart. Said in the log when it changes; /metrics says it too
 * (idemproxy_store_durable). */
static void on_appendfsync(void *ctx, int err, const redisReply *r)
{
    struct link *k = ctx;
    struct store_redis *st = k->lane->st;
    char name[sizeof(k->node->name)];
    bool fsync_no = false, fsync_read = false;
    int now, was;

    if (err < 0)
        return;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING) {
        fsync_read = true;
        fsync_no = r->element[1]->len == 2 && memcmp(r->element[1]->str, "no", 2) == 0;
    }
    now = k->aof == 0 ? NODE_DURABLE_NO_AOF : fsync_no ? NODE_DURABLE_NO_FSYNC : NODE_DURABLE_YES;
    was = atomic_exchange(&k->node->durable, now);
    if (was == now)
        return;
    node_log_name(st, k->node, name, sizeof(name));
    if (now == NODE_DURABLE_NO_AOF)
        log_warn("redis %s: no append-only file (INFO persistence: aof_enabled:0): a restart of "
                 "Redis forgets every key, so a retry after it runs again; set appendonly yes "
                 "and appendfsync everysec (idemproxy_store_durable is 0)",
                 name);
    else if (now == NODE_DURABLE_NO_FSYNC)
        log_warn("redis %s: appendfsync no: the append-only file is fsynced only when the kernel "
                 "pleases, so a crash of its machine loses the last keys written; set "
                 "appendfsync everysec (idemproxy_store_durable is 0)",
                 name);
    else if (k->aof < 0)
        log_warn("redis %s: INFO persistence did not answer (an ACL without +info?), so whether "
                 "Redis keeps its keys through a restart is not known; taken as durable",
                 name);
    else
        log_info("redis %s: keeps its writes in an append-only file, fsynced %s", name,
                 fsync_read ? "at least every second"
                            : "as configured (CONFIG GET is not allowed)");
}

static void link_on_ready(void *ctx)
{
    struct link *k = ctx;
    /* an empty key: waiters ignore it */
    const char *argv[] = { "PUBLISH", NOTIFY_CHANNEL, "" };
    size_t lens[] = { 7, sizeof(NOTIFY_CHANNEL) - 1, 0 };
    const char *info[] = { "INFO", "persistence" }, *cfg[] = { "CONFIG", "GET", "appendfsync" };
    size_t info_lens[] = { 4, 11 }, cfg_lens[] = { 6, 3, 11 };

    k->aof = -1;
    /* Pipelined: the link is ready once the probe (and ROLE) answer; the
     * durability answers come with them, and change nothing but the log. */
    if (redis_conn_command(k->conn, 3, argv, lens, on_publish_probe, k) < 0 ||
        redis_conn_command(k->conn, 2, info, info_lens, on_info_persistence, k) < 0 ||
        redis_conn_command(k->conn, 3, cfg, cfg_lens, on_appendfsync, k) < 0)
        link_drop(k, -ECONNRESET, NULL, true);
}

/* The connection failed; the ops sent on it got the error already. */
static void link_on_down(void *ctx, int err, const char *why)
{
    struct link *k = ctx;
    struct store_redis *st = k->lane->st;

    redis_conn_free(k->conn);
    k->conn = NULL;
    link_acked(k, UINT64_MAX, -1); /* writes whose WAIT was not sent yet */
    k->writes_sent = k->writes_covered = 0;
    node_set_up(k->node, false);
    if (!k->ready)
        backoff_start(k);
    k->ready = false;
    k->confirming = false;
    k->last_err = err;
    log_failure(st, k->node, why);
    op_list_fail(&k->waiting, err);
    link_rediscover(k); /* Sentinel: find the master again on every reconnect */
    if (is_cluster(st))
        cluster_refresh(st); /* a cluster: a failover, maybe */
}

static const struct redis_conn_handlers link_handlers = {
    .ready = link_on_ready,
    .down = link_on_down,
};

int store_redis_target(struct store_redis *st, unsigned index, struct redis_conn_opts *o,
                       char *tls_name, size_t tls_name_len, unsigned *gen, char *why,
                       size_t why_len)
{
    struct node *n = node_at(st, index);

    if (!n) {
        snprintf(why, why_len, "no such node");
        return -ENXIO;
    }
    *o = (struct redis_conn_opts){
        .name = n->name, /* copied by redis_conn_open(), which the caller calls next */
        .tls = st->tls,
        .tls_name = tls_name,
        .user = st->url.user,
        .password = st->url.password,
        .db = st->url.db,
        .timeout_ms = st->timeout_ms,
    };
    pthread_mutex_lock(&st->addr_mu);
    o->addr = n->addr;
    o->addrlen = n->addrlen;
    *gen = atomic_load(&n->generation);
    snprintf(tls_name, tls_name_len, "%s", st->tls_name[0] ? st->tls_name : n->host);
    if (!n->addrlen)
        snprintf(why, why_len, "%s", n->resolve_why);
    pthread_mutex_unlock(&st->addr_mu);
    return o->addrlen ? 0 : -ENXIO;
}

/* Starts a connection, with AUTH and SELECT ahead of everything. */
static int link_connect(struct link *k)
{
    struct store_redis *st = k->lane->st;
    struct redis_conn_opts o;
    struct redis_conn_handlers h = link_handlers;
    char why[sizeof(k->node->resolve_why)] = "", tls_name[REDIS_URL_HOST_MAX];
    int err;

    if (store_redis_target(st, k->index, &o, tls_name, sizeof(tls_name), &k->generation, why,
                           sizeof(why)) < 0) {
        log_failure(st, k->node, why);
        return -ENXIO; /* the name does not resolve (yet): the PING job retries it */
    }
    h.ctx = k;
    err = redis_conn_open(k->lane->loop, &o, &h, &k->conn);
    if (err < 0) {
        snprintf(why, sizeof(why), "cannot connect: %s", strerror(-err));
        log_failure(st, k->node, why);
    }
    return err;
}

/* Moves the ops of <from> whose time has come by <now> to <to> (their
 * deadline, or with <retries> the time of their next try), and brings
 * <*due> down to the earliest time of those left. */
static void ops_take_due(struct list *from, struct list *to, bool retries, uint64_t now,
                         uint64_t *due)
{
    struct list_node *n, *next;

    for (n = list_first(from); n; n = next) {
        struct op *op = list_entry(n, struct op, node);
        uint64_t at = retries ? op->not_before_ms : op->deadline_ms;

        next = list_next(from, n);
        if (at <= now) {
            list_remove(&op->node);
            list_append(to, &op->node);
        } else if (at < *due) {
            *due = at;
        }
    }
}

/* Fails the ops waiting on <k> whose deadline has come (-ETIMEDOUT), and
 * has the lane's timer come back for the next one. */
static void link_expire(struct link *k, uint64_t now)
{
    struct list expired;

    list_init(&expired);
    ops_take_due(&k->waiting, &expired, false, now, &k->lane->timer.due_ms);
    op_list_fail(&expired, -ETIMEDOUT);
}

/* Sends what waits, connects, or fails it fast inside the backoff. */
static void link_dispatch(struct link *k, uint64_t now)
{
    struct store_redis *st = k->lane->st;
    struct op *op;
    int err;

    if (k->conn && k->generation != atomic_load(&k->node->generation))
        link_drop(k, -ECONNRESET, NULL, false); /* the master moved: go there now */
    if (k->confirming && sentinel_answered(st, k->fresh_after)) {
        /* Asked after the set-up, the sentinels still name this address (an
         * answer naming another moved the generation: dropped above). */
        k->confirming = false;
        link_confirmed(k); /* which comes back here to send what waits */
        return;
    }
    if (list_is_empty(&k->waiting))
        return;
    if (k->conn && k->ready) {
        while ((op = op_first(&k->waiting))) {
            list_remove(&op->node);
            /* The slot's master may have changed while this connection was
             * set up: an op goes only where the map says now. */
            if (op_route(st, op) != k->index)
                lane_resend(k->lane, op);
            else if (op_send(k, op) < 0)
                op_fail(op, -ECONNRESET);
        }
        return;
    }
    link_expire(k, now_ms()); /* <now> is UINT64_MAX while the lane finishes */
    if (st->sentinel && (k->confirming || (!k->conn && !sentinel_answered(st, k->fresh_after)))) {
        /* Only to an address the sentinels gave after the failure, and
         * confirmed after the set-up: on_master() wakes the lane. A store
         * that stops asks them nothing more. */
        if (atomic_load(&st->stopping))
            op_list_fail(&k->waiting, -ECANCELED);
        return;
    }
    if (k->conn || list_is_empty(&k->waiting))
        return; /* being set up: its ready() or down() sees to them */
    /* Inside the backoff, ops fail fast; but once the node is known to
     * answer again (the readiness PING or another loop's connection got
     * through), waiting out this loop's backoff (up to 1 s) would only turn
     * away requests that Redis can serve. */
    if (now < k->retry_at_ms && !atomic_load_explicit(&k->node->up, memory_order_relaxed)) {
        op_list_fail(&k->waiting, k->last_err ? k->last_err : -ECONNREFUSED);
        return;
    }
    err = link_connect(k);
    if (err < 0) {
        node_set_up(k->node, false);
        backoff_start(k);
        k->last_err = err;
        op_list_fail(&k->waiting, err);
    }
}

/* Sends the retries whose time has come, then what waits on each link.
 * Loop thread (or the thread finishing the lane). */
static void lane_run(struct lane *ln, uint64_t now)
{
    struct list due;
    struct op *op;
    unsigned nnodes;

    list_init(&due);
    ln->timer.due_ms = UINT64_MAX;
    ops_take_due(&ln->later, &due, true, now, &ln->timer.due_ms);
    while ((op = op_first(&due))) {
        list_remove(&op->node);
        lane_resend(ln, op);
    }
    nnodes = atomic_load_explicit(&ln->st->nnodes, memory_order_acquire);
    for (unsigned i = 0; i < nnodes; i++) {
        if (ln->links[i]) {
            link_dispatch(ln->links[i], now);
            link_send_wait(ln->links[i]);
        }
    }
}

static void lane_on_timer(void *ctx)
{
    struct lane *ln = ctx;

    lane_run(ln, now_ms());
}

/* Takes the ops other threads queued. */
static void lane_take_queue(struct lane *ln)
{
    struct list ops;
    struct op *op;

    list_init(&ops);
    pthread_mutex_lock(&ln->mu);
    list_splice(&ops, &ln->queue);
    pthread_mutex_unlock(&ln->mu);
    while ((op = op_first(&ops))) {
        list_remove(&op->node);
        lane_resend(ln, op);
    }
}

static void lane_on_task(void *ctx)
{
    struct lane *ln = ctx;

    lane_take_queue(ln);
    lane_run(ln, now_ms());
}

static bool lane_is_idle(struct lane *ln)
{
    bool idle;

    pthread_mutex_lock(&ln->mu);
    idle = list_is_empty(&ln->queue) && list_is_empty(&ln->later);
    pthread_mutex_unlock(&ln->mu);
    for (unsigned i = 0; idle && i < NODE_MAX; i++) {
        struct link *k = ln->links[i];

        idle = !k || (list_is_empty(&k->waiting) && list_is_empty(&k->held) && k->sent == 0);
    }
    return idle;
}

/* Runs the lane until every op it accepted has called back, then closes its
 * connections. On the loop thread, or on any thread once the loop has
 * stopped: either way nothing else drives it meanwhile. No op is accepted
 * any more, and none is retried. */
static void lane_finish(void *ctx)
{
    struct lane *ln = ctx;

    for (;;) {
        lane_take_queue(ln);
        lane_run(ln, UINT64_MAX); /* every retry at once: none waits for a backoff now */
        if (lane_is_idle(ln))
            break;
        for (unsigned i = 0; i < NODE_MAX; i++) {
            struct link *k = ln->links[i];

            if (k && k->conn && (k->sent || !list_is_empty(&k->waiting)))
                redis_conn_drive(k->conn, 20);
            else if (k && !k->conn)
                link_acked(k, UINT64_MAX, -1);
        }
    }
    for (unsigned i = 0; i < NODE_MAX; i++) {
        if (ln->links[i])
            redis_conn_free(ln->links[i]->conn); /* idle: no op is left on it */
        free(ln->links[i]);
        ln->links[i] = NULL;
    }
    loop_timer_del(ln->loop, &ln->timer); /* the loop may go on without the store */
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
    op->to = NODE_BY_SLOT;
    op->slot = redis_cluster_key_slot(key.base, key.len);
    op->wait = st->wait_replicas > 0; /* every script writes, or may */
    *ret = op;
    return 0;
}

/* Hands <op> to a connection. On one of the store's loop threads, that
 * loop's own: sent at once when it can be (written once the socket is
 * writable), never called back inside this call. From any other thread,
 * queued for the first loop under its lock. On failure (-ECANCELED: the
 * store is being freed or the loop has stopped; -ENOMEM) <op> is freed and
 * nothing calls back. */
int store_redis_op_submit(struct op *op)
{
    struct store_redis *st = op->st;
    struct loop *cur = loop_current();
    struct lane *ln = &st->lanes[0];
    bool was_empty;
    int err = 0;

    op->via = -1;
    op->deadline_ms = now_ms() + (op->life_ms ? op->life_ms : st->timeout_ms);
    op->backoff_ms = RETRY_FIRST_MS;
    for (unsigned i = 0; cur && i < st->nlanes; i++) {
        if (st->lanes[i].loop != cur)
            continue;
        ln = &st->lanes[i];
        op->lane = ln;
        err = atomic_load_explicit(&st->stopping, memory_order_relaxed) ? -ECANCELED
                                                                         : lane_send(ln, op);
        if (err < 0)
            op_free(op);
        return err;
    }
    op->lane = ln;
    pthread_mutex_lock(&ln->mu);
    if (ln->stopping) {
        err = -ECANCELED;
    } else {
        /* Only the first op of a batch posts the task: it takes the whole queue. */
        was_empty = list_is_empty(&ln->queue);
        list_append(&ln->queue, &op->node);
        if (was_empty && (err = loop_post(ln->loop, &ln->task)) < 0)
            list_remove(&op->node);
    }
    pthread_mutex_unlock(&ln->mu);
    if (err < 0)
        op_free(op);
    return err;
}
/* Puts <about> into the op's <head>, as the scripts keep it: written in
 * place, one allocation. */
static int op_set_about(struct op *op, const struct store_about *about)
{
    size_t n = about->route.len + about->method.len + about->target.len + 3;

    if (n > STORE_ABOUT_MAX)
        n = STORE_ABOUT_MAX;
    if (buf_reserve(&op->head, n) < 0)
        return -ENOMEM;
    op->head.len = store_about_format(about, op->head.data, n);
    return 0;
}

static int redis_acquire(struct store *base, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                         const struct store_token *tok, const struct store_lock *lk,
                         store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    if (!fp || !lk || lk->lease_ms == 0 || lk->keep_ms == 0)
        return -EINVAL;
    err = op_new(store_redis_of(base), LUA_ACQUIRE, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    fingerprint_hex(fp, op->fp);
    op->ttl_ms = lk->lease_ms;
    op->keep_ms = lk->keep_ms;
    op->take_over = lk->take_over;
    if (op_set_about(op, &lk->about) < 0) {
        op_free(op);
        return -ENOMEM;
    }
    return store_redis_op_submit(op);
}

static int redis_unknown(struct store *base, struct span key, const struct store_token *tok,
                         enum store_cause cause, const struct store_about *about, uint64_t keep_ms,
                         store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    if (!about || keep_ms == 0 || cause >= STORE_CAUSE_MAX)
        return -EINVAL;
    err = op_new(store_redis_of(base), LUA_UNKNOWN, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    op->cause = cause;
    op->ttl_ms = keep_ms;
    if (op_set_about(op, about) < 0) {
        op_free(op);
        return -ENOMEM;
    }
    return store_redis_op_submit(op);
}

/* Submits <script> (complete, resolve) storing <rec> as <key>'s answer. */
static int submit_record(struct store *base, enum lua_script_id script, struct span key,
                         const struct store_token *tok, struct record *rec, uint64_t ttl_ms,
                         store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    if (!rec || ttl_ms == 0)
        return -EINVAL;
    err = op_new(store_redis_of(base), script, key, tok, done, ctx, &op);
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

static int redis_complete(struct store *base, struct span key, const struct store_token *tok,
                          struct record *rec, uint64_t ttl_ms, store_done_fn *done, void *ctx)
{
    return submit_record(base, LUA_COMPLETE, key, tok, rec, ttl_ms, done, ctx);
}

static int redis_resolve(struct store *base, struct span store_key, struct record *rec,
                         uint64_t ttl_ms, store_done_fn *done, void *ctx)
{
    static const struct store_token none = { .hex = "00000000000000000000000000000000" };

    return submit_record(base, LUA_RESOLVE, store_key, &none, rec, ttl_ms, done, ctx);
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
int store_redis_raw(struct store_redis *st, enum lua_script_id script, int to, int argc,
                    const char **argv, const size_t *lens, redis_reply_fn *fn, void *ctx)
{
    struct op *op;
    size_t key_len = script == LUA_INSPECT ? lens[0] : 0;

    if (argc > (int)ARRAY_SIZE(op->arglen) || (to == NODE_BY_SLOT && script == OP_RAW && argc < 2))
        return -EINVAL;
    op = calloc(1, sizeof(*op) + key_len);
    if (!op)
        return -ENOMEM;
    op->st = st;
    op->script = script;
    op->raw = fn;
    op->raw_ctx = ctx;
    op->head = BUF_INIT(SIZE_MAX);
    op->to = to;
    if (script == LUA_INSPECT) {
        memcpy(op->key, argv[0], key_len);
        op->key_len = key_len;
        op->fp[0] = argv[1][0];
        op->slot = redis_cluster_key_slot(argv[0], lens[0]);
    } else {
        op->argc = argc;
        if (to == NODE_BY_SLOT)
            op->slot = redis_cluster_key_slot(argv[1], lens[1]);
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

static int redis_metrics(struct store *base, store_metric_fn *emit, void *ctx)
{
    struct store_redis *st = store_redis_of(base);
    static const struct {
        const char *name;
        enum lua_script_id script;
    } unreplicated_ops[] = { { "acquire", LUA_ACQUIRE }, { "complete", LUA_COMPLETE },
                             { "release", LUA_RELEASE }, { "extend", LUA_EXTEND },
                             { "unknown", LUA_UNKNOWN }, { "resolve", LUA_RESOLVE } };
    int err = emit(ctx, "idemproxy_redis_connected", NULL, "gauge",
                   "1 while the (current) Redis master of every slot answers",
                   redis_is_ready(base) ? 1 : 0);

    if (err == 0)
        err = emit(ctx, "idemproxy_store_durable", NULL, "gauge",
                   "1 while every Redis master keeps its writes through a restart (an append-only "
                   "file fsynced at least every second, as INFO persistence and CONFIG GET "
                   "appendfsync tell); 0: a restart may forget keys",
                   redis_is_durable(st) ? 1 : 0);
    if (err == 0)
        err = emit(ctx, "idemproxy_redis_failovers_total", NULL, "counter",
                   "times another master took over (named by the sentinels, or a cluster slot's)",
                   atomic_load(&st->failovers));
    if (err == 0)
        err = emit(ctx, "idemproxy_redis_redirections_total", NULL, "counter",
                   "Redis Cluster MOVED and ASK redirections followed",
                   atomic_load(&st->redirections));
    for (int i = 0; i < (int)ARRAY_SIZE(unreplicated_ops) && err == 0; i++) {
        char labels[32];

        snprintf(labels, sizeof(labels), "op=\"%s\"", unreplicated_ops[i].name);
        err = emit(ctx, "idemproxy_store_unreplicated_total", labels, i == 0 ? "counter" : NULL,
                   i == 0 ? "Writes that --redis-wait-replicas replicas did not confirm in time "
                            "(an acquire among them was refused)"
                          : NULL,
                   atomic_load(&st->unreplicated[unreplicated_ops[i].script]));
    }
    return err;
}

/* Looks the host of node <index> up (blocking: never on a loop thread) and
 * keeps an address for the loops' connects, IPv4 first (a non-blocking
 * connect takes one address only; Redis listens on IPv4 more often than
 * not, and "localhost" may list ::1 first). A failed lookup keeps the last
 * address, and says why when there is none. */
static void resolve_node(struct store_redis *st, unsigned index)
{
    static const int families[] = { AF_INET, AF_INET6 };
    struct node *n = st->nodes[index];
    struct sockaddr_storage addr;
    socklen_t addrlen = 0;
    char port[8], why[sizeof(n->resolve_why)] = "", host[REDIS_URL_HOST_MAX];
    int gai = 0;

    pthread_mutex_lock(&st->addr_mu);
    snprintf(host, sizeof(host), "%s", n->host);
    snprintf(port, sizeof(port), "%u", n->port);
    pthread_mutex_unlock(&st->addr_mu);
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
    if (strcmp(host, n->host) != 0) {
        /* the target moved meanwhile: this answer is for the old one */
    } else if (addrlen) {
        n->addr = addr;
        n->addrlen = addrlen;
    } else if (!n->addrlen) {
        snprintf(n->resolve_why, sizeof(n->resolve_why), "%s", why);
    }
    pthread_mutex_unlock(&st->addr_mu);
}

/* ---- Sentinel: the master moves ---- */

/* Has <ln>'s loop run the lane (any thread): links waiting for the
 * sentinels' answer go on. */
static void lane_wake(struct lane *ln)
{
    if (!atomic_exchange(&ln->wake_posted, true) && loop_post(ln->loop, &ln->wake) < 0)
        atomic_store(&ln->wake_posted, false); /* stopped */
}

static void lane_on_wake(void *ctx)
{
    struct lane *ln = ctx;

    atomic_store(&ln->wake_posted, false);
    if (!atomic_load(&ln->st->stopping)) /* else lane_finish() drives it */
        lane_run(ln, now_ms());
}

static void flush_wake(void *ctx) { (void)ctx; /* queued behind the wakes posted before it */ }

/* The sentinels named the master <host>:<port> (on the first loop's thread),
 * in an answer fresh for the tickets up to <fresh>. A new one takes effect
 * at once: every connection to the old one goes the next time it is used,
 * and every lane looks at once. An IP address needs no lookup; a name is
 * looked up by the next PING job. */
static void on_master(void *ctx, const char *host, unsigned port, uint64_t fresh)
{
    struct store_redis *st = ctx;
    struct node *n = st->nodes[0];

    pthread_mutex_lock(&st->addr_mu);
    if (strcmp(n->host, host) != 0 || n->port != port) {
        if (n->host[0])
            atomic_fetch_add(&st->failovers, 1);
        node_set_addr(n, host, port); /* its name stays "master '<name>'" */
        snprintf(n->resolve_why, sizeof(n->resolve_why),
                 "the master %.255s:%u the sentinels named does not resolve (yet)", host, port);
    }
    pthread_mutex_unlock(&st->addr_mu);
    if (fresh > atomic_load(&st->sentinel_fresh)) /* this thread is the only writer */
        atomic_store(&st->sentinel_fresh, fresh);
    for (unsigned i = 0; i < st->nlanes; i++)
        lane_wake(&st->lanes[i]);
}

/* ---- Cluster: the slot map ---- */

static void ping(struct store_redis *st, unsigned index);

/* Makes the map of <ranges> the store's: each slot's master, SLOT_NONE
 * where none is known. A slot that changes hands from a master that is
 * down counts as a failover. On the first loop's thread. */
static void map_apply(struct store_redis *st, const struct redis_slot_range *ranges, int n)
{
    uint16_t *map = malloc(REDIS_CLUSTER_SLOTS * sizeof(*map));
    bool failover = false;

    if (!map)
        return;
    for (unsigned s = 0; s < REDIS_CLUSTER_SLOTS; s++)
        map[s] = SLOT_NONE;
    for (int r = 0; r < n; r++) {
        int i = node_get(st, &ranges[r].master);

        for (unsigned s = ranges[r].first; i >= 0 && s <= ranges[r].last; s++)
            map[s] = (uint16_t)i;
    }
    for (unsigned s = 0; s < REDIS_CLUSTER_SLOTS; s++) {
        uint16_t old = atomic_load_explicit(&st->slots[s], memory_order_relaxed);

        if (old == map[s])
            continue;
        if (old != SLOT_NONE && map[s] != SLOT_NONE && node_at(st, old) &&
            !atomic_load(&node_at(st, old)->up))
            failover = true;
        atomic_store_explicit(&st->slots[s], map[s], memory_order_relaxed);
    }
    if (failover)
        atomic_fetch_add(&st->failovers, 1);
    free(map);
}

/* The CLUSTER SLOTS answer of node <refresh_node>. */
static void on_slots(void *ctx, int err, const redisReply *r)
{
    struct store_redis *st = ctx;
    unsigned from = atomic_load(&st->refresh_node), nnodes = atomic_load(&st->nnodes);
    struct redis_slot_range *ranges = NULL;
    char self[REDIS_URL_HOST_MAX];
    unsigned masters[NODE_MAX];
    int n;

    atomic_store(&st->refreshing, false);
    if (err == 0 && r->type == REDIS_REPLY_ERROR && atomic_load(&st->mode) == MODE_UNKNOWN &&
        r->len < 200 && strstr(r->str, "cluster support disabled")) {
        atomic_store(&st->mode, MODE_SINGLE); /* one server: node 0 is all there is */
        return;
    }
    if (err < 0 || r->type != REDIS_REPLY_ARRAY) {
        /* Ask another node, and at the next occasion: a dead node says nothing
         * about the map, and the failover it may be part of wants one soon. */
        atomic_store(&st->refresh_node, (from + 1) % nnodes);
        atomic_store(&st->refresh_ms, 0);
        return;
    }
    pthread_mutex_lock(&st->addr_mu);
    snprintf(self, sizeof(self), "%s", st->nodes[from]->host);
    pthread_mutex_unlock(&st->addr_mu);
    n = redis_cluster_slots_parse(r, self, &ranges);
    if (n < 0) {
        atomic_store(&st->refresh_node, (from + 1) % nnodes);
        atomic_store(&st->refresh_ms, 0);
        return;
    }
    map_apply(st, ranges, n);
    free(ranges);
    atomic_store(&st->mode, MODE_CLUSTER);
    /* /readyz needs every master to answer: ask the ones not heard yet now */
    nnodes = store_redis_masters(st, masters);
    for (unsigned i = 0; i < nnodes; i++) {
        if (node_at(st, masters[i]) && !atomic_load(&node_at(st, masters[i])->up))
            ping(st, masters[i]);
    }
}

/* Asks a node for the slot map (CLUSTER SLOTS), unless one was asked for
 * less than REFRESH_MIN_MS ago or is under way. Any thread. */
static void cluster_refresh(struct store_redis *st)
{
    const char *argv[] = { "CLUSTER", "SLOTS" };
    size_t lens[] = { 7, 5 };
    uint64_t now = now_ms(), last = atomic_load(&st->refresh_ms);

    if (now < last + REFRESH_MIN_MS || atomic_load(&st->stopping) ||
        atomic_exchange(&st->refreshing, true))
        return;
    atomic_store(&st->refresh_ms, now);
    if (store_redis_raw(st, OP_RAW, (int)atomic_load(&st->refresh_node), 2, argv, lens, on_slots,
                        st) < 0)
        atomic_store(&st->refreshing, false);
}

/* ---- readiness ---- */

static void ping_done(void *ctx, int err, const struct store_result *res)
{
    (void)ctx, (void)err, (void)res; /* on_op_reply() set the node's state */
}

static void ping(struct store_redis *st, unsigned index)
{
    struct op *op = calloc(1, sizeof(*op));

    if (!op)
        return;
    op->st = st;
    op->script = OP_PING;
    op->done = ping_done;
    op->head = BUF_INIT(0);
    op->to = (int)index;
    (void)store_redis_op_submit(op); /* refused only while the store stops */
}

/* Every PING_INTERVAL_MS, on a pool thread: looks the hosts up again, and
 * PINGs Redis (each master of a cluster) on the first loop's connections
 * (connecting them when there are none), so that /readyz follows Redis
 * without traffic. Asks for the slot map until it is known whether this is
 * a cluster; on a cluster, again while a slot lacks a master that answers,
 * or every REFRESH_IDLE_MS. */
static void ping_run(void *arg)
{
    struct store_redis *st = arg;
    unsigned masters[NODE_MAX], n, nnodes = atomic_load_explicit(&st->nnodes, memory_order_acquire);
    int mode = atomic_load(&st->mode);

    if (st->sentinel)
        redis_sentinel_resolve(st->sentinel);
    for (unsigned i = 0; i < nnodes; i++)
        resolve_node(st, i); /* for the loops' next connects */
    n = store_redis_masters(st, masters);
    for (unsigned i = 0; i < n; i++)
        ping(st, masters[i]);
    if (mode == MODE_UNKNOWN || (mode == MODE_CLUSTER && (!redis_is_ready(&st->base) ||
                                                          now_ms() >= atomic_load(&st->refresh_ms) +
                                                                          REFRESH_IDLE_MS)))
        cluster_refresh(st);
}

static void redis_free(struct store *base)
{
    struct store_redis *st = store_redis_of(base);
    bool had_sentinel;

    store_redis_notify_stop(st->sub);
    worker_every_stop(st->pinger); /* waits for a ping in progress */
    /* Refuse new ops everywhere first: a callback run while one connection
     * finishes could otherwise call on another that has finished already. */
    atomic_store(&st->stopping, true);
    for (unsigned i = 0; i < st->nlanes; i++) {
        pthread_mutex_lock(&st->lanes[i].mu);
        st->lanes[i].stopping = true;
        pthread_mutex_unlock(&st->lanes[i].mu);
    }
    /* Each is finished by its loop thread, or right here once its loop has
     * stopped: everything accepted calls back before this returns. */
    for (unsigned i = 0; i < st->nlanes; i++)
        loop_call(st->lanes[i].loop, lane_finish, &st->lanes[i]);
    had_sentinel = st->sentinel != NULL;
    redis_sentinel_free(st->sentinel); /* no link is left to ask it */
    for (unsigned i = 0; had_sentinel && i < st->nlanes; i++)
        loop_call(st->lanes[i].loop, flush_wake, NULL); /* no wake may run after free() */
    store_calls_done(&st->calls);      /* inspect and purge */

    for (unsigned i = 0; i < st->nlanes; i++)
        pthread_mutex_destroy(&st->lanes[i].mu);
    free(st->lanes);
    for (unsigned i = 0; i < atomic_load(&st->nnodes); i++)
        free(st->nodes[i]);
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
    .unknown = redis_unknown,
    .extend = redis_extend,
    .inspect = store_redis_inspect,
    .purge = store_redis_purge,
    .list_unknown = store_redis_list_unknown,
    .resolve = redis_resolve,
    .set_notify = store_redis_set_notify,
    .is_ready = redis_is_ready,
    .metrics = redis_metrics,
    .free = redis_free,
};

/* The nodes the URL names: the server, the seeds, or (Sentinel) node 0
 * with no address until the sentinels name the master. */
static int add_url_nodes(struct store_redis *st)
{
    struct node *n;

    if (st->url.kind == REDIS_URL_SENTINEL) {
        n = calloc(1, sizeof(*n));
        if (!n)
            return -ENOMEM;
        snprintf(n->resolve_why, sizeof(n->resolve_why),
                 "no master known yet: the sentinels are being asked");
        snprintf(n->name, sizeof(n->name), "%s", st->name);
        st->nodes[0] = n;
        atomic_store(&st->nnodes, 1);
        atomic_store(&st->mode, MODE_SINGLE);
    }
    for (unsigned i = 0; st->url.kind != REDIS_URL_SENTINEL && i < st->url.nhosts; i++) {
        int err = node_get(st, &st->url.hosts[i]);

        if (err < 0)
            return err;
    }
    for (unsigned i = 0; i < REDIS_CLUSTER_SLOTS; i++)
        atomic_init(&st->slots[i], SLOT_NONE);
    return 0;
}

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
             o->tls_server_name ? o->tls_server_name : ""); /* "": the node's host */
    st->base.ops = &redis_ops;
    st->pool = pool;
    st->timeout_ms = o->timeout_ms;
    st->wait_replicas = o->wait_replicas;
    st->wait_timeout_ms = o->wait_timeout_ms;
    atomic_init(&st->stopping, false);
    pthread_mutex_init(&st->addr_mu, NULL);
    pthread_mutex_init(&st->log_mu, NULL);
    if (st->url.kind == REDIS_URL_SENTINEL)
        snprintf(st->name, sizeof(st->name), "master '%.200s'", st->url.master);
    else if (st->url.kind == REDIS_URL_SEEDS)
        snprintf(st->name, sizeof(st->name), "cluster");
    else
        redis_addr_format(&st->url.hosts[0], st->name, sizeof(st->name));
    store_calls_init(&st->calls);
    err = add_url_nodes(st);
    if (err == 0) {
        for (unsigned i = 0; i < atomic_load(&st->nnodes); i++)
            resolve_node(st, i); /* here, before any loop runs; then by the PING job */
        st->lanes = calloc(nloops, sizeof(*st->lanes));
        err = st->lanes ? 0 : -ENOMEM;
    }
    if (err < 0) {
        redis_free(&st->base);
        return err;
    }
    for (unsigned i = 0; i < nloops; i++) {
        struct lane *ln = &st->lanes[i];

        ln->st = st;
        ln->loop = loops[i];
        list_init(&ln->queue);
        list_init(&ln->later);
        ln->timer = (struct loop_timer){ .fn = lane_on_timer, .ctx = ln, .due_ms = UINT64_MAX };
        ln->task = (struct loop_task){ .fn = lane_on_task, .ctx = ln };
        ln->wake = (struct loop_task){ .fn = lane_on_wake, .ctx = ln };
        atomic_init(&ln->wake_posted, false);
        pthread_mutex_init(&ln->mu, NULL);
        st->nlanes++;
        (void)loop_timer_add(loops[i], &ln->timer); /* taken back by lane_finish() */
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
