/* SPDX-License-Identifier: MIT */
/* The idempotency store: one interface (an ops table), two implementations
 * with the same state machine, TTLs and fencing (doc/stores.md, The state
 * machine). When an operation is accepted (returns 0) its callback runs
 * exactly once: later, when the answer comes (Redis: on the event loop whose
 * connection carried the call), or before the call returns (the memory store,
 * whose work is shorter than a hand-off). A caller must not hold a lock that
 * its callback takes. */
#ifndef IDEMPROXY_STORE_H
#define IDEMPROXY_STORE_H

#include "idemproxy/common.h"
#include "idemproxy/fingerprint.h"
#include "idemproxy/worker.h"

struct record;

#define STORE_TOKEN_HEX 32 /* a fencing token: 128 random bits as lowercase hex */

struct store_token {
    char hex[STORE_TOKEN_HEX + 1];
};

/* Why a key's outcome is unknown (doc/guarantees.md, Unknown outcomes); the names are the metrics'
 * cause labels. */
enum store_cause {
    STORE_CAUSE_UPSTREAM_TIMEOUT, /* no complete answer within the (late) timeout */
    STORE_CAUSE_UPSTREAM_RESET,   /* the connection failed once request bytes may have left */
    STORE_CAUSE_HOLDER_LOST,      /* the holder's lease ran out: it died, froze or lost the store */
    STORE_CAUSE_MAX,
};

#define STORE_ABOUT_MAX 1024 /* an unknown record keeps at most this much of its request */

/* What an unknown record says of its request: "<route> <method> <target>",
 * cut at STORE_ABOUT_MAX bytes (no field holds a space). */
struct store_about {
    struct span route, method, target;
};

/* What an acquire asks for (doc/stores.md, The state machine;
 * doc/guarantees.md, Unknown outcomes). The record outlives its lease: a lock
 * is kept <lease_ms> + <keep_ms>, and the lease is what is left of that beyond
 * <keep_ms>, so that the heartbeat's extend is a bare PEXPIRE. */
struct store_lock {
    uint64_t lease_ms; /* --lock-ttl: the heartbeat extends it */
    uint64_t keep_ms;  /* the record is kept this long after its last change (--ttl) */
    /* A lock whose lease ran out is taken over (on-unknown-outcome retry),
     * or (refuse) the key becomes unknown, cause holder_lost. An unknown
     * key is taken over too when true. */
    bool take_over;
    struct store_about about; /* borrowed: what the key says if it becomes unknown */
    /* Where there is no record, a tombstone of the key is STORE_EXPIRED
     * (doc/configuration.md, Tombstones); false (the route keeps none): a
     * tombstone is not looked at, and the key is locked over it. */
    bool tombstones;
    size_t prefix_len; /* the store key begins with its prefix, this long */
    /* The acquiring request's trace context (doc/operations.md, Tracing): a
     * W3C traceparent, STORE_TRACE_LEN bytes ("00-<32 hex>-<16 hex>-<2
     * hex>"), or empty for none. Written with the lock, kept with the
     * record while it lives (complete, unknown and resolve leave it), and
     * given back to the acquires that find the key, so that a replay, a
     * 409, a 422 or an unknown answer links to the request that ran. A
     * take-over writes its own. The store checks nothing of it but its
     * length: another length is kept as empty. */
    struct span trace;
};

#define STORE_TRACE_LEN 55

#define STORE_RESOURCE_MAX 255 /* a resource id: 1 to 255 bytes of 0x21-0x7E */

/* What a complete keeps beside the answer. A resource link
 * (doc/configuration.md, Resource links): the id of what a completed answer
 * created, kept with its record (a 422 names it), and a link of its own from
 * that id to the record's key, kept as long as the record (each store lays it
 * out: a key of its own, idemkey_link_key(), or a column). A tombstone
 * (doc/configuration.md, Tombstones): the key and its fingerprint, kept
 * <tomb_ms> after the record expires (a key of its own,
 * idemkey_tomb_key(), a row kept, or the entry itself). */
