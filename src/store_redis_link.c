/* SPDX-License-Identifier: MIT */
/* The Redis store's connections and the ops in flight on them: one
 * connection per event loop and node (redis_conn.h), driven by that loop. A
 * request's ops are sent and answered on the thread that serves it, without
 * waking another; ops queued in one loop turn go out in one write
 * (pipelining); replies call back on the loop thread, in order. Ops from
 * other threads (heartbeats, --wait retries) are queued for the first loop.
 * An op is sent again with backoff on TRYAGAIN, CLUSTERDOWN or a lost
 * connection until --store-timeout has passed (every script is idempotent
 * for its fencing token, so a second run changes nothing), confirmed by WAIT
 * under --redis-wait-replicas, and a failed acquire's lock is given back. */
#include "store_redis_impl.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/buf.h"
#include "idemproxy/list.h"
#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "idemproxy/record.h"
#include "idemproxy/redis_cluster.h"
#include "idemproxy/redis_conn.h"
#include "idemproxy/redis_sentinel.h"
#include "lua_scripts.h"

#define RETRY_FIRST_MS 20 /* the first wait before an op is sent again (cluster) */
#define RETRY_MAX_MS 200
#define GIVE_BACK_MAX 4096 /* give-backs being retried at once; past that, locks expire */

static void give_back(struct op *acq);
static void link_on_down(void *ctx, int err, const char *why);
static void on_op_reply(void *ctx, int err, const redisReply *reply);
static void log_failure(struct store_redis *st, const struct node *n, const char *why);

/* One WAIT on <link>, covering its writes up to number <seq>. */
struct wait_call {
    struct link *link;
    uint64_t seq;
};

static const struct redis_conn_handlers link_handlers = {
    .ready = store_redis_link_on_ready,
    .down = link_on_down,
};

static bool reply_str_eq(const redisReply *r, const char *s)
{
    size_t n = strlen(s);

    return (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) && r->len == n &&
           memcmp(r->str, s, n) == 0;
}

/* Whether <r> is acquire.lua's answer <word> of <n> elements, maybe
 * followed by the trace context kept with the key (an older script's has
 * none). */
static bool reply_is(const redisReply *r, const char *word, size_t n)
{
    return (r->elements == n || r->elements == n + 1) && reply_str_eq(r->element[0], word);
}

/* The trace context after the <n> elements of <r>'s answer: empty when none. */
static int reply_trace(const redisReply *r, size_t n, struct span *ret)
{
    const redisReply *t = r->elements > n ? r->element[n] : NULL;

    if (t && t->type != REDIS_REPLY_STRING)
        return -EPROTO;
    if (t && t->len)
        *ret = (struct span){ t->str, t->len };
    return 0;
}

static int parse_acquire(const redisReply *r, struct store_result *res)
{
    const redisReply *h, *b;
    size_t n = 0; /* the elements before a trace context: none for the other answers */
    int err;

    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1)
        return -EPROTO;
    if (r->elements == 1 && reply_str_eq(r->element[0], "acquired")) {
        res->status = STORE_ACQUIRED;
    } else if (r->elements == 1 && reply_str_eq(r->element[0], "absent")) {
        res->status = STORE_EXPIRED; /* a probe found no record: store_redis.c reads it so */
    } else if (r->elements == 1 && reply_str_eq(r->element[0], "expired")) {
        res->status = STORE_EXPIRED; /* no record, and its tombstone (KEYS[2]) */
    } else if (reply_is(r, "in_flight", 1)) {
        res->status = STORE_IN_FLIGHT;
        n = 1;
    } else if (reply_is(r, "mismatch", 2) && r->element[1]->type == REDIS_REPLY_STRING) {
        res->status = STORE_MISMATCH;
        n = 2;
        res->resource = (struct span){ r->element[1]->str, r->element[1]->len };
    } else if (reply_is(r, "unknown", 4)) {
        h = r->element[1];
        b = r->element[2];
        if (h->type != REDIS_REPLY_STRING || b->type != REDIS_REPLY_STRING ||
            store_cause_parse((struct span){ h->str, h->len }, &res->cause) < 0)
            return -EPROTO;
        res->about = (struct span){ .base = b->str, .len = b->len };
        res->became = reply_str_eq(r->element[3], "1");
        res->status = STORE_UNKNOWN;
        n = 4;
    } else if (reply_is(r, "completed", 3)) {
        h = r->element[1];
        b = r->element[2];
        if (h->type != REDIS_REPLY_STRING || b->type != REDIS_REPLY_STRING)
            return -EPROTO;
        err = record_decode((struct span){ .base = h->str, .len = h->len },
                            (struct span){ .base = b->str, .len = b->len }, &res->rec);
        if (err < 0)
            return err == -ENOMEM ? err : -EPROTO;
        res->status = STORE_COMPLETED;
        n = 3;
    } else {
        return -EPROTO;
    }
    return n ? reply_trace(r, n, &res->trace) : 0;
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

