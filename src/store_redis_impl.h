/* SPDX-License-Identifier: MIT */
/* What the Redis store's files share: store_redis.c (the operations, the
 * scripts, readiness, the store's life), store_redis_link.c (the connections
 * and the ops in flight on them), store_redis_topology.c (the nodes, the
 * master, the slot map: where an op goes), store_redis_admin.c (inspect,
 * purge, list, resolve) and store_redis_notify.c (the --wait subscriber).
 * Not an interface: the rest of the program sees store.h and store_redis.h
 * only. */
#ifndef IDEMPROXY_STORE_REDIS_IMPL_H
#define IDEMPROXY_STORE_REDIS_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "idemproxy/buf.h"
#include "idemproxy/list.h"
#include "idemproxy/loop.h"
#include "idemproxy/redis_cluster.h"
#include "idemproxy/redis_conn.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/store.h"
#include "lua_scripts.h"
#include "store_impl.h"

#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 1000
#define OP_PING _LUA_MAX                /* an op that is no script: the readiness PING */
#define OP_RAW (_LUA_MAX + 1)           /* a command given whole (operator calls) */
#define NOTIFY_CHANNEL "idemproxy:done" /* complete.lua and release.lua publish the key */
#define HEAD_MAX_BYTES (64u << 20)      /* far above what RECORD_MAX_HEADERS headers can need */
#define NODE_MAX 512                    /* Redis servers one store knows (cluster nodes) */

struct store_redis;

/* The --wait subscriber: a connection of its own on the first loop,
 * subscribed to NOTIFY_CHANNEL (a subscribed connection can do nothing
 * else), made again with backoff when it fails. Loop thread only. */
struct subscriber {
    struct store_redis *st;
    store_notify_fn *fn;
    void *ctx;
    struct loop *loop;       /* borrowed: the first loop */
    struct loop_timer timer; /* (re)connects */
    struct redis_conn *conn; /* NULL: none */
    unsigned node;           /* the node it listens on: PUBLISH reaches every node of a cluster */
    unsigned generation;     /* of the address <conn> went to */
    uint64_t backoff_ms;
};

/* A Redis server the store sends to: the URL's host or the master the
 * sentinels named (node 0), or a node of a cluster (the seeds first, then
 * each master a slot map or a redirection names). Made once, kept until the
 * store is freed, so an index names it for good. */
struct node {
    char host[REDIS_URL_HOST_MAX]; /* under st->addr_mu: Sentinel moves node 0 */
    unsigned port;
    char name[300]; /* host:port (Sentinel: the master's name), for the log; set once */
    /* The address the loops connect to, so that no loop thread ever waits
     * on a name lookup: an IP address is taken at once, a name is looked up
     * on a pool thread by the PING job. */
    struct sockaddr_storage addr; /* under st->addr_mu */
    socklen_t addrlen;            /* 0 while the name has not resolved */
    char resolve_why[400];        /* why it did not, for the log */
    atomic_uint generation;       /* changes with the address: connections to the old one go */
    atomic_bool up;               /* its last connection was set up and answers */
    /* What its last connection read of INFO persistence and appendfsync:
     * NODE_DURABLE_*, told in the log when it changes. */
    atomic_int durable;
};

enum {
    NODE_DURABLE_UNREAD,   /* not read yet */
    NODE_DURABLE_YES,      /* an append-only file, fsynced at least every second (or unreadable) */
    NODE_DURABLE_NO_AOF,   /* no append-only file: a restart forgets every key */
    NODE_DURABLE_NO_FSYNC, /* appendfsync no: a crash of its machine loses the last writes */
};

struct lane;

/* One event loop's connection to one node for the hot operations, driven by
 * that loop (redis_conn.h). Loop thread only (or, once the loop has
 * stopped, the thread freeing the store). */
