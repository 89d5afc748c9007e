/* SPDX-License-Identifier: MIT */
/* The memory store: the state machine, TTLs and fencing of the Redis store,
 * in process. Records live in a hash table split into shards, each with its
 * own lock, so requests on different keys rarely wait for each other. A
 * budget bounds the bytes held; expired records are reclaimed in the
 * background, and when the budget is reached the oldest completed records are
 * evicted. Everything is forgotten when the process exits. */
#ifndef IDEMPROXY_STORE_MEMORY_H
#define IDEMPROXY_STORE_MEMORY_H

#include "idemproxy/store.h"

struct worker_pool;

/* The bytes one lock of a key of <key_len> bytes costs in the budget; a
 * lock with a trace context (store_lock.trace) costs STORE_TRACE_LEN more. */
size_t store_memory_entry_bytes(size_t key_len);

struct store_memory_stats {
    size_t bytes;       /* counted against the budget: keys, locks, records */
    size_t lock_bytes;  /* of which held by locks (at most half the budget) */
    size_t max_bytes;   /* the budget */
    size_t entries;     /* keys held: locks and completed records */
    size_t locks;       /* of which locked (in flight) */
    uint64_t evictions; /* completed records evicted to make room, since start */
    uint64_t expired;   /* expired entries reclaimed, since start */
};

/* Creates a memory store holding at most <max_bytes> (keys, headers and
 * bodies, with allocation overhead), and reclaiming expired entries every
 * <reap_interval_ms> on <pool> (borrowed: it must outlive the store), where
 * inspect() runs too. Acquire, complete, release, extend and purge run on
 * the caller's thread and call back before they return. Returns 0 with the store in <ret>,
 * -EINVAL, -ENOMEM or -EIO (no random seed).
 *
 * Locks may hold at most half the budget, so that the answers of running
 * requests always find room (completed records are evicted for them).
 * Besides the errors of store.h, acquire() reports -ENOSPC when locks hold
 * half the budget (or nothing is left to evict), complete() -ENOSPC while
 * other stores in progress hold the room, and -E2BIG for a record larger
 * than half the budget. */
int store_memory_new(size_t max_bytes, uint64_t reap_interval_ms, struct worker_pool *pool,
                     struct store **ret);

/* True when <st> is a memory store. */
bool store_is_memory(const struct store *st);

/* Fills <ret> with the current figures of the memory store <st>. Any thread. */
void store_memory_stats(struct store *st, struct store_memory_stats *ret);

#endif
