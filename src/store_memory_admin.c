/* SPDX-License-Identifier: MIT */
/* The memory store's operator calls: inspect and list (a walk of every
 * shard, one lock at a time, on the worker pool) and resolve (an unknown
 * key completed with the operator's answer). */
#include "store_memory_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/idemkey.h"
#include "idemproxy/record.h"

/* Whether <e> is a completed entry whose answer expired and whose
 * tombstone has not: a tombstone, though not made small yet (an acquire
 * answers 410 for it already). */
static bool tomb_due(const struct mentry *e, uint64_t now)
{
    return e->state == MSTATE_COMPLETED && e->tomb_ms && now >= e->expires_ms &&
           now - e->expires_ms < e->tomb_ms;
}

static int entry_info(const struct mentry *e, uint64_t now, bool with_body, struct store_info *info)
{
    bool due = tomb_due(e, now);

    *info =
        (struct store_info){ .completed = e->state == MSTATE_COMPLETED || e->state == MSTATE_TOMB,
                             .tombstone = e->state == MSTATE_TOMB || due,
                             .unknown = e->state == MSTATE_UNKNOWN,
                             .cause = e->cause,
                             .probes = e->probes,
                             .last_result = e->last_result,
                             .age_ms = now - e->changed_ms,
                             .ttl_ms = (due ? e->expires_ms + e->tomb_ms : e->expires_ms) - now };
    if (e->state == MSTATE_LOCKED && now < e->lease_until_ms)
        info->lease_ms = e->lease_until_ms - now;
    if (e->about && !(info->about = strdup(e->about)))
        return -ENOMEM;
    fingerprint_hex(e->fp, info->fp_hex);
    info->store_key = strndup(e->key, e->key_len);
    if (e->resource)
        info->resource = strdup(e->resource);
    if (!info->store_key || (e->resource && !info->resource)) {
        store_info_done(info);
        return -ENOMEM;
    }
    if (due) {
        return 0; /* a tombstone: its answer is gone */
    } else if (e->rec && with_body) {
        info->rec = record_ref(e->rec);
    } else if (e->rec) {
        /* The head only: the body is not copied unless asked for. */
        struct buf head = BUF_INIT(SIZE_MAX);
        int err = record_encode_head(e->rec, &head);

        if (err == 0)
            err = record_decode(buf_span(&head), (struct span){ "", 0 }, &info->rec);
        buf_done(&head);
        if (err < 0) {
            store_info_done(info);
            return err;
        }
    }
    return 0;
}

/* Calls <job> back with <list> (dropped when <err>), and ends it. */
static void list_job_end(struct store_memory *st, struct store_admin_job *job, int err,
                         struct store_info_list *list)
{
    if (err < 0)
        store_info_list_done(list);
    job->list_done(job->ctx, err, list);
    store_info_list_done(list);
    store_admin_job_free(job);
    store_calls_end(&st->calls);
}

static void inspect_run(void *arg)
{
    struct store_admin_job *job = arg;
    struct store_memory *st = job->st;
    struct store_info_list list = { 0 };
    struct span prefix = { job->prefix, job->prefix_len }, key = { job->key, job->key_len };
    uint64_t first = 0, unused;
    size_t cap = 0, i;
    int err = 0;

    /* list_unknown: a page is whole shards, from the cursor's, until it holds a page's worth */
    if (job->unknown_only)
        err = store_cursor_parse(job->cursor, &first, &unused);
    for (i = (size_t)first; i < NSHARDS && err == 0; i++) {
        struct shard *sh = &st->shards[i];
        uint64_t now;

        if (job->unknown_only && list.n >= STORE_LIST_PAGE)
            break;
        pthread_mutex_lock(&sh->mu);
        now = now_ms();
        for (size_t b = 0; b < sh->nbuckets && err == 0; b++) {
            for (struct mentry *e = sh->buckets[b]; e && err == 0; e = e->next) {
                struct span k = { e->key, e->key_len };
                struct store_info info;

                if ((now >= e->expires_ms && !tomb_due(e, now)) ||
                    (job->unknown_only
                         ? e->state != MSTATE_UNKNOWN || !idemkey_store_key_is_under(k, prefix)
                         : !idemkey_store_key_matches(k, prefix, key)))
                    continue;
                err = entry_info(e, now, job->with_body, &info);
                if (err == 0 && (err = store_info_list_add(&list, &cap, &info)) < 0)
                    store_info_done(&info);
            }
        }
        pthread_mutex_unlock(&sh->mu);
    }
    if (job->unknown_only && i < NSHARDS)
        snprintf(list.cursor, sizeof(list.cursor), "%zu.0", i);
    list_job_end(st, job, err, &list);
}

int store_memory_inspect(struct store *base, struct span prefix, struct span key, bool with_body,
                         store_list_fn *done, void *ctx)
{
    struct store_memory *st = store_memory_of(base);

    if (!done || key.len == 0)
        return -EINVAL;
    return store_admin_job_submit(
        &st->calls, st->pool, inspect_run,
        &(struct store_admin_job){
            .st = st, .list_done = done, .ctx = ctx, .with_body = with_body },
        prefix, key);
}

