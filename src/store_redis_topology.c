/* SPDX-License-Identifier: MIT */
/* Where the Redis store's ops go: the nodes (one server, the master the
 * sentinels name, or the nodes of a cluster), their addresses (looked up off
 * the loops), what each says it is when a connection is set up (the master?
 * durable?), and, on a cluster, the slot map: found by asking CLUSTER SLOTS
 * (a server without cluster support says so), each op goes to the master of
 * its key's slot, follows MOVED (the slot moved: the map learns it and is
 * read again, at most once a second) and ASK (this op only, after ASKING). */
#include "store_redis_impl.h"

#include <hiredis/hiredis.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "idemproxy/log.h"
#include "idemproxy/redis_cluster.h"
#include "idemproxy/redis_conn.h"
#include "idemproxy/redis_sentinel.h"
#include "idemproxy/resolve.h"

#define REFRESH_MIN_MS 1000 /* a slot map is asked for at most once a second */
#define REDIRECTS_MAX 5     /* MOVED and ASK followed by one op */

void store_redis_node_set_up(struct node *n, bool up)
{
    if (atomic_load_explicit(&n->up, memory_order_relaxed) != up)
        atomic_store(&n->up, up);
}

/* Points <n> at <host>:<port> (under addr_mu): an IP address is its
 * address at once, a name waits for the PING job's lookup. */
static void node_set_addr(struct node *n, const char *host, unsigned port)
{
    struct resolve_addr a;
    char p[8];

    snprintf(n->host, sizeof(n->host), "%s", host);
    n->port = port;
    n->addrlen = 0;
    snprintf(n->resolve_why, sizeof(n->resolve_why), "%.255s:%u does not resolve (yet)", host,
             port);
    snprintf(p, sizeof(p), "%u", port);
    if (resolve_host(host, p, RESOLVE_NUMERIC, &a, 1, NULL) == 1 && a.len <= sizeof(n->addr)) {
        memcpy(&n->addr, &a.sa, a.len);
        n->addrlen = a.len;
    }
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

bool store_redis_is_ready(struct store *base)
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
bool store_redis_is_durable(struct store_redis *st)
{
    unsigned masters[NODE_MAX], n = current_masters(st, masters);

    for (unsigned i = 0; i < n; i++) {
        struct node *nd = node_at(st, masters[i]);

        if (!nd || atomic_load(&nd->durable) != NODE_DURABLE_YES)
            return false;
    }
    return n > 0;
}

/* The node <op> goes to now: the one an ASK named, the one it was given,
 * or its slot's master (node 0 until a cluster is known; any node that
 * answers while the slot has no known master: it redirects). */
unsigned store_redis_op_route(struct store_redis *st, const struct op *op)
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

/* MOVED or ASK: <op> goes where Redis says. MOVED also teaches the map and
 * asks for a fresh one; ASK holds for this op's next send only. Returns
 * false when <reply> is no usable redirection (the op fails with it). */
bool store_redis_follow_redirect(struct link *k, struct op *op, const redisReply *reply)
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
        store_redis_cluster_refresh(st);
    } else {
        op->via = i;
        op->asking = true;
    }
    store_redis_lane_resend(k->lane, op);
    return true;
}

/* What the log calls node <n>: the store's name unless it is a cluster's node. */
void store_redis_node_log_name(struct store_redis *st, const struct node *n, char *out, size_t len)
{
    snprintf(out, len, "%s", is_cluster(st) ? n->name : st->name);
}

/* Whether the sentinels answered a question sent after ticket <t>. */
bool store_redis_sentinel_answered(struct store_redis *st, uint64_t t)
{
    return atomic_load(&st->sentinel_fresh) >= t;
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
         * (store_redis_link_dispatch()), or moves the master and drops this connection. */
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
    store_redis_link_drop(k, -EAGAIN, why, true);
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
        store_redis_link_drop(
            k, -EACCES,
            "the Redis user may not PUBLISH to " NOTIFY_CHANNEL
            ": add &idemproxy:* to its ACL (the scripts publish after they write)",
            true);
        return;
    }
    if (!k->lane->st->sentinel) {
        store_redis_link_confirmed(k);
        return;
    }
    if (redis_conn_command(k->conn, 1, argv, lens, on_role, k) < 0)
        store_redis_link_drop(k, -ECONNRESET, NULL, true);
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
    store_redis_node_log_name(st, k->node, name, sizeof(name));
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

void store_redis_link_on_ready(void *ctx)
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
        store_redis_link_drop(k, -ECONNRESET, NULL, true);
}

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

/* Looks the host of node <index> up (blocking: never on a loop thread) and
 * keeps an address for the loops' connects, IPv4 first (a non-blocking
 * connect takes one address only; Redis listens on IPv4 more often than
 * not, and "localhost" may list ::1 first). A failed lookup keeps the last
 * address, and says why when there is none. */
void store_redis_resolve_node(struct store_redis *st, unsigned index)
{
    struct node *n = st->nodes[index];
    struct resolve_addr a;
    socklen_t addrlen = 0;
    char port[8], why[sizeof(n->resolve_why)] = "", host[REDIS_URL_HOST_MAX];
    int gai = 0;

    pthread_mutex_lock(&st->addr_mu);
    snprintf(host, sizeof(host), "%s", n->host);
    snprintf(port, sizeof(port), "%u", n->port);
    pthread_mutex_unlock(&st->addr_mu);
    if (!host[0])
        return; /* no master known yet: the sentinels are being asked */
    if (resolve_host(host, port, 0, &a, 1, &gai) == 1 && a.len <= sizeof(n->addr))
        addrlen = a.len;
    if (!addrlen)
        snprintf(why, sizeof(why), "the host name %.255s does not resolve: %.100s", host,
                 gai ? gai_strerror(gai) : "no address");
    pthread_mutex_lock(&st->addr_mu);
    if (strcmp(host, n->host) != 0) {
        /* the target moved meanwhile: this answer is for the old one */
    } else if (addrlen) {
        memcpy(&n->addr, &a.sa, addrlen);
        n->addrlen = addrlen;
    } else if (!n->addrlen) {
        snprintf(n->resolve_why, sizeof(n->resolve_why), "%s", why);
    }
    pthread_mutex_unlock(&st->addr_mu);
}

/* The sentinels named the master <host>:<port> (on the first loop's thread),
 * in an answer fresh for the tickets up to <fresh>. A new one takes effect
 * at once: every connection to the old one goes the next time it is used,
 * and every lane looks at once. An IP address needs no lookup; a name is
 * looked up by the next PING job. */
void store_redis_on_master(void *ctx, const char *host, unsigned port, uint64_t fresh)
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
        store_redis_lane_wake(&st->lanes[i]);
}

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
            store_redis_ping(st, masters[i]);
    }
}

/* Asks a node for the slot map (CLUSTER SLOTS), unless one was asked for
 * less than REFRESH_MIN_MS ago or is under way. Any thread. */
void store_redis_cluster_refresh(struct store_redis *st)
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

/* The nodes the URL names: the server, the seeds, or (Sentinel) node 0
 * with no address until the sentinels name the master. */
int store_redis_add_url_nodes(struct store_redis *st)
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
