/* SPDX-License-Identifier: MIT */
/* The Redis store: one hash per idempotency key, each state change one Lua
 * script (lua/<op>.lua, embedded at build time) run with EVALSHA, reloaded on
 * NOSCRIPT. The state changes are pipelined on one asynchronous hiredis
 * connection run by a thread of the store's own; operator calls and the
 * readiness PING use one blocking connection per worker thread. All are
 * reconnected with backoff. */
#ifndef IDEMPROXY_STORE_REDIS_H
#define IDEMPROXY_STORE_REDIS_H

#include "idemproxy/store.h"

struct worker_pool;

struct store_redis_url {
    char host[256];
    unsigned port;  /* default 6379 */
    char *password; /* owned, NULL: none */
    unsigned db;    /* default 0 */
};

/* Parses redis://[:password@]host[:port][/db] (also redis://user:password@…,
 * the user ignored). Returns 0 or -EINVAL. On success the caller frees
 * ret->password. */
int store_redis_parse_url(const char *url, struct store_redis_url *ret);

/* Creates a Redis store on <url>: acquire, complete, release and extend run
 * on a thread of its own, on one pipelined connection; inspect, purge and the
 * readiness PING on <pool> (borrowed: it must outlive the store) with one
 * connection per pool thread. Each call is bounded by <timeout_ms>. Does not
 * need Redis to be up: connections are made on first use and retried with
 * backoff. Returns 0 with the store in <ret>, -EINVAL for a bad URL, -ENOMEM
 * or -EAGAIN. */
int store_redis_new(const char *url, struct worker_pool *pool, uint64_t timeout_ms,
                    struct store **ret);

#endif
