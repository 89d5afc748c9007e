/* SPDX-License-Identifier: MIT */
/* What the memory store's files share: store_memory.c (the shards, the
 * budget, the operations) and store_memory_admin.c (inspect, list, resolve).
 * Not an interface: the rest of the program sees store.h and
 * store_memory.h. */
#ifndef IDEMPROXY_STORE_MEMORY_IMPL_H
#define IDEMPROXY_STORE_MEMORY_IMPL_H

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>

#include "idemproxy/list.h"
#include "idemproxy/store_memory.h"
#include "store_impl.h"

#define NSHARDS 64 /* a power of two; the shard is the hash's top bits */
#define SHARD_BITS 6
#define FIRST_BUCKETS 64
#define NO_COMPLETED UINT64_MAX
#define SWEEP_WHEN_FULL_EVERY_MS 100
#define RES_FIRST_BUCKETS 64

/* MSTATE_TOMB: a completed entry whose answer expired, kept as its
 * tombstone (doc/configuration.md, Tombstones): key, fingerprint, no answer. */
enum mstate { MSTATE_LOCKED, MSTATE_COMPLETED, MSTATE_UNKNOWN, MSTATE_TOMB };

/* One idempotency key: a lock, a completed record, an unknown one (kept
 * like a lock: never evicted), or a tombstone. Owned by its shard. */
struct mentry {
    struct mentry *next; /* hash chain */
    /* completed: in the shard's completion order; a tombstone: in its tombs */
    struct list_node completed;
    uint64_t hash;
    uint64_t expires_ms;     /* now_ms() clock; expired when now >= expires_ms */
    uint64_t completed_seq;  /* completed, tombstone: the store-wide order they became so */
    uint64_t changed_ms;     /* when it was locked, completed or made unknown (store_inspect) */
    uint64_t lease_until_ms; /* locked: its lease runs out then */
    uint64_t keep_ms;        /* locked: kept this long beyond its lease */
    uint64_t tomb_ms;        /* completed: its tombstone is kept this long after it expires */
    size_t bytes;            /* counted in the budget for this entry */
    struct record *rec;      /* completed only: one reference */
    char *about;             /* unknown only: owned "<route> <method> <target>", or NULL */
    char *resource;          /* completed: owned, the resource its answer created, or NULL */
    struct mentry *res_next; /* with <resource>: its chain in the store's resource index */
    enum mstate state;
    enum store_cause cause; /* unknown only */
    /* unknown only, its probes (doc/configuration.md, Reconcile): how many
     * were claimed, none other before <probe_next_ms>, the first absent of
     * the last run's claim time (0: the last result was not absent) */
    unsigned probes;
    enum store_probe_result last_result;
    uint64_t probe_next_ms, absent_ms;
    struct store_token tok;
    uint8_t fp[FINGERPRINT_LEN];
    /* The trace context of the request that locked it (store_lock.trace),
     * <trace_len> bytes (0: none) in <key> after the key, where <trace_room>
     * bytes are kept for one (counted in <bytes>: an entry without one
     * costs nothing for it). */
    uint8_t trace_len, trace_room;
    size_t key_len;
    char key[]; /* the key, then the trace context's room */
};

struct shard {
    alignas(64) pthread_mutex_t mu; /* guards everything below but <oldest_seq> */
    struct mentry **buckets;        /* owned array of nbuckets chains */
    size_t nbuckets, count, locks;
    struct list completed;        /* completed entries, oldest first */
    _Atomic uint64_t oldest_seq;  /* completed_seq of the oldest, NO_COMPLETED: none */
    struct list tombs;            /* tombstones, oldest first */
    _Atomic uint64_t oldest_tomb; /* completed_seq of the oldest tombstone, NO_COMPLETED: none */
};

struct store_memory;

struct store_memory {
    struct store base;
    struct worker_pool *pool; /* borrowed */
    size_t max_bytes;
    uint64_t seed[2];         /* the hash key: keys come from clients */
    atomic_size_t used;       /* bytes counted against max_bytes, reservations included */
    atomic_size_t lock_bytes; /* of which held by locks: at most max_bytes / 2 */
    atomic_uint_fast64_t evictions, expired;
    _Atomic uint64_t last_sweep_ms;
    _Atomic uint64_t seq;     /* numbers completions: milliseconds would tie */
    pthread_mutex_t evict_mu; /* one evicting thread at a time; taken before a shard lock */
    struct store_calls calls;
    store_notify_fn *notify; /* set before any operation, then read-only */
    void *notify_ctx;
    struct worker_every *reaper; /* owned: sweeps expired entries every reap_interval_ms */
    /* The resource index (doc/configuration.md, Resource links): completed
     * entries with a resource, by its hash. Taken under a shard lock, never
     * the other way round. */
    pthread_mutex_t res_mu;
    struct mentry **res_buckets; /* owned array of res_nbuckets chains (res_next) */
    size_t res_nbuckets, res_count;
    struct shard shards[NSHARDS];
};

