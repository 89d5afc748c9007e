/* SPDX-License-Identifier: MIT */
/* What every store shares, above and below its ops table (store.h): the
 * words of a store error and of an unknown key's cause, fencing tokens, the
 * listings /keys reads; and, for the back ends (store_impl.h), the operator
 * calls run on the worker pool and counted until they report back, and the
 * page cursors of the listings. Any thread; nothing here keeps state but the
 * count of calls in flight, under its lock. */
#include "idemproxy/store.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>

#include "idemproxy/record.h"
#include "idemproxy/rng.h"
#include "store_impl.h"

int store_admin_job_submit(struct store_calls *calls, struct worker_pool *pool, worker_fn *fn,
                           const struct store_admin_job *args, struct span prefix, struct span key)
{
    struct store_admin_job *job = malloc(sizeof(*job));
    int err;

    if (!job) {
        record_unref(args->rec); /* taken over in every case */
        return -ENOMEM;
    }
    *job = *args;
    job->prefix = strndup(prefix.base ? prefix.base : "", prefix.len);
    job->key = strndup(key.base ? key.base : "", key.len);
    job->prefix_len = prefix.len;
    job->key_len = key.len;
    err = job->prefix && job->key ? store_calls_submit(calls, pool, fn, job) : -ENOMEM;
    if (err < 0)
        store_admin_job_free(job);
    return err;
}

int store_cursor_parse(const char *cursor, uint64_t *a, uint64_t *b)
{
    char *end;

    *a = *b = 0;
    if (!cursor || !cursor[0])
        return 0;
    if (cursor[0] < '0' || cursor[0] > '9')
        return -EINVAL;
    errno = 0;
    *a = strtoull(cursor, &end, 10);
    if (errno || *end != '.' || end[1] < '0' || end[1] > '9')
        return -EINVAL;
    *b = strtoull(end + 1, &end, 10);
    return errno || *end ? -EINVAL : 0;
}

void store_admin_job_free(struct store_admin_job *job)
{
    if (!job)
        return;
    record_unref(job->rec);
    free(job->prefix);
    free(job->key);
    free(job);
}

static const char *const cause_names[STORE_CAUSE_MAX] = {
    [STORE_CAUSE_UPSTREAM_TIMEOUT] = "upstream_timeout",
    [STORE_CAUSE_UPSTREAM_RESET] = "upstream_reset",
    [STORE_CAUSE_HOLDER_LOST] = "holder_lost",
};

const char *store_cause_name(enum store_cause c)
{
    return c < STORE_CAUSE_MAX ? cause_names[c] : "unknown";
}

const char *store_probe_result_name(enum store_probe_result r)
{
    static const char *const names[] = {
        [STORE_PROBE_NONE] = "",
        [STORE_PROBE_WAS_FOUND] = "found",
        [STORE_PROBE_WAS_ABSENT] = "absent",
        [STORE_PROBE_WAS_FAILED] = "failed",
    };

    return (size_t)r < sizeof(names) / sizeof(names[0]) ? names[r] : "";
}

int store_cause_parse(struct span s, enum store_cause *ret)
{
    for (size_t i = 0; i < STORE_CAUSE_MAX; i++) {
        if (span_eq(s, span_from_cstr(cause_names[i]))) {
            *ret = (enum store_cause)i;
            return 0;
        }
    }
    return -EINVAL;
}

size_t store_about_format(const struct store_about *about, char *out, size_t cap)
{
    const struct span parts[] = { about->route, about->method, about->target };
    size_t len = 0;

    if (cap > STORE_ABOUT_MAX)
        cap = STORE_ABOUT_MAX;
    for (size_t i = 0; i < ARRAY_SIZE(parts) && len + 1 < cap; i++) {
        size_t n = parts[i].len;

        if (i > 0)
            out[len++] = ' ';
        if (n > cap - 1 - len)
            n = cap - 1 - len;
        if (n)
            memcpy(out + len, parts[i].base, n);
        len += n;
    }
    out[len] = '\0';
    return len;
}

const char *store_strerror(int err)
{
    if (err == -ENOSPC)
        return "the memory store has no room: requests in flight hold their share of "
               "--memory-max-bytes";
    if (err == -ENXIO)
        return "the store's host name does not resolve";
    if (err == -EREMOTEIO)
        return "too few Redis replicas confirmed the write in time (--redis-wait-replicas, "
               "--redis-wait-timeout)";
    if (err == -EACCES)
        return "the store refused the proxy's credentials or rights";
    if (err == -EPROTO)
        return "the store answered with an error";
    if (err == -EAGAIN)
        return "the Redis cluster is failing over or moving the key's slot (CLUSTERDOWN, "
               "TRYAGAIN)";
    return strerror(-err);
}

void store_why(struct store *st, int err, char *buf, size_t len)
{
    char last[768] = "";

    if (st && st->ops->last_failure)
        st->ops->last_failure(st, last, sizeof(last));
    if (last[0])
        snprintf(buf, len, "%s (%s)", store_strerror(err), last);
    else
        snprintf(buf, len, "%s", store_strerror(err));
}

int store_token_new(struct store_token *ret)
{
    struct store_token t;
    int err = rng_hex(t.hex, STORE_TOKEN_HEX / 2);

    if (err == 0)
        *ret = t;
    return err;
}

void store_calls_init(struct store_calls *c)
{
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->idle, NULL);
    c->n = 0;
}

int store_calls_submit(struct store_calls *c, struct worker_pool *pool, worker_fn *fn, void *job)
{
    int err;

    pthread_mutex_lock(&c->mu);
    c->n++;
    pthread_mutex_unlock(&c->mu);
    err = worker_submit(pool, fn, job);
    if (err < 0)
        store_calls_end(c);
    return err;
}

void store_calls_end(struct store_calls *c)
{
    pthread_mutex_lock(&c->mu);
    assert(c->n > 0);
    if (--c->n == 0)
        pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->mu);
}

void store_calls_done(struct store_calls *c)
{
    pthread_mutex_lock(&c->mu);
    while (c->n > 0)
        pthread_cond_wait(&c->idle, &c->mu);
    pthread_mutex_unlock(&c->mu);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->mu);
}

bool store_call_is_valid(struct span key, const struct store_token *tok, store_done_fn *done)
{
    return key.base && key.len > 0 && tok && done &&
           strnlen(tok->hex, sizeof(tok->hex)) == STORE_TOKEN_HEX;
}

struct span store_lock_trace(const struct store_lock *lk)
{
    if (lk->trace.len != STORE_TRACE_LEN || !lk->trace.base)
        return (struct span){ .base = NULL, .len = 0 };
    return lk->trace;
}

void store_info_done(struct store_info *info)
{
    free(info->store_key);
    free(info->about);
    free(info->resource);
    free(info->sealed_by);
    free(info->unreadable);
    record_unref(info->rec);
    info->store_key = info->about = info->resource = info->sealed_by = info->unreadable = NULL;
    info->rec = NULL;
}

void store_info_list_done(struct store_info_list *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        store_info_done(&l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = 0;
}

int store_info_list_add(struct store_info_list *l, size_t *cap, const struct store_info *info)
{
    if (l->n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 4;
        struct store_info *items = realloc(l->items, ncap * sizeof(*items));

        if (!items)
            return -ENOMEM;
        l->items = items;
        *cap = ncap;
    }
    l->items[l->n++] = *info;
    return 0;
}