/* FIND RESOURCE: the index gives the keys, each is looked up in its shard. */
static void find_run(void *arg)
{
    struct store_admin_job *job = arg;
    struct store_memory *st = job->st;
    struct store_info_list list = { 0 };
    struct span prefix = { job->prefix, job->prefix_len };
    char **keys = NULL;
    size_t n = 0, cap = 0;
    int err = store_memory_resource_keys(st, (struct span){ job->key, job->key_len }, &keys, &n);

    for (size_t i = 0; i < n; i++) {
        struct span k = span_from_cstr(keys[i]);
        uint64_t hash = store_memory_hash(st, k.base, k.len), now;
        struct shard *sh = store_memory_shard_of(st, hash);
        struct mentry *e;
        struct store_info info;

        if (err == 0 && idemkey_store_key_is_under(k, prefix)) {
            pthread_mutex_lock(&sh->mu);
            now = now_ms();
            e = *store_memory_lookup_live(st, sh, hash, k, now);
            if (e && (err = entry_info(e, now, job->with_body, &info)) == 0 &&
                (err = store_info_list_add(&list, &cap, &info)) < 0)
                store_info_done(&info);
            pthread_mutex_unlock(&sh->mu);
        }
        free(keys[i]);
    }
    free(keys);
    list_job_end(st, job, err, &list);
}

int store_memory_find_resource(struct store *base, struct span prefix, struct span resource,
                               bool with_body, store_list_fn *done, void *ctx)
{
    struct store_memory *st = store_memory_of(base);

    if (!done || resource.len == 0 || resource.len > STORE_RESOURCE_MAX)
        return -EINVAL;
    return store_admin_job_submit(
        &st->calls, st->pool, find_run,
        &(struct store_admin_job){
            .st = st, .list_done = done, .ctx = ctx, .with_body = with_body },
        prefix, resource);
}

int store_memory_list_unknown(struct store *base, struct span prefix, const char *cursor,
                              store_list_fn *done, void *ctx)
{
    struct store_memory *st = store_memory_of(base);
    struct store_admin_job job = { .st = st, .list_done = done, .ctx = ctx, .unknown_only = true };
    uint64_t a, b;

    if (!done || store_cursor_parse(cursor, &a, &b) < 0 || a >= NSHARDS ||
        strlen(cursor ? cursor : "") >= sizeof(job.cursor))
        return -EINVAL;
    snprintf(job.cursor, sizeof(job.cursor), "%s", cursor ? cursor : "");
    return store_admin_job_submit(&st->calls, st->pool, inspect_run, &job, prefix,
                                  (struct span){ "", 0 });
}

/* Completes the unknown <e> of <sh> (its lock held) with <*rec> (the
 * reference taken over), kept its own keep or <ttl_ms>. <need> bytes of the
 * budget were reserved for it. */
static void complete_unknown(struct store_memory *st, struct shard *sh, struct mentry *e,
                             struct record **rec, size_t need, uint64_t ttl_ms, uint64_t now)
{
    atomic_fetch_sub_explicit(&st->lock_bytes, e->bytes, memory_order_relaxed);
    free(e->about);
    e->about = NULL;
    e->state = MSTATE_COMPLETED;
    e->rec = *rec;
    *rec = NULL;
    e->bytes += need;
    e->expires_ms = now + (e->keep_ms ? e->keep_ms : ttl_ms);
    e->changed_ms = now;
    e->completed_seq = atomic_fetch_add_explicit(&st->seq, 1, memory_order_relaxed);
    sh->locks--;
    store_memory_link_completed(sh, e);
}

/* RESOLVE: the operator's answer for an unknown key. */
static void resolve_run(void *arg)
{
    struct store_admin_job *job = arg;
    struct store_memory *st = job->st;
    struct span key = { job->key, job->key_len };
    uint64_t hash = store_memory_hash(st, job->key, job->key_len), now;
    struct shard *sh = store_memory_shard_of(st, hash);
    size_t need = record_mem_bytes(job->rec);
    struct store_result res = { .status = STORE_OK };
    struct mentry *e;
    int err = store_memory_budget_reserve(st, need);

    if (err == 0) {
        pthread_mutex_lock(&sh->mu);
        now = now_ms();
        e = *store_memory_lookup_live(st, sh, hash, key, now);
        if (!e) {
            err = -ENOENT;
        } else if (e->state != MSTATE_UNKNOWN) {
            err = -EBUSY;
        } else {
            complete_unknown(st, sh, e, &job->rec, need, job->ttl_ms, now);
            need = 0;
        }
        pthread_mutex_unlock(&sh->mu);
        store_memory_budget_give_back(st, need);
        if (err == 0 && st->notify)
            st->notify(st->notify_ctx, key);
    }
    job->done(job->ctx, err, err == 0 ? &res : NULL);
    store_admin_job_free(job);
    store_calls_end(&st->calls);
}

