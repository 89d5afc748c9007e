/* SPDX-License-Identifier: MIT */
/* What the store implementations share (store.c), kept out of store.h, which
 * is the interface their callers see: counting accepted calls until they
 * have called back, the argument check every operation makes, and building
 * an inspect listing. */
#ifndef IDEMPROXY_STORE_IMPL_H
#define IDEMPROXY_STORE_IMPL_H

#include <pthread.h>

#include "idemproxy/store.h"

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

/* Appends <info> (its owned parts move into <l>) to <l>, whose capacity is
 * <cap>. Returns 0 or -ENOMEM (then <info> still belongs to the caller). */
int store_info_list_add(struct store_info_list *l, size_t *cap, const struct store_info *info);

/* True when <key> is not empty, <tok> holds STORE_TOKEN_HEX characters and
 * <done> is set: what every operation needs. */
bool store_call_is_valid(struct span key, const struct store_token *tok, store_done_fn *done);

/* The trace context to keep for a lock <lk> (store.h, store_lock.trace):
 * lk->trace when it is STORE_TRACE_LEN bytes long, else none (empty). */
struct span store_lock_trace(const struct store_lock *lk);

/* An operator call (inspect or purge) queued on the pool: its arguments,
 * copied, and its callback. Both stores run theirs this way. */
struct store_admin_job {
    void *st;                 /* the implementation */
    store_list_fn *list_done; /* inspect */
    store_done_fn *done;      /* purge */
    void *ctx;
    bool with_body;
    char *prefix, *key; /* owned, NUL-terminated copies; purge: <key> is the store key */
    size_t prefix_len, key_len;
    bool unknown_only;             /* list_unknown: any key, unknown ones, a page */
    bool resource;                 /* find_resource: <key> is the resource id */
    char cursor[STORE_CURSOR_MAX]; /* list_unknown: where the page starts */
    struct record *rec;            /* resolve: own reference */
    uint64_t ttl_ms;               /* resolve, probe found */
    struct store_probe probe;      /* probe: its step (<rec> is the job's own, above) */
};

#define STORE_LIST_PAGE 100 /* list_unknown: a page ends once it holds this many keys */

/* Copies <prefix> and <key> into a new job for <st> with the rest of <args>
 * (its record reference taken over, whatever the outcome), and queues
 * <fn>(job) on <pool> as one accepted call of <calls>. Returns 0 (<fn> then owns the job and frees
 * it with store_admin_job_free()), or -ENOMEM or the error of worker_submit(): nothing is queued.
 */
int store_admin_job_submit(struct store_calls *calls, struct worker_pool *pool, worker_fn *fn,
                           const struct store_admin_job *args, struct span prefix, struct span key);

/* Parses a list_unknown cursor "<a>.<b>" (two decimal numbers; "" is 0.0).
 * Returns 0, or -EINVAL for anything else. */
int store_cursor_parse(const char *cursor, uint64_t *a, uint64_t *b);

/* Frees <job>. NULL-safe. */
void store_admin_job_free(struct store_admin_job *job);

#endif
