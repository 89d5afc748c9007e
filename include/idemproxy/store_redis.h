/* SPDX-License-Identifier: MIT */
/* The Redis store: one hash per idempotency key, each state change one Lua
 * script (lua/<op>.lua, embedded at build time) run with EVALSHA, reloaded on
 * NOSCRIPT. The state changes are pipelined on one connection of the proxy's
 * own per event loop and Redis server (redis_conn.h), driven by that loop;
 * the operator calls and the readiness PING go on the first loop's. All are
 * reconnected with backoff. One server, the master its sentinels name, or a
 * Redis Cluster (found by itself: each key goes to its slot's master). */
#ifndef IDEMPROXY_STORE_REDIS_H
#define IDEMPROXY_STORE_REDIS_H

#include "idemproxy/redis_conn.h"
#include "idemproxy/store.h"

struct loop;
struct worker_pool;

/* What a Redis store is made of: its URL and the options of doc/stores.md
 * (Pointing idemproxy at Redis). */
struct store_redis_opts {
    const char *url;             /* redis_url.h */
    const char *password;        /* --redis-password-file's: beats the URL's; NULL: none */
    struct redis_tls_opts tls;   /* for rediss:// */
    const char *tls_server_name; /* the name checked and sent as SNI; NULL: the URL's host */
    uint64_t timeout_ms;         /* --store-timeout */
    unsigned wait_replicas;      /* --redis-wait-replicas: WAIT after each write; 0: none */
    uint64_t wait_timeout_ms;    /* --redis-wait-timeout: below <timeout_ms> */
};

/* Creates a Redis store on <o>->url: acquire, complete, release and extend run
 * on one pipelined connection per loop of <loops> (borrowed: created, not
 * started yet, as each gets a timer of the store's): called on one of those
 * loops' threads, on that loop's; from any other thread, on the first
 * loop's. They call back on that loop thread, never inside the call. The
 * readiness PING (every second, from <pool>, which also looks the host name
 * up again) and inspect and purge (started on <pool>, borrowed: it must
 * outlive the store) run on the first loop's connection and call back on its
 * thread. Each call is bounded by <timeout_ms>. Does not need Redis to be up:
 * connections are made on first use and retried with backoff. Returns 0 with
 * the store in <ret>, or -EINVAL with why in <why> (a bad URL, TLS files
 * that cannot be used, no loops), -ENOMEM or -EAGAIN.
 *
 * The loops must outlive the store. store_free() finishes each connection on
 * its loop's thread, or on the calling thread once that loop has stopped, and
 * takes its timers off the loop. Ops called while a loop is stopped and the
 * store not freed yet are refused with -ECANCELED. */
int store_redis_new(const struct store_redis_opts *o, struct worker_pool *pool,
                    struct loop *const *loops, unsigned nloops, struct store **ret, char *why,
                    size_t why_len);

#endif