int store_memory_resolve(struct store *base, struct span store_key, struct record *rec,
                         uint64_t ttl_ms, store_done_fn *done, void *ctx)
{
    struct store_memory *st = store_memory_of(base);
    struct store_admin_job job = { .st = st, .done = done, .ctx = ctx, .ttl_ms = ttl_ms };
    int err;

    if (!done || !rec || ttl_ms == 0 || store_key.len == 0)
        return -EINVAL;
    job.rec = record_ref(rec);
    err = store_admin_job_submit(&st->calls, st->pool, resolve_run, &job, (struct span){ "", 0 },
                                 store_key);
    return err;
}

/* A probe's CLAIM on the unknown <e> (its shard's lock held). */
static void probe_claim(struct mentry *e, const struct store_probe *p, uint64_t now,
                        struct store_result *res)
{
    uint64_t from = e->changed_ms + p->settle_ms;

    if (e->probe_next_ms > from)
        from = e->probe_next_ms;
    if (e->probes >= p->attempts) {
        res->probe = STORE_PROBE_SPENT;
    } else if (now < from) {
        res->probe = STORE_PROBE_LATER;
        res->probe_ms = from - now;
    } else {
        res->probe = STORE_PROBE_CLAIMED;
        res->probe_ms = now;
        res->probes = ++e->probes;
        e->probe_next_ms = now + p->every_ms;
    }
}

/* A probe's ABSENT on the unknown <e> (its shard's lock held): true when it
 * releases the key (the caller removes it). */
static bool probe_absent(struct mentry *e, const struct store_probe *p)
{
    if (e->last_result != STORE_PROBE_WAS_ABSENT) {
        e->last_result = STORE_PROBE_WAS_ABSENT;
        e->absent_ms = p->sent_ms;
        return false;
    }
    if (p->sent_ms >= e->absent_ms + STORE_ABSENT_GAP_MS)
        return true;
    if (p->sent_ms < e->absent_ms) /* answers of two probes that crossed */
        e->absent_ms = p->sent_ms;
    return false;
}

/* PROBE: a step of an unknown key's reconcile (store.h). */
static void probe_run(void *arg)
{
    struct store_admin_job *job = arg;
    struct store_memory *st = job->st;
    struct span key = { job->key, job->key_len };
    uint64_t hash = store_memory_hash(st, job->key, job->key_len), now;
    struct shard *sh = store_memory_shard_of(st, hash);
    const struct store_probe *p = &job->probe;
    size_t need = p->step == STORE_PROBE_FOUND ? record_mem_bytes(job->rec) : 0, freed = 0;
    struct store_result res = { .status = STORE_OK, .probe = STORE_PROBE_NOTED };
    struct mentry **pp, *e;
    int err = store_memory_budget_reserve(st, need);

    if (err == 0) {
        pthread_mutex_lock(&sh->mu);
        now = now_ms();
        pp = store_memory_lookup_live(st, sh, hash, key, now);
        if (!(e = *pp))
            err = -ENOENT;
        else if (e->state != MSTATE_UNKNOWN ||
                 (p->step != STORE_PROBE_CLAIM && p->sent_ms < e->changed_ms))
            res.probe = STORE_PROBE_KNOWN; /* or claimed before it became unknown again */
        else if (p->step == STORE_PROBE_CLAIM)
            probe_claim(e, p, now, &res);
        else if (p->step == STORE_PROBE_FOUND) {
            complete_unknown(st, sh, e, &job->rec, need, job->ttl_ms, now);
            need = 0;
        } else if (p->step == STORE_PROBE_FAILED) {
            e->last_result = STORE_PROBE_WAS_FAILED;
        } else if (probe_absent(e, p)) {
            freed = store_memory_shard_remove(st, sh, pp);
            res.probe = STORE_PROBE_RELEASED;
        }
        pthread_mutex_unlock(&sh->mu);
        store_memory_budget_give_back(st, need + freed);
        if (err == 0 && (p->step == STORE_PROBE_FOUND || res.probe == STORE_PROBE_RELEASED) &&
            res.probe != STORE_PROBE_KNOWN && st->notify)
            st->notify(st->notify_ctx, key);
    }
    job->done(job->ctx, err, err == 0 ? &res : NULL);
    store_admin_job_free(job);
    store_calls_end(&st->calls);
}

int store_memory_probe(struct store *base, struct span store_key, const struct store_probe *p,
                       store_done_fn *done, void *ctx)
{
    struct store_memory *st = store_memory_of(base);
    struct store_admin_job job = { .st = st, .done = done, .ctx = ctx, .probe = *p };

    if (!done || store_key.len == 0 || (p->step == STORE_PROBE_FOUND && !p->rec))
        return -EINVAL;
    job.probe.rec = NULL;
    if (p->step == STORE_PROBE_FOUND) {
        job.rec = record_ref(p->rec);
        job.ttl_ms = p->ttl_ms ? p->ttl_ms : 1;
    }
    return store_admin_job_submit(&st->calls, st->pool, probe_run, &job, (struct span){ "", 0 },
                                  store_key);
}
