/* SPDX-License-Identifier: MIT */
/* The Redis store: one hash per idempotency key, each state change one Lua
 * script (lua/<op>.lua, embedded at build time) run with EVALSHA, reloaded on
 * NOSCRIPT. One blocking hiredis connection per worker thread, reconnected
 * with backoff. */
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

/* Creates a Redis store on <url>, running its calls on <pool> (borrowed: it
 * must outlive the store) with one connection per pool thread; each call is
 * bounded by <timeout_ms>. Does not need Redis to be up: connections are made
 * on first use and retried with backoff. Returns 0 with the store in <ret>,
 * -EINVAL for a bad URL, or -ENOMEM. */
int store_redis_new(const char *url, struct worker_pool *pool, uint64_t timeout_ms,
                    struct store **ret);

#endif
