/* SPDX-License-Identifier: MIT */
/* What the Redis store's files share (store_redis.c: connections, ops,
 * scripts, readiness, the master; store_redis_admin.c: inspect and purge;
 * store_redis_notify.c: the --wait subscriber). Not an interface: the rest
 * of the program sees store.h and store_redis.h only. */
#ifndef IDEMPROXY_STORE_REDIS_IMPL_H
#define IDEMPROXY_STORE_REDIS_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "idemproxy/buf.h"
#include "idemproxy/list.h"
#include "idemproxy/loop.h"
#include "idemproxy/redis_conn.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/store.h"
#include "idemproxy/store_impl.h"
#include "lua_scripts.h"

#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 1000
#define OP_PING _LUA_MAX                /* an op that is no script: the readiness PING */
#define OP_RAW (_LUA_MAX + 1)           /* a command given whole (operator calls) */
#define NOTIFY_CHANNEL "idemproxy:done" /* complete.lua and release.lua publish the key */
#define HEAD_MAX_BYTES (64u << 20)      /* far above what RECORD_MAX_HEADERS headers can need */

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
    unsigned generation;     /* of the target <conn> went to */
    uint64_t backoff_ms;
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
    bool ready;              /* <conn> is set up (and, with Sentinel, confirmed the master) */
    unsigned generation;     /* of the target <conn> went to */
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
    struct redis_tls *tls;    /* owned; NULL: plain TCP */
    char tls_name[256];       /* the name checked in the certificate, and sent as SNI */
    uint64_t timeout_ms;

    /* Where the connections go: the URL's host, or the master the
     * sentinels named. Its address is what the loops connect to, so that
     * no loop thread ever waits on a name lookup: looked up when the store
     * is made and again with every readiness PING, on a pool thread (an IP
     * address the sentinels give is taken at once). */
    pthread_mutex_t addr_mu;
    char target_host[REDIS_URL_HOST_MAX]; /* "": no master known yet (Sentinel) */
    unsigned target_port;
    struct sockaddr_storage addr;
    socklen_t addrlen;               /* 0 while the name has not resolved */
    char resolve_why[400];           /* why it did not, for the log */
    atomic_uint generation;          /* changes with the target: connections to the old one go */
    atomic_ullong failovers;         /* the sentinels named another master */
    struct redis_sentinel *sentinel; /* owned: redis-sentinel:// only */
    char name[300];                  /* host:port, for the log */
    pthread_mutex_t log_mu;
    char logged_why[400]; /* the last failure logged, "" once connected again */

    struct link *links; /* owned array, one per loop */
    unsigned nlinks;
    atomic_bool stopping; /* refuse ops called on a loop thread */
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
    struct buf head;              /* complete: the encoded head; OP_RAW: the arguments */
    redis_reply_fn *raw;          /* set: gets the reply as it is (operator calls), not <done> */
    void *raw_ctx;
    int argc; /* OP_RAW */
    size_t arglen[8];
    size_t key_len;
    char key[];
};

/* The store behind <st>. */
struct store_redis *store_redis_of(struct store *st);

/* Hands <op> to a connection (the calling loop's own, or the first loop's
 * from any other thread); never calls back inside. Returns 0, or
 * -ECANCELED (stopping: <op> is freed and nothing calls back). */
int store_redis_op_submit(struct op *op);

/* Sends <argv> (OP_RAW), or the inspect script with <argv>[0] the store key
 * and <argv>[1] "1" or "0" (with the body or not), on the first loop's
 * connection; <fn> gets the reply as it is, on that loop's thread. Returns 0
 * or a negative errno (nothing calls back then). */
int store_redis_raw(struct store_redis *st, enum lua_script_id script, int argc, const char **argv,
                    const size_t *lens, redis_reply_fn *fn, void *ctx);

/* Fills <o> with where and how to connect now (the URL's host, or the
 * master the sentinels named), and the target's generation in <gen>.
 * Returns 0, or -ENXIO with why in <why> when there is nowhere yet. */
int store_redis_target(struct store_redis *st, struct redis_conn_opts *o, char *tls_name,
                       size_t tls_name_len, unsigned *gen, char *why, size_t why_len);

/* store.h's inspect and purge, for the Redis store. */
int store_redis_inspect(struct store *base, struct span prefix, struct span key, bool with_body,
                        store_list_fn *done, void *ctx);
int store_redis_purge(struct store *base, struct span store_key, store_done_fn *done, void *ctx);

/* store.h's set_notify, and the end of its subscriber (NULL-safe). */
int store_redis_set_notify(struct store *base, store_notify_fn *fn, void *ctx);
void store_redis_notify_stop(struct subscriber *sub);

#endif
