/* SPDX-License-Identifier: MIT */
/* Held locks (README.md, What it does with each request; doc/guarantees.md,
 * Guarantees and failure behaviour): while a request holds its key's lock, one
 * periodic heartbeat job extends it before it can lapse; before forwarding, a
 * holder that stalled confirms it; at the end the lock is completed with the
 * answer or released, and that call is retried with backoff (it carries the
 * token, so a retry is safe) while the heartbeat keeps the lock alive. A lease
 * found taken by another request is counted and logged as lock_lost, once.
 * Callbacks run on a store or worker thread, or inside the call (the memory
 * store). */
#ifndef IDEMPROXY_LEASE_H
#define IDEMPROXY_LEASE_H

#include "idemproxy/common.h"
#include "idemproxy/store.h"

struct lease;
struct leases;
struct record;
struct worker_pool;

/* Runs exactly once per lease_confirm(): <err> is 0 (the lock is ours for
 * another lock TTL), -ESTALE (another request holds it: counted as
 * lock_lost), or another negative errno (the store failed: counted). On an
 * error the heartbeat has ended; the holder still drops its reference. */
typedef void lease_confirm_fn(void *ctx, int err);

/* Runs exactly once per lease_finish(), when its first attempt reported
 * back (later attempts, if the store failed, go on without the holder). */
typedef void lease_finish_fn(void *ctx);

/* Creates the set of leases of locks on <st>, with its heartbeat on <pool>
 * (both borrowed: they must outlive it). <lock_ttl_ms> is the shortest lock
 * TTL its leases will use (the heartbeat looks often enough for it), and
 * the TTL of a lease started without one. A lease is extended when a third
 * of its TTL has passed since its last extend. Returns 0 with it in <ret>,
 * or -ENOMEM. */
int leases_new(struct store *st, struct worker_pool *pool, uint64_t lock_ttl_ms,
               struct leases **ret);

/* Stops the heartbeat and any retry from touching the store (waits for a
 * heartbeat in progress); call before the pool and the store go. */
void leases_stop(struct leases *ls);

/* Frees <ls>, after leases_stop() and once the pool has run its jobs. NULL-safe. */
void leases_free(struct leases *ls);

/* Starts the lease of the lock of <key> (copied) under <tok> (copied), asked
 * for at <acquired_at_ms> for <lock_ttl_ms> (0: the set's): its heartbeat
 * starts. Returns it, holding the caller's reference, or NULL on OOM (the
 * lock then expires by itself). */
struct lease *lease_start(struct leases *ls, const char *key, const struct store_token *tok,
                          uint64_t acquired_at_ms, uint64_t lock_ttl_ms);

/* Until when the lock cannot have lapsed (monotonic milliseconds). */
uint64_t lease_valid_until_ms(const struct lease *l);

/* Extends the lock now, to confirm it is still held; <done> runs exactly
 * once, possibly inside this call. */
void lease_confirm(struct lease *l, lease_confirm_fn *done, void *ctx);

/* Completes the lock with <rec> (a reference the lease takes over; a record
 * the store can never hold becomes the too-large marker) kept <ttl_ms>, with
 * the resource link <link> (copied; NULL: none), or releases it when <rec>
 * is NULL; takes over the caller's reference. <done> runs exactly once,
 * after the first attempt, possibly inside this call. */
void lease_finish(struct lease *l, struct record *rec, uint64_t ttl_ms,
                  const struct store_link *link, lease_finish_fn *done, void *ctx);

/* Marks the key unknown for <cause> (doc/guarantees.md, Unknown outcomes), saying <about> (copied),
 * kept <keep_ms>: the holder cannot tell whether its request ran upstream.
 * Retried like lease_finish(); <done> runs once, after the first attempt. */
void lease_finish_unknown(struct lease *l, enum store_cause cause, const struct store_about *about,
                          uint64_t keep_ms, lease_finish_fn *done, void *ctx);

/* The holder gives up its lease without finishing it (its request is gone,
 * or it failed to confirm): the heartbeat ends, and the lock expires within
 * its TTL. Drops the caller's reference. NULL-safe. */
void lease_abandon(struct lease *l);

#endif
