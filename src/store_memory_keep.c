/* SPDX-License-Identifier: MIT */
/* What a completed entry of the memory store keeps beside its answer: the
 * resource index (doc/configuration.md, Resource links) and its tombstone
 * (doc/configuration.md, Tombstones), the entry itself made small once its
 * answer expires. Shared through store_memory_impl.h. */
#include <stdlib.h>
#include <string.h>

#include "idemproxy/list.h"
#include "idemproxy/record.h"
#include "store_memory_impl.h"

/* ---- the resource index (its entries' shard lock held) ---- */

static struct mentry **res_bucket(struct store_memory *st, const char *resource)
{
    return &st->res_buckets[store_memory_hash(st, resource, strlen(resource)) &
                            (st->res_nbuckets - 1)];
}

/* Doubles the index past one entry per bucket; failing to grow only makes
 * chains longer. */
static void res_maybe_grow(struct store_memory *st)
{
    size_t n = st->res_nbuckets * 2;
    struct mentry **old = st->res_buckets, **nb;

    if (st->res_count <= st->res_nbuckets || !(nb = calloc(n, sizeof(*nb))))
        return;
    st->res_buckets = nb;
    st->res_nbuckets = n;
    for (size_t b = 0; b < n / 2; b++) {
        while (old[b]) {
            struct mentry *e = old[b], **to = res_bucket(st, e->resource);

            old[b] = e->res_next;
            e->res_next = *to;
            *to = e;
        }
    }
    free(old);
}

void store_memory_res_add(struct store_memory *st, struct mentry *e)
{
    struct mentry **b;

    pthread_mutex_lock(&st->res_mu);
    b = res_bucket(st, e->resource);
    e->res_next = *b;
    *b = e;
    st->res_count++;
    res_maybe_grow(st);
    pthread_mutex_unlock(&st->res_mu);
}

void store_memory_res_remove(struct store_memory *st, struct mentry *e)
{
    struct mentry **pp;

    pthread_mutex_lock(&st->res_mu);
    for (pp = res_bucket(st, e->resource); *pp && *pp != e; pp = &(*pp)->res_next)
        ;
    if (*pp) {
        *pp = e->res_next;
        st->res_count--;
    }
    pthread_mutex_unlock(&st->res_mu);
}

int store_memory_resource_keys(struct store_memory *st, struct span resource, char ***ret,
                               size_t *ret_n)
{
    char **keys = NULL, *r = strndup(resource.base, resource.len);
    size_t n = 0, cap = 0;
    uint64_t now = now_ms();
    int err = r ? 0 : -ENOMEM;

    pthread_mutex_lock(&st->res_mu);
    for (struct mentry *e = r ? *res_bucket(st, r) : NULL; e && err == 0; e = e->res_next) {
        if (strcmp(e->resource, r) != 0 || now >= e->expires_ms)
            continue;
        if (n == cap) {
            char **more = realloc(keys, (cap = cap ? cap * 2 : 4) * sizeof(*keys));

            if (!more) {
                err = -ENOMEM;
                break;
            }
            keys = more;
        }
        if (!(keys[n] = strndup(e->key, e->key_len)))
            err = -ENOMEM;
        else
            n++;
    }
    pthread_mutex_unlock(&st->res_mu);
    free(r);
    if (err < 0) {
        while (n)
            free(keys[--n]);
        free(keys);
        return err;
    }
    *ret = keys;
    *ret_n = n;
    return 0;
}

/* ---- tombstones (the entry's shard lock held) ---- */

static void update_oldest_tomb(struct shard *sh)
{
    struct list_node *n = list_first(&sh->tombs);

    atomic_store_explicit(&sh->oldest_tomb,
                          n ? list_entry(n, struct mentry, completed)->completed_seq : NO_COMPLETED,
                          memory_order_relaxed);
}

size_t store_memory_tomb_make(struct store_memory *st, struct shard *sh, struct mentry *e)
{
    /* The trace context's room stays: it is part of the entry's allocation. */
    size_t bytes = store_memory_entry_bytes(e->key_len) + e->trace_room, freed = e->bytes - bytes;

    store_memory_unlink_completed(sh, e);
    if (e->resource)
        store_memory_res_remove(st, e);
    free(e->resource);
    e->resource = NULL;
    record_unref(e->rec);
    e->rec = NULL;
    e->state = MSTATE_TOMB;
    e->expires_ms += e->tomb_ms;
    e->bytes = bytes;
    /* In the order they became tombstones: the eviction's. */
    e->completed_seq = atomic_fetch_add_explicit(&st->seq, 1, memory_order_relaxed);
    list_append(&sh->tombs, &e->completed);
    update_oldest_tomb(sh);
    return freed;
}

void store_memory_tomb_unlink(struct shard *sh, struct mentry *e)
{
    list_remove(&e->completed);
    update_oldest_tomb(sh);
}

struct mentry *store_memory_tomb_oldest(const struct shard *sh)
{
    struct list_node *n = list_first(&sh->tombs);

    return n ? list_entry(n, struct mentry, completed) : NULL;
}
