/* SPDX-License-Identifier: MIT */
/* The Redis store: one hash per idempotency key, each state change one Lua
 * script (lua/<op>.lua, embedded at build time) run with EVALSHA, reloaded on
 * NOSCRIPT. The state changes are pipelined on one asynchronous hiredis
 * connection per event loop, driven by that loop; operator calls and the
 * readiness PING use one blocking connection per worker thread. All are
 * reconnected with backoff. */
#ifndef IDEMPROXY_STORE_REDIS_H
#define IDEMPROXY_STORE_REDIS_H

#include "idemproxy/store.h"

struct loop;
struct worker_pool;

/* Creates a Redis store on <url>: acquire, complete, release and extend run
 * on one pipelined connection per loop of <loops> (borrowed: created, not
 * started yet, as each gets a timer of the store's for good): called on one
 * of those loops' threads, on that loop's; from any other thread, on the
 * first loop's. They call back on that loop thread, never inside the call.
 * Inspect, purge and the readiness PING run on <pool> (borrowed: it must
 * outlive the store) with one connection per pool thread. Each call is
 * bounded by <timeout_ms>. Does not need Redis to be up: connections are made
 * on first use and retried with backoff. Returns 0 with the store in <ret>,
 * -EINVAL for a bad URL (redis_url.h) or no loops, -ENOTSUP for a form not
 * served yet, -ENOMEM, -EAGAIN or -ENOSPC (a loop has
 * no timer left).
 *
 * The loops must outlive the store. store_free() finishes each connection on
 * its loop's thread, or on the calling thread once that loop has stopped, and
 * takes its timer off the loop. Ops called while a loop is stopped and the
 * store not freed yet are refused with -ECANCELED. Even on failure, the loops
 * may hold a timer of the store's: free them unstarted then. */
int store_redis_new(const char *url, struct worker_pool *pool, uint64_t timeout_ms,
                    struct loop *const *loops, unsigned nloops, struct store **ret);

#endif