struct store_link {
    /* the resource id: 1 to STORE_RESOURCE_MAX bytes of 0x21-0x7E; empty: none */
    struct span resource;
    size_t prefix_len;           /* the record's store key begins with its prefix, this long */
    uint64_t tomb_ms;            /* 0: no tombstone */
    uint8_t fp[FINGERPRINT_LEN]; /* with <tomb_ms>: the request's fingerprint, kept in it */
};

/* A probe of an unknown key (doc/configuration.md, Reconcile): its step.
 * How many probes were made, the last one's result, the time before which
 * no other may start and the first absent of a run are fields of the key's
 * record, on the store's own clock: still one store key per idempotency key. */
enum store_probe_step {
    STORE_PROBE_CLAIM,  /* claim the next probe, if the store allows one now */
    STORE_PROBE_FOUND,  /* a probe found the answer: complete the key with it */
    STORE_PROBE_ABSENT, /* a probe found that the request took no effect */
    STORE_PROBE_FAILED, /* a probe proved nothing */
};

/* What a probe step did (STORE_OK's res->probe). */
enum store_probe_answer {
    STORE_PROBE_CLAIMED,  /* claim: the probe is the caller's: res->probe_ms, res->probes */
    STORE_PROBE_LATER,    /* claim: not yet (settle, or another probe within every):
                           * res->probe_ms is how long to wait */
    STORE_PROBE_SPENT,    /* claim: its attempts are used up */
    STORE_PROBE_KNOWN,    /* any step: the key is not unknown (any more): nothing changed */
    STORE_PROBE_NOTED,    /* found (the key is completed), absent, failed: written */
    STORE_PROBE_RELEASED, /* absent: the second of a run, sent at least 1 s after the first:
                           * the key is released, so that its next retry runs */
};

/* The last result a key's probes got (store_info). */
enum store_probe_result {
    STORE_PROBE_NONE, /* no probe ended yet */
    STORE_PROBE_WAS_FOUND,
    STORE_PROBE_WAS_ABSENT,
    STORE_PROBE_WAS_FAILED,
};

#define STORE_ABSENT_GAP_MS 1000 /* two absents in a row release a key when this far apart */

/* A probe step's arguments (store_probe()). */
struct store_probe {
    enum store_probe_step step;
    /* claim: allowed from <settle_ms> after the key became unknown, then
     * once per <every_ms>, <attempts> in all */
    uint64_t settle_ms, every_ms;
    unsigned attempts;
    uint64_t sent_ms;   /* found, absent, failed: the store time its claim gave (res->probe_ms) */
    struct record *rec; /* found: the answer to keep (the store takes its own reference) */
    uint64_t ttl_ms;    /* found: kept as resolve's, for a record that does not say its own */
};

enum store_status {
    STORE_ACQUIRED,  /* acquire: the lock is ours, under the token given */
    STORE_UNKNOWN,   /* acquire: the key's outcome is unknown; res->cause, about, became */
    STORE_IN_FLIGHT, /* acquire: locked by another request with the same fingerprint */
    STORE_MISMATCH,  /* acquire: the key is known with another fingerprint */
    STORE_COMPLETED, /* acquire: completed earlier with this fingerprint; res->rec is the response
                      */
    STORE_OK,        /* complete, release, extend: done (also when a retry finds its own result) */
    /* acquire: completed earlier with this fingerprint, but its answer does
     * not open (store_seal.h): res->unreadable says why */
    STORE_UNREADABLE,
    /* acquire: no record, but the tombstone of one that completed and
     * expired (doc/configuration.md, Tombstones); nothing is locked */
    STORE_EXPIRED,
};

