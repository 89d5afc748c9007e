/* SPDX-License-Identifier: MIT */
/* The PostgreSQL store (doc/stores.md, PostgreSQL): one table, one row per idempotency key,
 * each operation one prepared statement (sql/<op>.sql, embedded at build
 * time) and one round trip. The statements are pipelined (libpq's pipeline
 * mode) on one connection of the proxy's own per event loop, driven by that
 * loop; the operator calls, the readiness ping, the job that deletes
 * expired rows and the --wait listener (LISTEN idemproxy_done) go on a
 * connection of their own on the first loop. All are made again with
 * backoff; a multi-host URL with target_session_attrs=read-write finds the
 * new primary after a failover. */
#ifndef IDEMPROXY_STORE_PG_H
#define IDEMPROXY_STORE_PG_H

#include "idemproxy/store.h"

struct loop;
struct worker_pool;

/* What a PostgreSQL store is made of (doc/stores.md, PostgreSQL). */
struct store_pg_opts {
    const char *url;           /* postgresql:// or postgres:// (pg_url.h) */
    const char *password;      /* --store-password-file's: beats the URL's; NULL: none */
    uint64_t timeout_ms;       /* --store-timeout */
    uint64_t reap_interval_ms; /* the expired-row job runs this often; 0: 1 s */
};

/* Creates a PostgreSQL store on <o>->url, whose operations run on <loops>
 * (borrowed: created, not started yet, as each gets a timer of the
 * store's) as store_redis_new()'s do: called on one of those loops'
 * threads, on that loop's connection; from any other thread, on the first
 * loop's; called back on that loop's thread, never inside the call, each
 * bounded by <timeout_ms>. The readiness ping and the expired-row job run
 * every second from <pool> (borrowed: it must outlive the store).
 *
 * At start it connects once, on this thread, to create the table when it is
 * missing (logged) and to say at once what is wrong: a role that may not
 * create it is -EACCES with one line naming contrib/postgresql/schema.sql
 * in <why>. A server that does not answer yet is no error (warned: requests
 * get 503 until it does). Returns 0 with the store in <ret>, or -EINVAL
 * with why in <why> (a bad URL, no loops), -EACCES, -ENOMEM. The loops must
 * outlive the store; store_free() finishes each connection on its loop's
 * thread, or on the calling thread once that loop has stopped. */
int store_pg_new(const struct store_pg_opts *o, struct worker_pool *pool, struct loop *const *loops,
                 unsigned nloops, struct store **ret, char *why, size_t why_len);

#endif