struct link {
    struct lane *lane;
    struct node *node;       /* borrowed from the store */
    unsigned index;          /* the node's */
    struct redis_conn *conn; /* NULL: none */
    bool ready;              /* <conn> is set up (and, with Sentinel, confirmed the master) */
    /* Sentinel: no connect before the sentinels answered a question sent
     * after ticket <fresh_after> (redis_sentinel_ask(), at the failure that
     * made this link reconnect); while <confirming>, the same for the
     * question sent once <conn> was set up: the answer must still name the
     * address <conn> went to before any op is sent on it. */
    uint64_t fresh_after;
    int aof; /* INFO persistence of the connection being set up: aof_enabled, -1 unread */
    bool confirming;
    unsigned generation;  /* of the address <conn> went to */
    uint64_t retry_at_ms; /* no connect attempt before this */
    uint64_t backoff_ms;  /* the wait after the last failed connect; 0: it worked */
    int last_err;         /* what ops get inside the backoff */
    size_t sent;          /* ops on <conn>, not answered yet */
    struct list waiting;  /* struct op waiting for the connection to be set up */
    /* --redis-wait-replicas: the writes sent on <conn> are numbered; a WAIT
     * sent after the <n>th covers the first <n>. */
    uint64_t writes_sent;    /* the number of the last write sent */
    uint64_t writes_covered; /* the number of the last write a WAIT was sent after */
    struct list held;        /* struct op (wait_node), written, waiting for their WAIT */
};

/* One event loop's share of the store: a link per node it has sent to, a
 * timer for work put off to a later turn, and a task for ops queued from
 * other threads. Everything below <stopping> belongs to the loop thread. */
struct lane {
    struct store_redis *st;
    struct loop *loop;       /* borrowed */
    struct loop_timer timer; /* registered on <loop> for good */
    struct loop_task task;   /* posted when <queue> stops being empty */
    struct loop_task wake;   /* posted when the sentinels answer: links waiting on them go on */
    atomic_bool wake_posted;
    pthread_mutex_t mu;
    struct list queue;            /* guarded by mu: struct op from other threads */
    bool stopping;                /* guarded by mu: refuse ops from other threads */
    struct list later;            /* struct op to retry once its not_before_ms has come */
    struct link *links[NODE_MAX]; /* owned; made on first use */
};

enum store_redis_mode {
    MODE_UNKNOWN, /* not asked yet: ops go to node 0, and a MOVED would tell */
    MODE_SINGLE,  /* one server (or the master the sentinels name) */
    MODE_CLUSTER, /* a node answered CLUSTER SLOTS: ops go to their slot's master */
};

struct store_redis {
    struct store base;
    struct worker_pool *pool; /* borrowed */
    struct redis_url url;     /* owned */
    struct redis_tls *tls;    /* owned; NULL: plain TCP */
    char tls_name[256];       /* the name checked in the certificate, and sent as SNI */
    uint64_t timeout_ms;
    unsigned wait_replicas; /* WAIT for this many after each write; 0: none */
    uint64_t wait_timeout_ms;
    atomic_ullong unreplicated[_LUA_MAX]; /* writes WAIT did not confirm, by script */

    pthread_mutex_t addr_mu;      /* adding nodes, and the address fields of each */
    struct node *nodes[NODE_MAX]; /* owned; [0, nnodes) are set and never change */
    atomic_uint nnodes;
    atomic_int mode;                             /* enum store_redis_mode */
    _Atomic uint16_t slots[REDIS_CLUSTER_SLOTS]; /* cluster: the node serving each slot */
    atomic_bool refreshing;                      /* a CLUSTER SLOTS is under way */
    atomic_ullong refresh_ms;                    /* when the last one was sent */
    atomic_uint refresh_node;                    /* the node asked next */
    atomic_ullong failovers;         /* another master took over (Sentinel, or a slot's) */
    atomic_ullong redirections;      /* MOVED and ASK followed */
    struct redis_sentinel *sentinel; /* owned: redis-sentinel:// only */
    atomic_ullong sentinel_fresh;    /* the answers so far are fresh up to this ticket */
    atomic_uint releases_pending;    /* give-backs of acquires that failed, being retried */
    char name[300];                  /* what the log calls the store */
    pthread_mutex_t log_mu;
    char logged_why[720]; /* "<name>: <why>": the last failure logged, "" once connected again */