struct store_result {
    enum store_status status;
    struct record *rec; /* STORE_COMPLETED only: borrowed for the callback; record_ref() to keep */
    /* STORE_UNKNOWN only: */
    enum store_cause cause;
    bool became;       /* this acquire made it unknown (holder_lost), rather than found it */
    struct span about; /* borrowed for the callback: "<route> <method> <target>", maybe empty */
    /* STORE_MISMATCH: the resource the key's answer created (borrowed for
     * the callback), empty when none */
    struct span resource;
    const char *unreadable; /* STORE_UNREADABLE only: why, in words for the log (borrowed) */
    /* acquire, STORE_IN_FLIGHT, STORE_MISMATCH, STORE_UNKNOWN and
     * STORE_COMPLETED: the trace context the acquire that locked the key
     * gave (store_lock.trace), borrowed for the callback; empty when none */
    struct span trace;
    /* store_probe() only: what its step did; CLAIMED: the store time of the
     * claim and the probes made with it; LATER: the ms to wait */
    enum store_probe_answer probe;
    uint64_t probe_ms;
    unsigned probes;
};

/* Runs exactly once per accepted operation: <err> is 0 and
 * <res> filled, or <err> is a negative errno and <res> is NULL: -ESTALE when
 * the token is no longer the key's lock holder (complete, release, extend),
 * -ETIMEDOUT, -ECONNREFUSED, -ECONNRESET, -EPROTO, -EACCES (Redis refused
 * the credentials), -ENXIO (its host name does not resolve), -EAGAIN (a
 * cluster still failing over when --store-timeout ran out) or -EREMOTEIO
 * (an acquire too few replicas confirmed: the lock was given back) when the
 * store failed. */
typedef void store_done_fn(void *ctx, int err, const struct store_result *res);

struct store;

/* One stored key, as store_inspect() reports it (for operators). */
struct store_info {
    char *store_key; /* owned, NUL-terminated */
    bool completed;  /* false: locked, a request in flight, or unknown */
    bool tombstone;  /* completed and expired: only its fingerprint is left (no <rec>) */
    bool unknown;    /* its outcome is unknown (doc/guarantees.md): <cause>, <about> */
    enum store_cause cause;
    char *about;                      /* unknown: owned "<route> <method> <target>", or NULL */
    char fp_hex[FINGERPRINT_HEX + 1]; /* the fingerprint, lowercase hex */
    uint64_t age_ms;                  /* since it was locked, or completed */
    uint64_t ttl_ms;                  /* left before it expires */
    uint64_t lease_ms;                /* locked: left of its lease (0: it ran out) */
    struct record *rec;               /* completed: own reference; its body only if asked */
    /* completed: owned, the resource its answer created (doc/configuration.md,
     * Resource links), or NULL */
    char *resource;
    char *sealed_by;  /* completed: owned, the id of the key that sealed it (store_seal.h) */
    char *unreadable; /* completed: owned, why its answer does not open (<rec> NULL then) */
    unsigned probes;  /* unknown: the probes claimed (doc/configuration.md, Reconcile) */
    enum store_probe_result last_result; /* unknown: what the last one that ended found */
};

#define STORE_CURSOR_MAX 48 /* a page cursor of store_list_unknown(), NUL included */

struct store_info_list {
    struct store_info *items; /* owned array of n */
    size_t n;
    char cursor[STORE_CURSOR_MAX]; /* store_list_unknown(): the next page's, "" at the end */
};

/* Frees what <info> owns. */
void store_info_done(struct store_info *info);

/* Frees what <l> holds and empties it. NULL-safe. */
void store_info_list_done(struct store_info_list *l);

/* Runs exactly once per accepted store_inspect(), on a store thread: <err> is
 * 0 and <list> filled (the callee may take its items: set list->n = 0 and
 * list->items = NULL), or a negative errno and <list> empty. */
typedef void store_list_fn(void *ctx, int err, struct store_info_list *list);

/* Reports one value of a store's own to /metrics: a sample of the
 * Prometheus family <name> of <type> ("gauge", "counter") described by
 * <help>, with <labels> (`op="acquire"`; NULL: none). A family of several
 * samples passes <type> and <help> with its first only (NULL with the
 * others, which follow it at once). Returns 0, or a negative errno that
 * ends the report. */