static struct op *op_first(const struct list *l)
{
    struct list_node *n = list_first(l);

    return n ? list_entry(n, struct op, node) : NULL;
}

void store_redis_op_free(struct op *op)
{
    if (!op)
        return;
    record_unref(op->rec);
    buf_done(&op->head);
    free(op->resource);
    free(op->tomb);
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
    if (op->script == LUA_PROBE)
        return store_redis_parse_probe(reply, res);
    return parse_ok_or_stale(reply, res);
}

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
    store_redis_op_free(op);
}

/* Calls <op> back with <err>, or with the result <reply> holds (err 0), and
 * frees it; with --redis-wait-replicas, a write is held for the WAIT sent
 * after it instead. On its lane's loop thread, with <op> on no list. */
static void op_finish(struct op *op, int err, const redisReply *reply)
{
    struct store_result res = { .rec = NULL };

    if (op->raw) {
        op->raw(op->raw_ctx, err, err == 0 ? reply : NULL);
        store_redis_op_free(op);
        return;
    }
    if (err == 0)
        err = op_parse(op, reply, &res);
    if (err == 0 && op->wait && (res.status == STORE_ACQUIRED || res.status == STORE_OK)) {
        op->held = res; /* no record: only a replay carries one */
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
    if (store_redis_op_new(st, LUA_RELEASE, (struct span){ acq->key, acq->key_len }, &acq->tok,
                           give_back_done, st, &rel) < 0)
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
    struct store_result res = op->held;

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

static void on_wait(void *ctx, int err, const redisReply *reply)
{
    struct wait_call *w = ctx;
    struct link *k = w->link;

    k->sent--;
    link_acked(k, w->seq, err == 0 && reply->type == REDIS_REPLY_INTEGER ? reply->integer : -1);
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
        store_redis_cluster_refresh(st); /* where the slot lives may have changed */
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

static void on_asking(void *ctx, int err, const redisReply *reply)
{
    (void)ctx, (void)err, (void)reply; /* the command after it tells */
}

/* Sends the script of <op> on the link's connection (EVALSHA, or EVAL once
 * Redis said NOSCRIPT): appended to the output, which goes out with every
 * other op of this loop turn in one write (pipelining). */
static int op_send(struct link *k, struct op *op)
{
    const char *argv[OP_ARGS_MAX];
    size_t lens[OP_ARGS_MAX];
    char ttl[24], keep[24];
    int argc, err;

    if (op->asking) {
        const char *asking[] = { "ASKING" };
        size_t asking_len[] = { 6 };

        err = redis_conn_command(k->conn, 1, asking, asking_len, on_asking, NULL);
        if (err < 0)
            return err;
        op->asking = false;
    }
    op->via = -1; /* an ASK holds for one send */
    argc = store_redis_op_args(op, argv, lens, ttl, keep);
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
    struct link *k = lane_link(ln, store_redis_op_route(ln->st, op));

    if (!k)
        return -ENOMEM;
    if (link_is_current(k) && op_send(k, op) == 0)
        return 0;
    list_append(&k->waiting, &op->node);
    ln->timer.due_ms = 0;
    return 0;
}

void store_redis_lane_resend(struct lane *ln, struct op *op)
{
    if (lane_send(ln, op) < 0)
        op_finish(op, -ENOMEM, NULL);
}

/* An op's reply, or the error of its connection. */
static void on_op_reply(void *ctx, int err, const redisReply *reply)
{
    struct op *op = ctx;
    struct link *k = op->link;
    struct store_redis *st = op->st;

    k->sent--;
    if (err < 0) {
        store_redis_node_set_up(k->node, false);
        op_fail(op, err == -ECANCELED ? -ECONNRESET : err);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        /* NOSCRIPT only means the script cache was emptied (or this node,
         * a promoted replica, never had it). */
        if (!op->eval && redis_reply_is_error(reply, "NOSCRIPT")) {
            store_redis_node_set_up(k->node, true);
            op->eval = true; /* EVAL caches it again for the EVALSHAs after it */
            if (op_send(k, op) < 0)
                op_fail(op, -ECONNRESET);
            return;
        }
        if ((redis_reply_is_error(reply, "MOVED") || redis_reply_is_error(reply, "ASK")) &&
            store_redis_follow_redirect(k, op, reply)) {
            store_redis_node_set_up(k->node, true);
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
                store_redis_link_drop(k, -EAGAIN,
                                      "READONLY: a replica now; asking the sentinels again", true);
            return;
        }
    }
    /* Redis answers, but an error (LOADING, MISCONF, OOM, NOAUTH…) to one of
     * ours means it cannot serve us; an operator's command (or CLUSTER SLOTS
     * on a server without cluster support) may be refused by a healthy one. */
    if (!op->raw) {
        store_redis_node_set_up(k->node, reply->type != REDIS_REPLY_ERROR);
        if (reply->type == REDIS_REPLY_ERROR) {
            char why[300];

            snprintf(why, sizeof(why), "%.*s", (int)(reply->len > 280 ? 280 : reply->len),
                     reply->str);
            log_failure(st, k->node, why); /* as Redis said it, once */
        }
    }
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
static void log_failure(struct store_redis *st, const struct node *n, const char *why)
{
    char name[sizeof(n->name)], line[sizeof(st->logged_why)];

    store_redis_node_log_name(st, n, name, sizeof(name));
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

    store_redis_node_log_name(st, n, name, sizeof(name));
    len = strlen(name);
    pthread_mutex_lock(&st->log_mu);
    if (strncmp(st->logged_why, name, len) == 0 && st->logged_why[len] == ':') {
        st->logged_why[0] = '\0';
        log_info("redis %s: connected", name);
    }
    pthread_mutex_unlock(&st->log_mu);
}

/* The connection is set up, and (Sentinel) it is the master. */
void store_redis_link_confirmed(struct link *k)
{
    k->ready = true;
    k->backoff_ms = 0;
    k->last_err = 0;
    store_redis_node_set_up(k->node, true);
    log_recovery(k->lane->st, k->node);
    store_redis_link_dispatch(k, now_ms());
}

/* Sentinel: the link failed, so the master may have moved; the next
 * connection waits for the sentinels' answer to a question asked now. */
static void link_rediscover(struct link *k)
{
    struct store_redis *st = k->lane->st;

    if (st->sentinel)
        k->fresh_after = redis_sentinel_ask(st->sentinel);
}

/* Gives the connection up (not from inside its own I/O: from a reply
 * callback, or the loop); what it holds fails with -ECONNRESET. With
 * <backoff> it failed (with Sentinel: ask where the master is now), without
 * it the master moved (the sentinels' answer that moved it is fresh). */
void store_redis_link_drop(struct link *k, int err, const char *why, bool backoff)
{
    struct redis_conn *c = k->conn;

    k->conn = NULL;
    k->ready = false;
    k->confirming = false;
    k->last_err = err;
    if (backoff)
        link_rediscover(k);
    store_redis_node_set_up(k->node, false);
    if (backoff)
        backoff_start(k);
    if (why)
        log_failure(k->lane->st, k->node, why);
    redis_conn_free(c);            /* sent ops: -ECANCELED, answered as -ECONNRESET */
    link_acked(k, UINT64_MAX, -1); /* writes whose WAIT was not sent yet */
    k->writes_sent = k->writes_covered = 0;
    op_list_fail(&k->waiting, err);
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
    store_redis_node_set_up(k->node, false);
    if (!k->ready)
        backoff_start(k);
    k->ready = false;
    k->confirming = false;
    k->last_err = err;
    log_failure(st, k->node, why);
    op_list_fail(&k->waiting, err);
    link_rediscover(k); /* Sentinel: find the master again on every reconnect */
    if (is_cluster(st))
        store_redis_cluster_refresh(st); /* a cluster: a failover, maybe */
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
void store_redis_link_dispatch(struct link *k, uint64_t now)
{
    struct store_redis *st = k->lane->st;
    struct op *op;
    int err;

    if (k->conn && k->generation != atomic_load(&k->node->generation))
        store_redis_link_drop(k, -ECONNRESET, NULL, false); /* the master moved: go there now */
    if (k->confirming && store_redis_sentinel_answered(st, k->fresh_after)) {
        /* Asked after the set-up, the sentinels still name this address (an
         * answer naming another moved the generation: dropped above). */
        k->confirming = false;
        store_redis_link_confirmed(k); /* which comes back here to send what waits */
        return;
    }
    if (list_is_empty(&k->waiting))
        return;
    if (k->conn && k->ready) {
        while ((op = op_first(&k->waiting))) {
            list_remove(&op->node);
            /* The slot's master may have changed while this connection was
             * set up: an op goes only where the map says now. */
            if (store_redis_op_route(st, op) != k->index)
                store_redis_lane_resend(k->lane, op);
            else if (op_send(k, op) < 0)
                op_fail(op, -ECONNRESET);
        }
        return;
    }
    link_expire(k, now_ms()); /* <now> is UINT64_MAX while the lane finishes */
    if (st->sentinel &&
        (k->confirming || (!k->conn && !store_redis_sentinel_answered(st, k->fresh_after)))) {
        /* Only to an address the sentinels gave after the failure, and
         * confirmed after the set-up: store_redis_on_master() wakes the lane. A store
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
        store_redis_node_set_up(k->node, false);
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
        store_redis_lane_resend(ln, op);
    }
    nnodes = atomic_load_explicit(&ln->st->nnodes, memory_order_acquire);
    for (unsigned i = 0; i < nnodes; i++) {
        if (ln->links[i]) {
            store_redis_link_dispatch(ln->links[i], now);
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
        store_redis_lane_resend(ln, op);
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

int store_redis_op_new(struct store_redis *st, enum lua_script_id script, struct span key,
                       const struct store_token *tok, store_done_fn *done, void *ctx,
                       struct op **ret)
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
            store_redis_op_free(op);
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
        store_redis_op_free(op);
    return err;
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
                store_redis_op_free(op);
                return -ENOMEM;
            }
        }
    }
    return store_redis_op_submit(op);
}

/* Has <ln>'s loop run the lane (any thread): links waiting for the
 * sentinels' answer go on. */
void store_redis_lane_wake(struct lane *ln)
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

int store_redis_lanes_start(struct store_redis *st, struct loop *const *loops, unsigned nloops)
{
    st->lanes = calloc(nloops, sizeof(*st->lanes));
    if (!st->lanes)
        return -ENOMEM;
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
    return 0;
}

void store_redis_lanes_stop(struct store_redis *st)
{
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
}

void store_redis_lanes_free(struct store_redis *st, bool wakes_posted)
{
    for (unsigned i = 0; wakes_posted && i < st->nlanes; i++)
        loop_call(st->lanes[i].loop, flush_wake, NULL); /* no wake may run after free() */
    for (unsigned i = 0; i < st->nlanes; i++)
        pthread_mutex_destroy(&st->lanes[i].mu);
    free(st->lanes);
    st->lanes = NULL;
    st->nlanes = 0;
}