    struct lane *lanes; /* owned array, one per loop */
    unsigned nlanes;
    atomic_bool stopping; /* refuse ops called on a loop thread */
    struct store_calls calls;
    struct worker_every *pinger; /* owned: PINGs every PING_INTERVAL_MS */
    struct subscriber *sub;      /* owned; NULL unless store_set_notify() was called */
};

#define NODE_BY_SLOT (-1) /* an op's <node>: its key's slot decides */

/* One accepted hot operation, owned by the store until it calls back. */
struct op {
    struct store_redis *st;
    struct lane *lane;          /* the loop it runs on */
    struct link *link;          /* the connection it was sent on */
    struct list_node node;      /* on the queue, later or waiting */
    bool eval;                  /* Redis said NOSCRIPT: sent again as EVAL */
    bool asking;                /* ASK: send ASKING first, to <via> */
    int to;                     /* a node index, or NODE_BY_SLOT */
    int via;                    /* >= 0: the next send goes there (ASK), whatever <to> says */
    unsigned slot;              /* of <key> */
    unsigned redirects;         /* MOVED and ASK followed */
    uint64_t deadline_ms;       /* it fails with -ETIMEDOUT from here, and retries stop */
    uint64_t life_ms;           /* the deadline's distance from the submit; 0: --store-timeout */
    bool give_back;             /* a release of a failed acquire: retried on any failure, even
                                   on one server, until its deadline (the lock's own TTL) */
    bool sent;                  /* written to a connection at least once */
    uint64_t not_before_ms;     /* on <lane>'s later list: retried from then */
    uint64_t backoff_ms;        /* the wait before its next retry */
    bool wait;                  /* a write to confirm with WAIT (--redis-wait-replicas) */
    uint64_t write_seq;         /* its number on the link it was last sent on */
    struct store_result held;   /* on <link>'s held list: its result (no record, no span) */
    struct list_node wait_node; /* on <link>'s held list */
    enum lua_script_id script;
    store_done_fn *done;
    void *ctx;
    struct store_token tok;
    char fp[FINGERPRINT_HEX + 1]; /* acquire */
    uint64_t ttl_ms;              /* acquire (the lease), complete, extend, unknown (keep) */
    uint64_t keep_ms;             /* acquire */
    bool take_over;               /* acquire */
    bool probe;                   /* acquire: no record is "absent" (a tombstone is looked for) */
    char trace[STORE_TRACE_LEN];  /* acquire: the lock's trace context, <trace_len> bytes */
    size_t trace_len;             /* 0 (none) or STORE_TRACE_LEN */
    char *tomb; /* acquire, complete: owned, the tombstone's key, a second KEYS of the
                   script on one server; NULL: none (or probed, on a cluster) */
    size_t tomb_len;
    uint8_t tomb_fp[FINGERPRINT_LEN]; /* complete with <tomb>: what the tombstone holds */
    uint64_t tomb_ttl_ms;             /* and how long it is kept */
    enum store_cause cause;           /* unknown */
    enum store_probe_step step;       /* probe */
    struct record *rec;               /* complete, resolve, probe found: own reference (body) */
    char *resource;                   /* complete: owned, its resource link's id; NULL: none */
    size_t resource_len;
    /* complete, resolve, probe found: encoded head; acquire, unknown: about;
     * OP_RAW, the other probe steps: args (their lengths in <arglen>) */
    struct buf head;
    redis_reply_fn *raw; /* set: gets the reply as it is (operator calls), not <done> */
    void *raw_ctx;
    int argc; /* OP_RAW, probe */
    size_t arglen[8];
    size_t key_len;
    char key[];
};

/* The result of the probe script's reply <r> (store.h's store_probe()):
 * 0 with STORE_OK and the step's answer in <res>, -ENOENT when the key is
 * gone, or -EPROTO. */
int store_redis_parse_probe(const redisReply *r, struct store_result *res);

#define OP_ARGS_MAX 13 /* the most arguments an op's command has (an acquire's) */

/* The command <op> sends: PING, an operator's command as given, or its
 * script (EVALSHA, or EVAL after NOSCRIPT) on its key, into <argv> and
 * <lens> (OP_ARGS_MAX at least; <ttl> and <keep>, 24 bytes each, hold
 * numbers as text). Returns the count. */