typedef int store_metric_fn(void *ctx, const char *name, const char *labels, const char *type,
                            const char *help, uint64_t value);

/* Told that <key> was completed or released, so that requests waiting for it
 * may try again. Runs on a store thread or inside a call; must not block. */
typedef void store_notify_fn(void *ctx, struct span key);

struct store_ops {
    const char *name;
    int (*acquire)(struct store *st, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                   const struct store_token *tok, const struct store_lock *lk, store_done_fn *done,
                   void *ctx);
    int (*complete)(struct store *st, struct span key, const struct store_token *tok,
                    struct record *rec, uint64_t ttl_ms, const struct store_link *link,
                    store_done_fn *done, void *ctx);
    int (*release)(struct store *st, struct span key, const struct store_token *tok,
                   store_done_fn *done, void *ctx);
    int (*unknown)(struct store *st, struct span key, const struct store_token *tok,
                   enum store_cause cause, const struct store_about *about, uint64_t keep_ms,
                   store_done_fn *done, void *ctx);
    int (*extend)(struct store *st, struct span key, const struct store_token *tok,
                  uint64_t lock_ttl_ms, store_done_fn *done, void *ctx);
    int (*inspect)(struct store *st, struct span prefix, struct span key, bool with_body,
                   store_list_fn *done, void *ctx);
    int (*find_resource)(struct store *st, struct span prefix, struct span resource, bool with_body,
                         store_list_fn *done, void *ctx);
    int (*purge)(struct store *st, struct span store_key, size_t prefix_len, store_done_fn *done,
                 void *ctx);
    int (*list_unknown)(struct store *st, struct span prefix, const char *cursor,
                        store_list_fn *done, void *ctx);
    int (*resolve)(struct store *st, struct span store_key, struct record *rec, uint64_t ttl_ms,
                   store_done_fn *done, void *ctx);
    int (*probe)(struct store *st, struct span store_key, const struct store_probe *p,
                 store_done_fn *done, void *ctx);
    int (*set_notify)(struct store *st, store_notify_fn *fn, void *ctx);
    bool (*is_ready)(struct store *st);
    /* The last failure the store knows of, in its own words ("<server>:
     * WRONGPASS ..."), into <buf>; "" when none. NULL: none ever. */
    void (*last_failure)(struct store *st, char *buf, size_t len);
    int (*metrics)(struct store *st, store_metric_fn *emit, void *ctx); /* NULL: none */
    void (*free)(struct store *st);
};

struct store {
    const struct store_ops *ops; /* first member of each implementation */
};

/* A store error <err> (a negative errno) in words an operator can act on. */
const char *store_strerror(int err);

/* The label of <c> ("upstream_timeout", ...). */
const char *store_cause_name(enum store_cause c);

/* The cause named <s>. Returns 0, or -EINVAL for no cause's name. */
int store_cause_parse(struct span s, enum store_cause *ret);

/* Writes <about> as "<route> <method> <target>" into <out> (<cap> bytes at
 * least 1), cut at STORE_ABOUT_MAX - 1 bytes, NUL-terminated. Returns its length. */
size_t store_about_format(const struct store_about *about, char *out, size_t cap);

/* Fills <ret> with a new random token (rng.h). Returns 0 or -EIO. */
int store_token_new(struct store_token *ret);

/* Starts ACQUIRE of <key> (copied) for the fingerprint <fp> under the token
 * <tok> (copied), locking it as <lk> says (copied). Returns 0 when accepted:
 * <done> then runs exactly once. Returns a negative errno when refused:
 * <done> never runs. */
static inline int store_acquire(struct store *st, struct span key,
                                const uint8_t fp[FINGERPRINT_LEN], const struct store_token *tok,
                                const struct store_lock *lk, store_done_fn *done, void *ctx)
{
    return st->ops->acquire(st, key, fp, tok, lk, done, ctx);
}

