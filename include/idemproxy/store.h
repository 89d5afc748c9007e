/* SPDX-License-Identifier: MIT */
/* The idempotency store: one interface (an ops table), two implementations
 * with the same state machine, TTLs and fencing (SPEC §2). Every operation is
 * asynchronous: when accepted (returns 0) its callback runs exactly once, on a
 * store thread, never from inside the call. */
#ifndef IDEMPROXY_STORE_H
#define IDEMPROXY_STORE_H

#include <pthread.h>

#include "idemproxy/common.h"
#include "idemproxy/fingerprint.h"
#include "idemproxy/worker.h"

struct record;

#define STORE_TOKEN_HEX 32 /* a fencing token: 128 random bits as lowercase hex */

struct store_token {
    char hex[STORE_TOKEN_HEX + 1];
};

enum store_status {
    STORE_ACQUIRED,  /* acquire: the lock is ours, under the token given */
    STORE_IN_FLIGHT, /* acquire: locked by another request with the same fingerprint */
    STORE_MISMATCH,  /* acquire: the key is known with another fingerprint */
    STORE_COMPLETED, /* acquire: completed earlier with this fingerprint; res->rec is the response
                      */
    STORE_OK,        /* complete, release, extend: done (also when a retry finds its own result) */
};

struct store_result {
    enum store_status status;
    struct record *rec; /* STORE_COMPLETED only: borrowed for the callback; record_ref() to keep */
};

/* Runs exactly once per accepted operation, on a store thread: <err> is 0 and
 * <res> filled, or <err> is a negative errno and <res> is NULL: -ESTALE when
 * the token is no longer the key's lock holder (complete, release, extend),
 * -ETIMEDOUT, -ECONNREFUSED, -ECONNRESET or -EPROTO when the store failed. */
typedef void store_done_fn(void *ctx, int err, const struct store_result *res);

struct store;

struct store_ops {
    const char *name;
    int (*acquire)(struct store *st, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                   const struct store_token *tok, uint64_t lock_ttl_ms, store_done_fn *done,
                   void *ctx);
    int (*complete)(struct store *st, struct span key, const struct store_token *tok,
                    struct record *rec, uint64_t ttl_ms, store_done_fn *done, void *ctx);
    int (*release)(struct store *st, struct span key, const struct store_token *tok,
                   store_done_fn *done, void *ctx);
    int (*extend)(struct store *st, struct span key, const struct store_token *tok,
                  uint64_t lock_ttl_ms, store_done_fn *done, void *ctx);
    bool (*is_ready)(struct store *st);
    void (*free)(struct store *st);
};

struct store {
    const struct store_ops *ops; /* first member of each implementation */
};

/* Fills <ret> with a new random token (OpenSSL RAND_bytes). Returns 0 or -EIO. */
int store_token_new(struct store_token *ret);

/* Starts ACQUIRE of <key> (copied) for the fingerprint <fp> under the token
 * <tok> (copied), locking it for <lock_ttl_ms>. Returns 0 when accepted: <done>
 * then runs exactly once. Returns a negative errno when refused: <done> never runs. */
static inline int store_acquire(struct store *st, struct span key,
                                const uint8_t fp[FINGERPRINT_LEN], const struct store_token *tok,
                                uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    return st->ops->acquire(st, key, fp, tok, lock_ttl_ms, done, ctx);
}

/* Starts COMPLETE: stores <rec> (the store takes its own reference) as the
 * answer of <key>, kept <ttl_ms>, if <tok> still holds the lock. Idempotent per
 * token: a retry that finds its own result stored gets STORE_OK. */
static inline int store_complete(struct store *st, struct span key, const struct store_token *tok,
                                 struct record *rec, uint64_t ttl_ms, store_done_fn *done,
                                 void *ctx)
{
    return st->ops->complete(st, key, tok, rec, ttl_ms, done, ctx);
}

/* Starts RELEASE: removes the lock of <key> if <tok> holds it. A key already
 * gone is STORE_OK. */
static inline int store_release(struct store *st, struct span key, const struct store_token *tok,
                                store_done_fn *done, void *ctx)
{
    return st->ops->release(st, key, tok, done, ctx);
}

/* Starts EXTEND: sets the lock of <key> to expire <lock_ttl_ms> from now if
 * <tok> holds it. */
static inline int store_extend(struct store *st, struct span key, const struct store_token *tok,
                               uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    return st->ops->extend(st, key, tok, lock_ttl_ms, done, ctx);
}

/* True while the store answers (for /readyz). Cheap, any thread. */
static inline bool store_is_ready(struct store *st) { return st->ops->is_ready(st); }

/* Frees <st>: every accepted operation has reported back before it returns. NULL-safe. */
static inline void store_free(struct store *st)
{
    if (st)
        st->ops->free(st);
}

/* ---- For store implementations ---- */

/* Counts a store's accepted operations until they have called back, so that
 * its free() can wait for them. Embedded in the store: init, then done. */
struct store_calls {
    pthread_mutex_t mu;
    pthread_cond_t idle;
    unsigned n; /* accepted, not yet called back */
};

void store_calls_init(struct store_calls *c);

/* Queues <fn>(<job>) on <pool> as one accepted call of <c>. Returns 0, or
 * the error of worker_submit(): then the call is not counted and <fn> never
 * runs (the caller frees <job>). */
int store_calls_submit(struct store_calls *c, struct worker_pool *pool, worker_fn *fn, void *job);

/* Marks one accepted call of <c> as called back: its job's last step. */
void store_calls_end(struct store_calls *c);

/* Waits until every accepted call of <c> has called back, then destroys <c>. */
void store_calls_done(struct store_calls *c);

/* True when <key> is not empty, <tok> holds STORE_TOKEN_HEX characters and
 * <done> is set: what every operation needs. */
bool store_call_is_valid(struct span key, const struct store_token *tok, store_done_fn *done);

#endif