int store_redis_op_args(const struct op *op, const char **argv, size_t *lens, char *ttl,
                        char *keep);

#define SLOT_NONE UINT16_MAX /* no master known for the slot */

static inline struct node *node_at(struct store_redis *st, unsigned i)
{
    return i < atomic_load_explicit(&st->nnodes, memory_order_acquire) ? st->nodes[i] : NULL;
}

static inline bool is_cluster(struct store_redis *st)
{
    return atomic_load_explicit(&st->mode, memory_order_relaxed) == MODE_CLUSTER;
}

/* ---- store_redis_topology.c: the nodes, and where an op goes ---- */

/* The nodes the URL names: the server, the seeds, or (Sentinel) node 0
 * with no address until the sentinels name the master. Returns 0 or -ENOMEM. */
int store_redis_add_url_nodes(struct store_redis *st);

/* Looks the host of node <index> up (blocking: never on a loop thread) and
 * keeps an address for the loops' connects, IPv4 first (a non-blocking
 * connect takes one address only; Redis listens on IPv4 more often than
 * not, and "localhost" may list ::1 first). A failed lookup keeps the last
 * address, and says why when there is none. */
void store_redis_resolve_node(struct store_redis *st, unsigned index);

/* Marks <n> up (its last connection was set up and answers) or down. */
void store_redis_node_set_up(struct node *n, bool up);

/* What the log calls node <n>: the store's name unless it is a cluster's node. */
void store_redis_node_log_name(struct store_redis *st, const struct node *n, char *out, size_t len);

/* The node <op> goes to now: the one an ASK named, the one it was given,
 * or its slot's master (node 0 until a cluster is known; any node that
 * answers while the slot has no known master: it redirects). */
unsigned store_redis_op_route(struct store_redis *st, const struct op *op);

/* MOVED or ASK: <op> goes where Redis says. MOVED also teaches the map and
 * asks for a fresh one; ASK holds for this op's next send only. Returns
 * false when <reply> is no usable redirection (the op fails with it). */
bool store_redis_follow_redirect(struct link *k, struct op *op, const redisReply *reply);

/* Asks a node for the slot map (CLUSTER SLOTS), unless one was asked for
 * less than REFRESH_MIN_MS ago or is under way. Any thread. */
void store_redis_cluster_refresh(struct store_redis *st);

/* The sentinels named the master <host>:<port> (on the first loop's thread),
 * in an answer fresh for the tickets up to <fresh>. A new one takes effect
 * at once: every connection to the old one goes the next time it is used,
 * and every lane looks at once. An IP address needs no lookup; a name is
 * looked up by the next PING job. (redis_sentinel.h's master callback.) */
void store_redis_on_master(void *ctx, const char *host, unsigned port, uint64_t fresh);

/* Whether the sentinels answered a question sent after ticket <t>. */
bool store_redis_sentinel_answered(struct store_redis *st, uint64_t t);

/* A link's connection is set up (redis_conn.h's ready handler): the
 * PUBLISH probe, and ROLE with Sentinel, decide whether ops may go on it
 * (store_redis_link_confirmed(), or store_redis_link_drop()); INFO
 * persistence and appendfsync say whether the node is durable. */
void store_redis_link_on_ready(void *ctx);

/* store.h's is_ready: every master (as far as known) answers. */
bool store_redis_is_ready(struct store *base);

/* True while every master (as far as known) said it keeps its writes. */
bool store_redis_is_durable(struct store_redis *st);

/* ---- store_redis_link.c: the connections and the ops in flight ---- */

/* The lanes of <st>, one per loop of <loops> (not started yet), each with
 * its timer registered. Returns 0 or -ENOMEM. */
int store_redis_lanes_start(struct store_redis *st, struct loop *const *loops, unsigned nloops);

/* Refuses new ops, then runs each lane until every op it accepted has
 * called back and closes its connections: on its loop's thread, or on this
 * one once that loop has stopped. */
void store_redis_lanes_stop(struct store_redis *st);

/* Frees the lanes, once stopped; <wakes_posted>: wakes may still be queued
 * on the loops (Sentinel), which are let run out first. */
void store_redis_lanes_free(struct store_redis *st, bool wakes_posted);