/* Starts COMPLETE: stores <rec> (the store takes its own reference) as the
 * answer of <key>, kept <ttl_ms>, if <tok> still holds the lock, or the key
 * became unknown while <tok> held it (a holder that comes back); with
 * <link> (copied; NULL: none), its resource (if any) is kept with the record
 * and the link is written, kept <ttl_ms> too, and its tombstone (if
 * link->tomb_ms) is written, kept <ttl_ms> + link->tomb_ms, before <done>
 * gets STORE_OK.
 * Idempotent per token: a retry that finds its own result stored gets
 * STORE_OK (and writes the link again). */
static inline int store_complete(struct store *st, struct span key, const struct store_token *tok,
                                 struct record *rec, uint64_t ttl_ms, const struct store_link *link,
                                 store_done_fn *done, void *ctx)
{
    return st->ops->complete(st, key, tok, rec, ttl_ms, link, done, ctx);
}

/* Starts RELEASE: removes the lock of <key> if <tok> holds it (or held it
 * when the key became unknown: its holder learned the outcome after all). A
 * key already gone is STORE_OK. */
static inline int store_release(struct store *st, struct span key, const struct store_token *tok,
                                store_done_fn *done, void *ctx)
{
    return st->ops->release(st, key, tok, done, ctx);
}

/* Starts UNKNOWN: the holder of <tok> cannot tell whether its request ran
 * upstream, so the key becomes unknown for <cause>, saying <about> (copied),
 * kept <keep_ms>. Idempotent per token; -ESTALE when <tok> does not hold it. */
static inline int store_unknown(struct store *st, struct span key, const struct store_token *tok,
                                enum store_cause cause, const struct store_about *about,
                                uint64_t keep_ms, store_done_fn *done, void *ctx)
{
    return st->ops->unknown(st, key, tok, cause, about, keep_ms, done, ctx);
}

/* Starts EXTEND: renews the lease of the lock of <key> for <lock_ttl_ms> from
 * now if <tok> holds it (the record is kept its keep time beyond it). */
static inline int store_extend(struct store *st, struct span key, const struct store_token *tok,
                               uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    return st->ops->extend(st, key, tok, lock_ttl_ms, done, ctx);
}

/* Starts INSPECT: lists every stored key <prefix><scope>:<key>, whatever its
 * scope (32 hex characters), locked or completed, with the body of completed
 * ones when <with_body>. For operators: it may scan the whole store. Returns 0
 * when accepted (<done> then runs exactly once) or a negative errno. */
static inline int store_inspect(struct store *st, struct span prefix, struct span key,
                                bool with_body, store_list_fn *done, void *ctx)
{
    return st->ops->inspect(st, prefix, key, with_body, done, ctx);
}

/* Starts FIND RESOURCE (for operators): lists, as store_inspect() does,
 * the records that the links <prefix>r:<scope>:<resource> of any scope
 * lead to (a link whose record is gone lists nothing). Returns 0 when
 * accepted (<done> then runs exactly once) or a negative errno. */
static inline int store_find_resource(struct store *st, struct span prefix, struct span resource,
                                      bool with_body, store_list_fn *done, void *ctx)
{
    return st->ops->find_resource(st, prefix, resource, with_body, done, ctx);
}

/* Starts PURGE: deletes the stored key <store_key>, locked or completed, and
 * its tombstone, so that its request may run again. <done> gets STORE_OK, or
 * -ENOENT when there was neither. <prefix_len>: the store key begins with its
 * prefix, this long. */
static inline int store_purge(struct store *st, struct span store_key, size_t prefix_len,
                              store_done_fn *done, void *ctx)
{
    return st->ops->purge(st, store_key, prefix_len, done, ctx);
}

/* Starts LIST UNKNOWN (for operators): one page of the stored keys under
 * <prefix>, any key and scope, whose outcome is unknown, from <cursor> (""
 * for the first page); list->cursor says where the next one starts ("" at
 * the end). A page may hold fewer keys than the next (even none): it looks
 * at a bounded part of the store. Returns 0 when accepted (<done> then runs
 * exactly once) or a negative errno. */
