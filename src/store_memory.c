/* SPDX-License-Identifier: MIT */
/* The memory store. An operation runs inside the call, on the caller's
 * thread: it takes one shard lock, does what the matching Lua script does on
 * Redis, lets the lock go, and calls back, still inside the call (a hand-off
 * to another thread would cost more than the work). Only inspect and the
 * reaper run on the worker pool. The budget is one atomic counter: space is reserved
 * before a shard lock is taken, and eviction (which takes one other shard
 * lock at a time, under evict_mu) runs only while no shard lock is held, so
 * locks never nest across shards.
 *
 * Locks may hold at most half the budget. The other half is what the answers
 * of running requests are stored in: completed records can always be evicted
 * to make room for one, so a complete never waits for a lock to expire, and
 * a store full of locks cannot deadlock. A record larger than half the
 * budget is refused (-E2BIG) for the same reason. */
#include "idemproxy/store_memory.h"

#include <assert.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "idemproxy/idemkey.h"
#include "idemproxy/list.h"
#include "idemproxy/record.h"
#include "idemproxy/rng.h"
#include "idemproxy/worker.h"
#include "store_impl.h"
#include "store_memory_impl.h"

/* ---- hashing: SipHash-2-4 with a random key, so clients cannot pick colliding keys ---- */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = ROTL(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = ROTL(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = ROTL(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = ROTL(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = ROTL(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = ROTL(v2, 32);                                                                         \
    } while (0)

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t siphash(const uint64_t k[2], const char *data, size_t len);

uint64_t store_memory_hash(const struct store_memory *st, const char *key, size_t len)
{
    return siphash(st->seed, key, len);
}

static uint64_t siphash(const uint64_t k[2], const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data;
    uint64_t v0 = k[0] ^ 0x736f6d6570736575ull, v1 = k[1] ^ 0x646f72616e646f6dull;
    uint64_t v2 = k[0] ^ 0x6c7967656e657261ull, v3 = k[1] ^ 0x7465646279746573ull;
    uint64_t b = (uint64_t)len << 56, m;
    size_t i;

    for (i = 0; i + 8 <= len; i += 8) {
        m = load_le64(p + i);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    for (size_t j = 0; i + j < len; j++)
        b |= (uint64_t)p[i + j] << (8 * j);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- the budget ---- */

size_t store_memory_entry_bytes(size_t key_len)
{
    return sizeof(struct mentry) + key_len + RECORD_MALLOC_OVERHEAD;
}

void store_memory_budget_give_back(struct store_memory *st, size_t n)
{
    if (n)
        atomic_fetch_sub_explicit(&st->used, n, memory_order_relaxed);
}

/* ---- one shard (its lock held by the caller) ---- */

struct shard *store_memory_shard_of(struct store_memory *st, uint64_t hash)
{
    return &st->shards[hash >> (64 - SHARD_BITS)];
}

static struct mentry **shard_slot(struct shard *sh, uint64_t hash, struct span key)
{
    struct mentry **pp = &sh->buckets[hash & (sh->nbuckets - 1)];

    for (; *pp; pp = &(*pp)->next) {
        struct mentry *e = *pp;

        if (e->hash == hash && e->key_len == key.len && memcmp(e->key, key.base, key.len) == 0)
            break;
    }
    return pp;
}

/* The completed entry of <sh> that completed first, or NULL. */
static struct mentry *shard_oldest(const struct shard *sh)
{
    struct list_node *n = list_first(&sh->completed);

    return n ? list_entry(n, struct mentry, completed) : NULL;
}

static void shard_update_oldest(struct shard *sh)
{
    struct mentry *e = shard_oldest(sh);

    atomic_store_explicit(&sh->oldest_seq, e ? e->completed_seq : NO_COMPLETED,
                          memory_order_relaxed);
}

void store_memory_link_completed(struct shard *sh, struct mentry *e)
{
    list_append(&sh->completed, &e->completed);
    shard_update_oldest(sh);
}

void store_memory_unlink_completed(struct shard *sh, struct mentry *e)
{
    list_remove(&e->completed);
    shard_update_oldest(sh);
}

/* ---- one shard (its lock held by the caller) ---- */

size_t store_memory_shard_remove(struct store_memory *st, struct shard *sh, struct mentry **pp)
{
    struct mentry *e = *pp;
    size_t bytes = e->bytes;

    *pp = e->next;
    sh->count--;
    if (e->state == MSTATE_COMPLETED) {
        store_memory_unlink_completed(sh, e);
    } else if (e->state == MSTATE_TOMB) {
        store_memory_tomb_unlink(sh, e);
    } else {
        sh->locks--;
        atomic_fetch_sub_explicit(&st->lock_bytes, bytes, memory_order_relaxed);
    }
    if (e->resource)
        store_memory_res_remove(st, e);
    record_unref(e->rec);
    free(e->about);
    free(e->resource);
    free(e);
    return bytes;
}

/* Doubles the table past one entry per bucket. Failing to grow only makes
 * chains longer. */
static void shard_maybe_grow(struct shard *sh)
{
    size_t n = sh->nbuckets * 2;
    struct mentry **nb;

    if (sh->count < sh->nbuckets)
        return;
    nb = calloc(n, sizeof(*nb));
    if (!nb)
        return;
    for (size_t i = 0; i < sh->nbuckets; i++) {
        struct mentry *e = sh->buckets[i], *next;

        for (; e; e = next) {
            next = e->next;
            e->next = nb[e->hash & (n - 1)];
            nb[e->hash & (n - 1)] = e;
        }
    }
    free(sh->buckets);
    sh->buckets = nb;
    sh->nbuckets = n;
}

/* Ends the expired entry at <pp> of <sh>: a completed one that keeps a
 * tombstone (not expired too) becomes it, anything else goes. Returns the
 * bytes freed; <ret_gone>: whether the entry went. */
static size_t shard_expire(struct store_memory *st, struct shard *sh, struct mentry **pp,
                           uint64_t now, bool *ret_gone)
{
    struct mentry *e = *pp;

    *ret_gone = !(e->state == MSTATE_COMPLETED && now < e->expires_ms + e->tomb_ms);
    return *ret_gone ? store_memory_shard_remove(st, sh, pp) : store_memory_tomb_make(st, sh, e);
}

/* Removes the expired entries of <sh>. Returns the bytes freed. */
static size_t shard_sweep(struct store_memory *st, struct shard *sh, uint64_t now,
                          uint64_t *ret_count)
{
    size_t freed = 0;

    for (size_t i = 0; i < sh->nbuckets; i++) {
        struct mentry **pp = &sh->buckets[i];

        while (*pp) {
            bool gone = false;

            if (now >= (*pp)->expires_ms) {
                freed += shard_expire(st, sh, pp, now, &gone);
                (*ret_count)++;
            }
            if (!gone)
                pp = &(*pp)->next;
        }
    }
    return freed;
}

/* ---- reclaiming and evicting (no shard lock held by the caller) ---- */

static void sweep_all(struct store_memory *st)
{
    uint64_t now = now_ms(), n = 0;

    atomic_store_explicit(&st->last_sweep_ms, now, memory_order_relaxed);
    for (size_t i = 0; i < NSHARDS; i++) {
        struct shard *sh = &st->shards[i];
        size_t freed;

        pthread_mutex_lock(&sh->mu);
        freed = shard_sweep(st, sh, now, &n);
        pthread_mutex_unlock(&sh->mu);
        store_memory_budget_give_back(st, freed);
    }
    if (n)
        atomic_fetch_add_explicit(&st->expired, n, memory_order_relaxed);
}

/* Evicts the tombstone made first, store-wide (<tombs>), or the completed
 * record that completed first. Returns false when there is none. */
static bool evict_oldest(struct store_memory *st, bool tombs)
{
    for (;;) {
        uint64_t best = NO_COMPLETED;
        struct shard *victim = NULL;
        bool evicted = false;
        size_t freed = 0;

        for (size_t i = 0; i < NSHARDS; i++) {
            uint64_t t =
                atomic_load_explicit(tombs ? &st->shards[i].oldest_tomb : &st->shards[i].oldest_seq,
                                     memory_order_relaxed);

            if (t < best) {
                best = t;
                victim = &st->shards[i];
            }
        }
        if (!victim)
            return false;
        pthread_mutex_lock(&victim->mu);
        if (tombs ? store_memory_tomb_oldest(victim) : shard_oldest(victim)) {
            struct mentry *e = tombs ? store_memory_tomb_oldest(victim) : shard_oldest(victim);

            freed = store_memory_shard_remove(
                st, victim, shard_slot(victim, e->hash, (struct span){ e->key, e->key_len }));
            evicted = true;
        }
        pthread_mutex_unlock(&victim->mu);
        if (evicted) {
            store_memory_budget_give_back(st, freed);
            atomic_fetch_add_explicit(&st->evictions, 1, memory_order_relaxed);
            return true;
        }
        /* Its oldest went meanwhile (completed key released, expired): look again. */
    }
}

/* Takes <n> bytes of the budget if they are free. */
static bool budget_try(struct store_memory *st, size_t n)
{
    size_t cur = atomic_load_explicit(&st->used, memory_order_relaxed);

    while (n <= st->max_bytes && cur <= st->max_bytes - n) {
        if (atomic_compare_exchange_weak_explicit(&st->used, &cur, cur + n, memory_order_relaxed,
                                                  memory_order_relaxed))
            return true;
    }
    return false;
}

/* Counts <n> more bytes of locks if they stay within half the budget. */
static bool lock_bytes_try(struct store_memory *st, size_t n)
{
    size_t cur = atomic_load_explicit(&st->lock_bytes, memory_order_relaxed);

    while (cur + n <= st->max_bytes / 2) {
        if (atomic_compare_exchange_weak_explicit(&st->lock_bytes, &cur, cur + n,
                                                  memory_order_relaxed, memory_order_relaxed))
            return true;
    }
    return false;
}

/* Reserves <n> bytes of the budget, reclaiming expired entries and then
 * evicting the oldest completed records as needed. The caller holds no shard
 * lock. Returns 0, -E2BIG when <n> exceeds half the budget, or -ENOSPC when
 * nothing more can go. */
int store_memory_budget_reserve(struct store_memory *st, size_t n)
{
    bool swept = false;

    if (n > st->max_bytes / 2)
        return -E2BIG;
    while (!budget_try(st, n)) {
        pthread_mutex_lock(&st->evict_mu);
        if (atomic_load_explicit(&st->used, memory_order_relaxed) > st->max_bytes - n) {
            /* Expired entries go before live ones; a full sweep at most every
             * SWEEP_WHEN_FULL_EVERY_MS, so a full store does not scan per request. */
            if (!swept &&
                now_ms() - atomic_load_explicit(&st->last_sweep_ms, memory_order_relaxed) >=
                    SWEEP_WHEN_FULL_EVERY_MS) {
                sweep_all(st);
                swept = true;
            } else if (!evict_oldest(st, true) && !evict_oldest(st, false)) {
                pthread_mutex_unlock(&st->evict_mu);
                return -ENOSPC;
            }
        }
        pthread_mutex_unlock(&st->evict_mu);
    }
    return 0;
}

/* ---- the operations (the Lua scripts' logic) ---- */

static bool tok_eq(const struct store_token *a, const struct store_token *b)
{
    return memcmp(a->hex, b->hex, STORE_TOKEN_HEX) == 0;
}

/* Looks <key> up in its locked shard, dropping it if it has expired. */
struct mentry **store_memory_lookup_live(struct store_memory *st, struct shard *sh, uint64_t hash,
                                         struct span key, uint64_t now)
{
    struct mentry **pp = shard_slot(sh, hash, key);
    bool gone;

    if (*pp && now >= (*pp)->expires_ms) {
        store_memory_budget_give_back(st, shard_expire(st, sh, pp, now, &gone));
        atomic_fetch_add_explicit(&st->expired, 1, memory_order_relaxed);
        if (gone) /* *pp is the next of the chain now: the end of the chain is where it goes */
            pp = shard_slot(sh, hash, key);
    }
    return pp;
}

/* Locks <e> (held by <op>'s shard) for <op>: a new lock, or one taken over,
 * which has room for <op>'s trace context. */
static void lock_entry(struct mentry *e, const struct mop *op, uint64_t now)
{
    e->state = MSTATE_LOCKED;
    e->tok = op->tok;
    e->changed_ms = now;
    e->lease_until_ms = now + op->ttl_ms;
    e->keep_ms = op->keep_ms;
    e->expires_ms = e->lease_until_ms + op->keep_ms;
    assert(op->trace.len <= e->trace_room);
    if (op->trace.len)
        memcpy(e->key + e->key_len, op->trace.base, op->trace.len);
    e->trace_len = (uint8_t)op->trace.len; /* an empty one leaves its room counted until it goes */
}

/* Makes the locked <e> unknown for <cause>, saying <about> (copied when the
 * budget has room for it: the state matters, the words less). */
static void make_unknown(struct store_memory *st, struct mentry *e, enum store_cause cause,
                         const struct store_about *about, uint64_t keep_ms, uint64_t now)
{
    char text[STORE_ABOUT_MAX];
    size_t len = store_about_format(about, text, sizeof(text));
    size_t need = len + 1 + RECORD_MALLOC_OVERHEAD;

    e->state = MSTATE_UNKNOWN;
    e->cause = cause;
    e->probes = 0; /* its probes start from none */
    e->last_result = STORE_PROBE_NONE;
    e->probe_next_ms = e->absent_ms = 0;
    e->changed_ms = now;
    e->expires_ms = now + keep_ms;
    if (e->about || !budget_try(st, need))
        return;
    if (!lock_bytes_try(st, need)) {
        store_memory_budget_give_back(st, need);
        return;
    }
    e->about = strdup(text);
    if (!e->about) {
        atomic_fetch_sub_explicit(&st->lock_bytes, need, memory_order_relaxed);
        store_memory_budget_give_back(st, need);
        return;
    }
    e->bytes += need;
}

/* Whether <op> takes the lock or unknown record <e> over (on-unknown-outcome
 * retry): answer_known()'s order. */
static bool takes_over(const struct mentry *e, const struct mop *op, uint64_t now)
{
    if (!op->take_over || memcmp(e->fp, op->fp, FINGERPRINT_LEN) != 0)
        return false;
    if (e->state == MSTATE_UNKNOWN)
        return true;
    return e->state == MSTATE_LOCKED && !tok_eq(&e->tok, &op->tok) && now >= e->lease_until_ms;
}

/* Answers an acquire of a key that is already held by <e>; may take it over
 * (returns true: <e> is locked for <op>) or make it unknown. */
static bool answer_known(struct store_memory *st, struct mentry *e, const struct mop *op,
                         uint64_t now, struct store_result *res)
{
    if (e->state == MSTATE_TOMB) {
        res->status = STORE_EXPIRED; /* whatever the fingerprint */
    } else if (memcmp(e->fp, op->fp, FINGERPRINT_LEN) != 0) {
        res->status = STORE_MISMATCH;
        if (e->resource)
            res->resource = span_from_cstr(e->resource); /* copied before the lock goes */
    } else if (e->state == MSTATE_LOCKED && tok_eq(&e->tok, &op->tok)) {
        res->status = STORE_ACQUIRED; /* sent again: its own lock */
    } else if (e->state == MSTATE_LOCKED && now < e->lease_until_ms) {
        res->status = STORE_IN_FLIGHT;
    } else if (takes_over(e, op, now)) {
        free(e->about);
        e->about = NULL;
        lock_entry(e, op, now); /* its extra bytes stay counted until it goes */
        res->status = STORE_ACQUIRED;
        return true;
    } else if (e->state == MSTATE_LOCKED) {
        make_unknown(st, e, STORE_CAUSE_HOLDER_LOST, op->about, e->keep_ms, now);
        res->status = STORE_UNKNOWN;
        res->cause = e->cause;
        res->became = true;
    } else if (e->state == MSTATE_UNKNOWN) {
        res->status = STORE_UNKNOWN;
        res->cause = e->cause;
    } else {
        res->status = STORE_COMPLETED;
        res->rec = record_ref(e->rec);
    }
    return false;
}

/* The slot of <op>'s key for an acquire: a tombstone the route does not
 * look at is no record (it goes). */
static struct mentry **acquire_lookup(struct store_memory *st, struct shard *sh, uint64_t hash,
                                      const struct mop *op, uint64_t now)
{
    struct span key = { op->key, op->key_len };
    struct mentry **pp = store_memory_lookup_live(st, sh, hash, key, now);

    if (*pp && (*pp)->state == MSTATE_TOMB && !op->tombstones) {
        store_memory_budget_give_back(st, store_memory_shard_remove(st, sh, pp));
        pp = shard_slot(sh, hash, key);
    }
    return pp;
}

/* Whether an acquire by <op> of the key whose entry is <e> (NULL: none)
 * needs bytes of the budget: a new lock, or a take-over whose trace context
 * needs more room than the entry has. */
static bool acquire_needs_room(const struct mentry *e, const struct mop *op, uint64_t now)
{
    return !e || (op->trace.len > e->trace_room && takes_over(e, op, now));
}

/* Makes room for <n> bytes of trace context in the lock or unknown record
 * at <pp> (its shard's lock held), out of bytes of the budget the caller
 * reserved. Returns 0, -ENOSPC (locks hold half the budget) or -ENOMEM. */
static int entry_grow_trace(struct store_memory *st, struct mentry **pp, size_t n)
{
    struct mentry *e;

    if (!lock_bytes_try(st, n))
        return -ENOSPC;
    /* Only its chain leads to a lock or an unknown record: no list, no index. */
    e = realloc(*pp, sizeof(*e) + (*pp)->key_len + n);
    if (!e) {
        atomic_fetch_sub_explicit(&st->lock_bytes, n, memory_order_relaxed);
        return -ENOMEM;
    }
    e->trace_room = (uint8_t)n;
    e->bytes += n;
    *pp = e;
    return 0;
}

/* Answers <op>, an acquire of the key at <pp> of <sh> (its lock held: let go
 * here), with what the callback needs copied into <op>; <reserved> bytes of
 * the budget, reserved for it, go back but for what a take-over's trace
 * context takes. */
static int acquire_known(struct store_memory *st, struct shard *sh, struct mentry **pp,
                         struct mop *op, uint64_t now, size_t reserved, struct store_result *res)
{
    size_t len, used = 0;
    int err;

    if (op->trace.len > (*pp)->trace_room && takes_over(*pp, op, now)) {
        assert(reserved >= op->trace.len); /* acquire_needs_room() said so */
        err = entry_grow_trace(st, pp, op->trace.len);
        if (err < 0) {
            pthread_mutex_unlock(&sh->mu);
            store_memory_budget_give_back(st, reserved);
            return err;
        }
        used = op->trace.len;
    }
    answer_known(st, *pp, op, now, res);
    /* Copied: the callback runs once the shard lock is let go. */
    if (res->status == STORE_UNKNOWN) {
        len = (*pp)->about ? strlen((*pp)->about) : 0;
        memcpy(op->about_text, (*pp)->about ? (*pp)->about : "", len + 1);
        res->about = (struct span){ op->about_text, len };
    } else if (res->status == STORE_MISMATCH && res->resource.len) {
        memcpy(op->about_text, res->resource.base, res->resource.len);
        res->resource.base = op->about_text;
    }
    if (res->status != STORE_ACQUIRED && res->status != STORE_EXPIRED && (*pp)->trace_len) {
        memcpy(op->trace_text, (*pp)->key + (*pp)->key_len, (*pp)->trace_len);
        res->trace = (struct span){ op->trace_text, (*pp)->trace_len };
    }
    pthread_mutex_unlock(&sh->mu);
    store_memory_budget_give_back(st, reserved - used);
    return 0;
}

/* Locks the key of <op> that has no entry, at <pp> of <sh> (its lock held:
 * let go here), with the <need> bytes of the budget reserved for it. */
static int acquire_new(struct store_memory *st, struct shard *sh, struct mentry **pp, uint64_t hash,
                       const struct mop *op, uint64_t now, size_t need)
{
    struct mentry *e;

    /* Locks stay within half the budget: see the top of this file. */
    if (!lock_bytes_try(st, need)) {
        pthread_mutex_unlock(&sh->mu);
        store_memory_budget_give_back(st, need);
        return -ENOSPC;
    }
    e = calloc(1, sizeof(*e) + op->key_len + op->trace.len);
    if (!e) {
        pthread_mutex_unlock(&sh->mu);
        atomic_fetch_sub_explicit(&st->lock_bytes, need, memory_order_relaxed);
        store_memory_budget_give_back(st, need);
        return -ENOMEM;
    }
    e->hash = hash;
    e->bytes = need;
    memcpy(e->fp, op->fp, FINGERPRINT_LEN);
    e->key_len = op->key_len;
    memcpy(e->key, op->key, op->key_len);
    e->trace_room = (uint8_t)op->trace.len;
    lock_entry(e, op, now);
    *pp = e;
    sh->count++;
    sh->locks++;
    shard_maybe_grow(sh);
    pthread_mutex_unlock(&sh->mu);
    return 0;
}

static int do_acquire(struct store_memory *st, struct mop *op, struct store_result *res)
{
    uint64_t hash = siphash(st->seed, op->key, op->key_len), now;
    struct shard *sh = store_memory_shard_of(st, hash);
    size_t need = store_memory_entry_bytes(op->key_len) + op->trace.len;
    bool reserved = budget_try(st, need);
    struct mentry **pp;
    int err;

    pthread_mutex_lock(&sh->mu);
    now = now_ms();
    pp = acquire_lookup(st, sh, hash, op, now);
    if (!reserved && acquire_needs_room(*pp, op, now)) {
        /* Full: evict without holding this lock (evicting takes other shard
         * locks), then look again. A known key never evicts anything (but
         * for a take-over's trace context), and neither does a lock that
         * could not be granted anyway. */
        pthread_mutex_unlock(&sh->mu);
        if (atomic_load_explicit(&st->lock_bytes, memory_order_relaxed) + need > st->max_bytes / 2)
            return -ENOSPC;
        err = store_memory_budget_reserve(st, need);
        if (err < 0)
            return err;
        reserved = true;
        pthread_mutex_lock(&sh->mu);
        now = now_ms();
        pp = acquire_lookup(st, sh, hash, op, now);
    }
    if (*pp)
        return acquire_known(st, sh, pp, op, now, reserved ? need : 0, res);
    err = acquire_new(st, sh, pp, hash, op, now, need);
    if (err == 0)
        res->status = STORE_ACQUIRED;
    return err;
}

/* The state of <key> for the holder of <tok>: -ESTALE, or 0 with <ret_done>
 * true when its own record is already stored. Takes the shard lock. */
static int holder_check(struct store_memory *st, struct mop *op, bool *ret_done)
{
    struct span key = { op->key, op->key_len };
    uint64_t hash = siphash(st->seed, op->key, op->key_len);
    struct shard *sh = store_memory_shard_of(st, hash);
    struct mentry *e;
    int err = 0;

    pthread_mutex_lock(&sh->mu);
    e = *store_memory_lookup_live(st, sh, hash, key, now_ms());
    if (!e || !tok_eq(&e->tok, &op->tok) || e->state == MSTATE_TOMB)
        err = -ESTALE;
    else
        *ret_done = e->state == MSTATE_COMPLETED;
    pthread_mutex_unlock(&sh->mu);
    return err;
}

static int do_complete(struct store_memory *st, struct mop *op, struct store_result *res)
{
    struct span key = { op->key, op->key_len };
    uint64_t hash = siphash(st->seed, op->key, op->key_len), now;
    struct shard *sh = store_memory_shard_of(st, hash);
    size_t need = record_mem_bytes(op->rec);
    char *resource = NULL;
    struct mentry *e;
    bool done = false, changed = false;
    int err;

    if (op->link && op->link->resource.len) {
        resource = strndup(op->link->resource.base, op->link->resource.len);
        if (!resource)
            return -ENOMEM;
        need += op->link->resource.len + 1 + RECORD_MALLOC_OVERHEAD;
    }
    err = store_memory_budget_reserve(st, need);
    if (err < 0) {
        /* A stale holder hears that it is stale, not that the store is full. */
        int held = holder_check(st, op, &done);

        free(resource);
        if (held < 0)
            return held;
        if (done) {
            res->status = STORE_OK;
            return 0;
        }
        return err;
    }
    pthread_mutex_lock(&sh->mu);
    now = now_ms();
    e = *store_memory_lookup_live(st, sh, hash, key, now);
    if (!e || !tok_eq(&e->tok, &op->tok) || e->state == MSTATE_TOMB) {
        err = -ESTALE;
    } else if (e->state != MSTATE_COMPLETED) {
        /* locked, or unknown since its holder lost its lease: it came back */
        atomic_fetch_sub_explicit(&st->lock_bytes, e->bytes, memory_order_relaxed);
        free(e->about);
        e->about = NULL;
        e->state = MSTATE_COMPLETED;
        e->rec = op->rec; /* the operation's reference moves to the entry */
        op->rec = NULL;
        e->bytes += need;
        need = 0;
        e->expires_ms = now + op->ttl_ms;
        e->tomb_ms = op->link ? op->link->tomb_ms : 0;
        e->changed_ms = now;
        e->completed_seq = atomic_fetch_add_explicit(&st->seq, 1, memory_order_relaxed);
        sh->locks--;
        store_memory_link_completed(sh, e);
        if (resource) {
            e->resource = resource; /* moves to the entry */
            resource = NULL;
            store_memory_res_add(st, e);
        }
        changed = true;
    }
    pthread_mutex_unlock(&sh->mu);
    free(resource); /* a retry: the first call indexed it */
    store_memory_budget_give_back(st, need);
    if (changed && st->notify)
        st->notify(st->notify_ctx, key);
    if (err == 0)
        res->status = STORE_OK;
    return err;
}

/* RELEASE, EXTEND and UNKNOWN: a holder's calls that change no record. */
static int do_release_or_extend(struct store_memory *st, struct mop *op, struct store_result *res)
{
    struct span key = { op->key, op->key_len };
    uint64_t hash = siphash(st->seed, op->key, op->key_len), now;
    struct shard *sh = store_memory_shard_of(st, hash);
    struct mentry **pp, *e;
    size_t freed = 0;
    bool changed = false;
    int err = 0;

    pthread_mutex_lock(&sh->mu);
    now = now_ms();
    pp = store_memory_lookup_live(st, sh, hash, key, now);
    e = *pp;
    if (!e && op->kind == MOP_RELEASE)
        ; /* a key already gone is released */
    else if (!e || !tok_eq(&e->tok, &op->tok) || e->state == MSTATE_COMPLETED ||
             e->state == MSTATE_TOMB || (op->kind == MOP_EXTEND && e->state != MSTATE_LOCKED))
        err = -ESTALE;
    else if (op->kind == MOP_RELEASE)
        freed = store_memory_shard_remove(st, sh, pp); /* a lock, or the unknown record it became */
    else if (op->kind == MOP_EXTEND) {
        e->lease_until_ms = now + op->ttl_ms;
        e->expires_ms = e->lease_until_ms + e->keep_ms;
    } else if (e->state == MSTATE_LOCKED) {
        make_unknown(st, e, op->cause, op->about, op->ttl_ms, now);
        changed = true;
    }
    pthread_mutex_unlock(&sh->mu);
    store_memory_budget_give_back(st, freed);
    if ((freed || changed) && st->notify)
        st->notify(st->notify_ctx, key); /* released or unknown: waiters look again */
    if (err == 0)
        res->status = STORE_OK;
    return err;
}

static int do_purge(struct store_memory *st, struct mop *op, struct store_result *res)
{
    struct span key = { op->key, op->key_len };
    uint64_t hash = siphash(st->seed, op->key, op->key_len);
    struct shard *sh = store_memory_shard_of(st, hash);
    struct mentry **pp;
    size_t freed = 0;

    pthread_mutex_lock(&sh->mu);
    pp = store_memory_lookup_live(st, sh, hash, key, now_ms());
    if (*pp)
        freed = store_memory_shard_remove(st, sh, pp);
    pthread_mutex_unlock(&sh->mu);
    if (!freed)
        return -ENOENT;
    store_memory_budget_give_back(st, freed);
    res->status = STORE_OK;
    return 0;
}

/* ---- operations ---- */

/* Runs <op> and calls back, before returning. */
static void mop_run(struct mop *op)
{
    struct store_memory *st = op->st;
    struct store_result res = { .rec = NULL };
    int err;

    switch (op->kind) {
    case MOP_ACQUIRE:
        err = do_acquire(st, op, &res);
        break;
    case MOP_COMPLETE:
        err = do_complete(st, op, &res);
        break;
    case MOP_PURGE:
        err = do_purge(st, op, &res);
        break;
    default: /* release, extend, unknown */
        err = do_release_or_extend(st, op, &res);
        break;
    }
    /* Done with the record: the caller may rely on holding the last reference
     * but the store's. */
    record_unref(op->rec);
    op->rec = NULL;
    op->done(op->ctx, err, err == 0 ? &res : NULL);
    record_unref(res.rec);
}

static struct mop mop_make(struct store_memory *st, enum mop_kind kind, struct span key,
                           const struct store_token *tok, store_done_fn *done, void *ctx)
{
    return (struct mop){
        .st = st,
        .kind = kind,
        .done = done,
        .ctx = ctx,
        .tok = *tok,
        .key_len = key.len,
        .key = key.base,
    };
}

static int memory_acquire(struct store *base, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                          const struct store_token *tok, const struct store_lock *lk,
                          store_done_fn *done, void *ctx)
{
    struct mop op;

    if (!fp || !lk || lk->lease_ms == 0 || lk->keep_ms == 0 || !store_call_is_valid(key, tok, done))
        return -EINVAL;
    op = mop_make(store_memory_of(base), MOP_ACQUIRE, key, tok, done, ctx);
    memcpy(op.fp, fp, FINGERPRINT_LEN);
    op.ttl_ms = lk->lease_ms;
    op.keep_ms = lk->keep_ms;
    op.take_over = lk->take_over;
    op.about = &lk->about;
    op.tombstones = lk->tombstones;
    op.trace = store_lock_trace(lk);
    mop_run(&op);
    return 0;
}

static int memory_unknown(struct store *base, struct span key, const struct store_token *tok,
                          enum store_cause cause, const struct store_about *about, uint64_t keep_ms,
                          store_done_fn *done, void *ctx)
{
    struct mop op;

    if (!about || keep_ms == 0 || cause >= STORE_CAUSE_MAX || !store_call_is_valid(key, tok, done))
        return -EINVAL;
    op = mop_make(store_memory_of(base), MOP_UNKNOWN, key, tok, done, ctx);
    op.cause = cause;
    op.about = about;
    op.ttl_ms = keep_ms;
    mop_run(&op);
    return 0;
}

static int memory_complete(struct store *base, struct span key, const struct store_token *tok,
                           struct record *rec, uint64_t ttl_ms, const struct store_link *link,
                           store_done_fn *done, void *ctx)
{
    struct mop op;

    if (!rec || ttl_ms == 0 || !store_call_is_valid(key, tok, done) ||
        (link && link->resource.len > STORE_RESOURCE_MAX))
        return -EINVAL;
    op = mop_make(store_memory_of(base), MOP_COMPLETE, key, tok, done, ctx);
    op.rec = record_ref(rec);
    op.ttl_ms = ttl_ms;
    op.link = link;
    mop_run(&op);
    return 0;
}

static int memory_release(struct store *base, struct span key, const struct store_token *tok,
                          store_done_fn *done, void *ctx)
{
    struct mop op;

    if (!store_call_is_valid(key, tok, done))
        return -EINVAL;
    op = mop_make(store_memory_of(base), MOP_RELEASE, key, tok, done, ctx);
    mop_run(&op);
    return 0;
}

static int memory_extend(struct store *base, struct span key, const struct store_token *tok,
                         uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    struct mop op;

    if (lock_ttl_ms == 0 || !store_call_is_valid(key, tok, done))
        return -EINVAL;
    op = mop_make(store_memory_of(base), MOP_EXTEND, key, tok, done, ctx);
    op.ttl_ms = lock_ttl_ms;
    mop_run(&op);
    return 0;
}

static int memory_purge(struct store *base, struct span store_key, size_t prefix_len,
                        store_done_fn *done, void *ctx)
{
    static const struct store_token any = { .hex = "00000000000000000000000000000000" };
    struct mop op;

    (void)prefix_len; /* a tombstone is the entry itself */
    if (!store_call_is_valid(store_key, &any, done))
        return -EINVAL;
    op = mop_make(store_memory_of(base), MOP_PURGE, store_key, &any, done, ctx);
    mop_run(&op);
    return 0;
}

/* Copies what an operator may see of <e> into <info>. */
static int memory_set_notify(struct store *base, store_notify_fn *fn, void *ctx)
{
    struct store_memory *st = store_memory_of(base);

    st->notify = fn;
    st->notify_ctx = ctx;
    return 0;
}

static bool memory_is_ready(struct store *base)
{
    (void)base;
    return true; /* in process: it answers while the process runs */
}

/* ---- the reclaim job ---- */

static void reap_run(void *arg) { sweep_all(arg); }

static void memory_free(struct store *base)
{
    struct store_memory *st = store_memory_of(base);

    worker_every_stop(st->reaper); /* waits for a sweep in progress */
    store_calls_done(&st->calls);

    for (size_t i = 0; i < NSHARDS; i++) {
        struct shard *sh = &st->shards[i];

        for (size_t b = 0; sh->buckets && b < sh->nbuckets; b++) {
            while (sh->buckets[b])
                (void)store_memory_shard_remove(st, sh, &sh->buckets[b]);
        }
        free(sh->buckets);
        pthread_mutex_destroy(&sh->mu);
    }
    pthread_mutex_destroy(&st->evict_mu);
    pthread_mutex_destroy(&st->res_mu);
    free(st->res_buckets);
    free(st);
}

/* The gauges of the budget, through the store interface (/metrics). */
static int memory_metrics(struct store *base, store_metric_fn *emit, void *ctx)
{
    struct store_memory_stats s;
    int err;

    store_memory_stats(base, &s);
    err =
        emit(ctx, "idemproxy_store_durable", NULL, "gauge",
             "1 while the store keeps its keys through a restart; the memory store never does.", 0);
    if (err == 0)
        err = emit(ctx, "idemproxy_memory_store_bytes", NULL, "gauge",
                   "Bytes the memory store counts against its budget (keys, locks, records).",
                   s.bytes);
    if (err == 0)
        err = emit(ctx, "idemproxy_memory_store_locked_bytes", NULL, "gauge",
                   "Of those, bytes held by locks and unknown outcomes: at most half the budget; "
                   "past it new keys get 503.",
                   s.lock_bytes);
    if (err == 0)
        err = emit(ctx, "idemproxy_memory_store_max_bytes", NULL, "gauge",
                   "The memory store's budget (--memory-max-bytes).", s.max_bytes);
    if (err == 0)
        err = emit(ctx, "idemproxy_memory_store_entries", NULL, "gauge",
                   "Keys the memory store holds: locks and completed records.", s.entries);
    if (err == 0)
        err = emit(ctx, "idemproxy_memory_store_evictions_total", NULL, "counter",
                   "Completed records evicted from the memory store to make room.", s.evictions);
    if (err == 0)
        err = emit(ctx, "idemproxy_memory_store_expired_total", NULL, "counter",
                   "Expired entries the memory store reclaimed.", s.expired);
    return err;
}

static const struct store_ops memory_ops = {
    .name = "memory",
    .acquire = memory_acquire,
    .complete = memory_complete,
    .release = memory_release,
    .unknown = memory_unknown,
    .list_unknown = store_memory_list_unknown,
    .resolve = store_memory_resolve,
    .probe = store_memory_probe,
    .extend = memory_extend,
    .inspect = store_memory_inspect,
    .find_resource = store_memory_find_resource,
    .purge = memory_purge,
    .set_notify = memory_set_notify,
    .is_ready = memory_is_ready,
    .metrics = memory_metrics,
    .free = memory_free,
};

bool store_is_memory(const struct store *st) { return st && st->ops == &memory_ops; }

void store_memory_stats(struct store *base, struct store_memory_stats *ret)
{
    struct store_memory *st = store_memory_of(base);
    struct store_memory_stats s = { .max_bytes = st->max_bytes };

    assert(store_is_memory(base));
    for (size_t i = 0; i < NSHARDS; i++) {
        pthread_mutex_lock(&st->shards[i].mu);
        s.entries += st->shards[i].count;
        s.locks += st->shards[i].locks;
        pthread_mutex_unlock(&st->shards[i].mu);
    }
    s.bytes = atomic_load_explicit(&st->used, memory_order_relaxed);
    s.lock_bytes = atomic_load_explicit(&st->lock_bytes, memory_order_relaxed);
    s.evictions = atomic_load_explicit(&st->evictions, memory_order_relaxed);
    s.expired = atomic_load_explicit(&st->expired, memory_order_relaxed);
    *ret = s;
}

int store_memory_new(size_t max_bytes, uint64_t reap_interval_ms, struct worker_pool *pool,
                     struct store **ret)
{
    struct store_memory *st;
    int err;

    if (!pool || max_bytes == 0 || reap_interval_ms == 0)
        return -EINVAL;
    st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    st->base.ops = &memory_ops;
    st->pool = pool;
    st->max_bytes = max_bytes;
    atomic_init(&st->used, 0);
    atomic_init(&st->lock_bytes, 0);
    atomic_init(&st->evictions, 0);
    atomic_init(&st->expired, 0);
    atomic_init(&st->last_sweep_ms, 0);
    atomic_init(&st->seq, 0);
    pthread_mutex_init(&st->evict_mu, NULL);
    pthread_mutex_init(&st->res_mu, NULL);
    store_calls_init(&st->calls);
    for (size_t i = 0; i < NSHARDS; i++) {
        pthread_mutex_init(&st->shards[i].mu, NULL);
        atomic_init(&st->shards[i].oldest_seq, NO_COMPLETED);
        atomic_init(&st->shards[i].oldest_tomb, NO_COMPLETED);
        list_init(&st->shards[i].completed);
        list_init(&st->shards[i].tombs);
    }
    st->res_nbuckets = RES_FIRST_BUCKETS;
    st->res_buckets = calloc(RES_FIRST_BUCKETS, sizeof(*st->res_buckets));
    for (size_t i = 0; i < NSHARDS; i++) {
        struct shard *sh = &st->shards[i];

        sh->nbuckets = FIRST_BUCKETS;
        sh->buckets = calloc(FIRST_BUCKETS, sizeof(*sh->buckets));
        if (!sh->buckets || !st->res_buckets) {
            memory_free(&st->base);
            return -ENOMEM;
        }
    }
    if (rng_bytes(st->seed, sizeof(st->seed)) < 0) {
        memory_free(&st->base);
        return -EIO;
    }
    err = worker_every_start(pool, reap_interval_ms, reap_interval_ms, reap_run, st, &st->reaper);
    if (err < 0) {
        memory_free(&st->base);
        return err;
    }
    *ret = &st->base;
    return 0;
}
