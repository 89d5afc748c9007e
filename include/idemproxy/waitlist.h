/* SPDX-License-Identifier: MIT */
/* --wait (doc/configuration.md, Holding duplicates: `--wait`): duplicates held
 * while their key is in flight, until the store says it was completed or
 * released (then they try again: one may take the key), or their wait runs out
 * (then they get the 409). A held duplicate is an entry in a hash of lists: no
 * thread, no polling loop; one job checks deadlines every WAIT_TICK_MS while
 * any is held, and an entry not notified for WAIT_POLL_MS is retried anyway (a
 * notification can be lost). Any thread; callbacks run on a worker thread or
 * the notifying store thread. */
#ifndef IDEMPROXY_WAITLIST_H
#define IDEMPROXY_WAITLIST_H

#include "idemproxy/common.h"

#define WAITLIST_TICK_MS 50  /* how often deadlines of held entries are checked */
#define WAITLIST_POLL_MS 500 /* a held entry is retried this often even unnotified */

struct waitlist;
struct worker_pool;

/* Embedded in what is held (a request); zeroed before its first hold. */
struct waitlist_entry {
    const char *key;             /* borrowed: the store key it waits for, set before a hold */
    uint64_t until_ms;           /* its wait ends then; 0 before its first hold */
    uint64_t poll_at_ms;         /* retried then even without a notification */
    struct waitlist_entry *next; /* the waitlist's */
};

/* What becomes of an entry that leaves the list: it is tried again, or its
 * wait is over. Runs once per hold, never under the waitlist's lock. */
typedef void waitlist_fn(void *ctx, struct waitlist_entry *e);

/* Creates a waitlist holding entries up to <wait_ms>, its deadline job on
 * <pool> (borrowed). <retry> and <expire> are called with <ctx>. Returns 0
 * with it in <ret>, or -ENOMEM. */
int waitlist_new(struct worker_pool *pool, uint64_t wait_ms, waitlist_fn *retry,
                 waitlist_fn *expire, void *ctx, struct waitlist **ret);

/* Holds <e> (its key in flight) until a notification for its key, its poll
 * time or the end of its wait (counted from its first hold, at <now_ms>).
 * Returns false when it is not held: its wait is over, or the list is
 * quiescing or stopped; nothing is called then. */
bool waitlist_hold(struct waitlist *w, struct waitlist_entry *e, uint64_t now_ms);

/* <key> was completed or released: every entry held for it is retried.
 * Has the shape of store_notify_fn, with the waitlist as <ctx>. */
void waitlist_notify(void *ctx, struct span key);

/* SIGTERM: every held entry expires within WAITLIST_TICK_MS, none is held
 * any more. */
void waitlist_quiesce(struct waitlist *w);

/* Stopping: notifications are ignored (the pool may be going), none is held
 * any more. Held entries expire at the pool's shutdown (it runs the deadline
 * job at once). */
void waitlist_stop(struct waitlist *w);

/* Frees <w>, once the pool has run its jobs. NULL-safe. */
void waitlist_free(struct waitlist *w);

#endif