enum mop_kind { MOP_ACQUIRE, MOP_COMPLETE, MOP_RELEASE, MOP_EXTEND, MOP_PURGE, MOP_UNKNOWN };

/* One operation, on the caller's stack for the length of the call. */
struct mop {
    struct store_memory *st;
    enum mop_kind kind;
    store_done_fn *done;
    void *ctx;
    struct store_token tok;
    uint8_t fp[FINGERPRINT_LEN];      /* acquire */
    uint64_t ttl_ms;                  /* acquire (the lease), complete, extend, unknown (keep) */
    uint64_t keep_ms;                 /* acquire */
    bool take_over;                   /* acquire */
    enum store_cause cause;           /* unknown */
    const struct store_about *about;  /* acquire, unknown: borrowed */
    char about_text[STORE_ABOUT_MAX]; /* acquire: an unknown key's words, for the callback */
    struct record *rec;               /* complete: own reference, handed to the entry */
    const struct store_link *link;    /* complete: borrowed, NULL: none */
    bool tombstones;                  /* acquire: a tombstone is an answer */
    struct span trace;                /* acquire: borrowed, STORE_TRACE_LEN bytes or empty */
    char trace_text[STORE_TRACE_LEN]; /* acquire: the key's trace context, for the callback */
    size_t key_len;
    const char *key; /* borrowed from the caller */
};

/* The store behind <base>. */
static inline struct store_memory *store_memory_of(struct store *base)
{
    return (struct store_memory *)base;
}

/* The hash of a store key (SipHash-2-4 under the store's random key). */
uint64_t store_memory_hash(const struct store_memory *st, const char *key, size_t len);

/* The shard of <hash>. */
struct shard *store_memory_shard_of(struct store_memory *st, uint64_t hash);

/* The slot of the live (not expired at <now>) entry of <key> in <sh> (its
 * lock held), whose *slot is NULL when there is none; an expired one found
 * on the way is removed. */
struct mentry **store_memory_lookup_live(struct store_memory *st, struct shard *sh, uint64_t hash,
                                         struct span key, uint64_t now);

/* Reserves <n> bytes of the budget (evicting completed records for them;
 * no shard lock held). Returns 0, -ENOSPC or -E2BIG. */
int store_memory_budget_reserve(struct store_memory *st, size_t n);

/* Gives <n> reserved bytes back. */
void store_memory_budget_give_back(struct store_memory *st, size_t n);

/* Puts completed <e> last in <sh>'s completion order (its lock held). */
void store_memory_link_completed(struct shard *sh, struct mentry *e);

/* Unlinks the entry at <pp> of <sh> (its lock held) and frees it; returns
 * the bytes it held, for the caller to give back to the budget. */
size_t store_memory_shard_remove(struct store_memory *st, struct shard *sh, struct mentry **pp);

/* Takes completed <e> out of <sh>'s completion order (its lock held). */
void store_memory_unlink_completed(struct shard *sh, struct mentry *e);

/* Adds <e> (completed, with a resource) to the resource index, or removes
 * it (store_memory_keep.c). */
void store_memory_res_add(struct store_memory *st, struct mentry *e);
void store_memory_res_remove(struct store_memory *st, struct mentry *e);

/* Makes the completed <e> of <sh> (its lock held), whose answer expired, its
 * tombstone, kept e->tomb_ms more (doc/configuration.md, Tombstones).
 * Returns the bytes it no longer holds, for the caller to give back. */
size_t store_memory_tomb_make(struct store_memory *st, struct shard *sh, struct mentry *e);

/* Takes the tombstone <e> out of <sh>'s tombs (its lock held). */
void store_memory_tomb_unlink(struct shard *sh, struct mentry *e);

/* The tombstone of <sh> made first (its lock held), or NULL. */
struct mentry *store_memory_tomb_oldest(const struct shard *sh);

/* The store keys of the live entries whose answer created <resource>: a new
 * array of <ret_n> owned strings in <ret> (free each, then the array).
 * Returns 0 or -ENOMEM. */
int store_memory_resource_keys(struct store_memory *st, struct span resource, char ***ret,
                               size_t *ret_n);

/* store.h's find_resource, for the memory store (store_memory_admin.c). */
int store_memory_find_resource(struct store *base, struct span prefix, struct span resource,
                               bool with_body, store_list_fn *done, void *ctx);

/* store.h's inspect, list_unknown and resolve, for the memory store
 * (store_memory_admin.c). */
int store_memory_inspect(struct store *base, struct span prefix, struct span key, bool with_body,
                         store_list_fn *done, void *ctx);
int store_memory_list_unknown(struct store *base, struct span prefix, const char *cursor,
                              store_list_fn *done, void *ctx);
int store_memory_resolve(struct store *base, struct span store_key, struct record *rec,
                         uint64_t ttl_ms, store_done_fn *done, void *ctx);
int store_memory_probe(struct store *base, struct span store_key, const struct store_probe *p,
                       store_done_fn *done, void *ctx);

#endif