static inline int store_list_unknown(struct store *st, struct span prefix, const char *cursor,
                                     store_list_fn *done, void *ctx)
{
    return st->ops->list_unknown(st, prefix, cursor, done, ctx);
}

/* Starts RESOLVE (for operators): completes the unknown key <store_key> with
 * <rec> (the store takes its own reference), kept what the record was to be
 * kept (<ttl_ms> when it does not say), so that later duplicates are
 * replayed. <done> gets STORE_OK, -ENOENT when there is no such key, or
 * -EBUSY when the key is not unknown (it changed nothing). */
static inline int store_resolve(struct store *st, struct span store_key, struct record *rec,
                                uint64_t ttl_ms, store_done_fn *done, void *ctx)
{
    return st->ops->resolve(st, store_key, rec, ttl_ms, done, ctx);
}

/* Starts a PROBE step <p> (copied; its record reference is the caller's)
 * on the key <store_key> (doc/configuration.md, Reconcile). Each step
 * changes the record only while its outcome is unknown (else
 * STORE_PROBE_KNOWN):
 * - CLAIM: when the key became unknown <settle_ms> ago or more, no claim
 *   was made in the last <every_ms> and fewer than <attempts> were made,
 *   counts one and marks the time (CLAIMED, with the store's time in
 *   res->probe_ms); else LATER (with the ms to wait) or SPENT;
 * - FOUND: completes the key with p->rec, as store_resolve() does (waiters
 *   are told);
 * - ABSENT: when the last result was absent too, from a claim at least
 *   STORE_ABSENT_GAP_MS before p->sent_ms, deletes the key (RELEASED:
 *   waiters are told); else notes absent, sent at p->sent_ms;
 * - FAILED: notes failed (an absent run ends).
 * A FOUND, ABSENT or FAILED whose claim (p->sent_ms) came before the key
 * last became unknown belongs to an earlier unknown period: KNOWN, nothing
 * written.
 * <done> gets STORE_OK with res->probe, or -ENOENT when there is no such
 * key. Returns 0 when accepted (<done> then runs exactly once, maybe on
 * another thread) or a negative errno. */
static inline int store_probe(struct store *st, struct span store_key, const struct store_probe *p,
                              store_done_fn *done, void *ctx)
{
    return st->ops->probe(st, store_key, p, done, ctx);
}

/* The label of <r>: "", "found", "absent", "failed". */
const char *store_probe_result_name(enum store_probe_result r);

/* Asks <st> to call <fn>(<ctx>, key) whenever a key is completed or released,
 * by this process or (Redis) any other: for --wait. Call once, before any
 * operation. Notifications are a hint, not a promise: one may be lost (a
 * Redis connection dropping), so a waiter also has a deadline. Returns 0 or
 * a negative errno. */
static inline int store_set_notify(struct store *st, store_notify_fn *fn, void *ctx)
{
    return st->ops->set_notify(st, fn, ctx);
}

/* True while the store answers (for /readyz). Cheap, any thread. */
static inline bool store_is_ready(struct store *st) { return st->ops->is_ready(st); }

/* Why a call failed with <err>, in words for the log: the store's last
 * failure as its server sent it (Redis's "WRONGPASS ...", PostgreSQL's
 * message) when it knows one, else store_strerror(<err>). Any thread. */
void store_why(struct store *st, int err, char *buf, size_t len);

/* Reports the store's own values (the memory store's budget and evictions)
 * through <emit>. Returns 0 or the first error of <emit>. Any thread. */
static inline int store_metrics(struct store *st, store_metric_fn *emit, void *ctx)
{
    return st->ops->metrics ? st->ops->metrics(st, emit, ctx) : 0;
}

/* Frees <st>: every accepted operation has reported back before it returns. NULL-safe. */
static inline void store_free(struct store *st)
{
    if (st)
        st->ops->free(st);
}

#endif