/* Has <ln>'s loop run the lane (any thread): links waiting for the
 * sentinels' answer go on. */
void store_redis_lane_wake(struct lane *ln);

/* A new op of <script> on <key> under <tok>, calling <done>(<ctx>) once
 * submitted. Returns 0 with it in <ret>, or -ENOMEM. */
int store_redis_op_new(struct store_redis *st, enum lua_script_id script, struct span key,
                       const struct store_token *tok, store_done_fn *done, void *ctx,
                       struct op **ret);

/* Frees an op that was never submitted (or that called back). */
void store_redis_op_free(struct op *op);

/* <op> goes out again on <ln> (a redirection, a retry). */
void store_redis_lane_resend(struct lane *ln, struct op *op);

/* The connection is set up, and (Sentinel) it is the master: what waits goes out. */
void store_redis_link_confirmed(struct link *k);

/* The store's last_failure op: "redis <node>: <the failure logged>", or "". */
void store_redis_last_failure(struct store *base, char *buf, size_t len);

/* Gives the connection up (not from inside its own I/O: from a reply
 * callback, or the loop); what it holds fails with -ECONNRESET. With
 * <backoff> it failed (with Sentinel: ask where the master is now), without
 * it the master moved (the sentinels' answer that moved it is fresh). */
void store_redis_link_drop(struct link *k, int err, const char *why, bool backoff);

/* Sends what waits, connects, or fails it fast inside the backoff. */
void store_redis_link_dispatch(struct link *k, uint64_t now);

/* ---- store_redis.c ---- */

/* PINGs node <index> (readiness), from the calling loop. */
void store_redis_ping(struct store_redis *st, unsigned index);

/* The store behind <st>. */
struct store_redis *store_redis_of(struct store *st);

/* Hands <op> to a connection (the calling loop's own, or the first loop's
 * from any other thread); never calls back inside. Returns 0, or
 * -ECANCELED (stopping: <op> is freed and nothing calls back). */
int store_redis_op_submit(struct op *op);

/* Sends <argv> (OP_RAW), or the inspect script with <argv>[0] the store key
 * and <argv>[1] "1" or "0" (with the body or not), to the node <to> (an
 * index), or with NODE_BY_SLOT to the master of the slot of the key
 * (<argv>[0] for the script, <argv>[1] for a command), from the calling
 * loop (the first loop, from any other thread); <fn> gets the reply as it
 * is, on that loop's thread. Returns 0 or a negative errno (nothing calls
 * back then). */
int store_redis_raw(struct store_redis *st, enum lua_script_id script, int to, int argc,
                    const char **argv, const size_t *lens, redis_reply_fn *fn, void *ctx);

/* Fills <o> with where and how to connect to node <index> now, and its
 * address's generation in <gen>. Returns 0, or -ENXIO with why in <why>
 * when there is nowhere yet (a name that does not resolve, no master named
 * by the sentinels yet). */
int store_redis_target(struct store_redis *st, unsigned index, struct redis_conn_opts *o,
                       char *tls_name, size_t tls_name_len, unsigned *gen, char *why,
                       size_t why_len);

/* The masters that serve slots (cluster), or node 0: their indexes in
 * <ret> (room for NODE_MAX). Returns how many. */
unsigned store_redis_masters(struct store_redis *st, unsigned *ret);

/* store.h's inspect, find_resource, purge and list_unknown, for the Redis store. */
int store_redis_inspect(struct store *base, struct span prefix, struct span key, bool with_body,
                        store_list_fn *done, void *ctx);
int store_redis_find_resource(struct store *base, struct span prefix, struct span resource,
                              bool with_body, store_list_fn *done, void *ctx);
int store_redis_purge(struct store *base, struct span store_key, size_t prefix_len,
                      store_done_fn *done, void *ctx);
int store_redis_list_unknown(struct store *base, struct span prefix, const char *cursor,
                             store_list_fn *done, void *ctx);

/* store.h's set_notify, and the end of its subscriber (NULL-safe). */
int store_redis_set_notify(struct store *base, store_notify_fn *fn, void *ctx);
void store_redis_notify_stop(struct subscriber *sub);

#endif
