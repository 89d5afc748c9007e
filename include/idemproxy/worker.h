/* SPDX-License-Identifier: MIT */
/* A small pool of threads running queued jobs, now or after a delay (timers:
 * lock heartbeats, store retries). Store calls block on these threads, never
 * on the front end's. */
#ifndef IDEMPROXY_WORKER_H
#define IDEMPROXY_WORKER_H

#include "idemproxy/common.h"

struct worker_pool;
struct worker_every;

/* A job: runs once, on one of the pool's threads. */
typedef void worker_fn(void *ctx);

/* Starts <nthreads> threads. Returns 0 with the pool in <ret>, -EINVAL, -ENOMEM
 * or -EAGAIN. */
int worker_pool_new(unsigned nthreads, struct worker_pool **ret);

/* Queues <fn>(<ctx>) to run as soon as a thread is free (FIFO). Returns 0, or
 * -ECANCELED once the pool is stopping, -ENOMEM: then <fn> never runs. */
int worker_submit(struct worker_pool *p, worker_fn *fn, void *ctx);

/* Queues <fn>(<ctx>) to run <delay_ms> from now. Same returns as worker_submit(). */
int worker_submit_after(struct worker_pool *p, uint64_t delay_ms, worker_fn *fn, void *ctx);

/* The index (0..nthreads-1) of the calling pool thread, or -1 off the pool:
 * lets a module keep one connection per thread. */
int worker_current_index(void);

/* The number of threads of <p>. */
unsigned worker_pool_size(const struct worker_pool *p);

/* Stops accepting jobs, runs every job still queued, delayed ones at once (in
 * due order: their owners see their own shutdown state), joins the threads,
 * frees the pool. NULL-safe. */
void worker_pool_free(struct worker_pool *p);

/* Runs <fn>(<ctx>) on <p> every <interval_ms>, the first time <first_ms> from
 * now, one run at a time, until worker_every_stop() (or the pool stops:
 * worker_pool_free() runs a queued run at once, which queues no more). Returns
 * 0 with the job in <ret>, or the error of worker_submit_after(): -ECANCELED,
 * -ENOMEM. */
int worker_every_start(struct worker_pool *p, uint64_t first_ms, uint64_t interval_ms,
                       worker_fn *fn, void *ctx, struct worker_every **ret);

/* Stops <e>: waits for a run in progress; <fn> never runs once it returns.
 * Call before what <ctx> points to goes; <e> is freed (by its queued run, if
 * one is queued). NULL-safe. */
void worker_every_stop(struct worker_every *e);

#endif
