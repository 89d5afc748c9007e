/* SPDX-License-Identifier: MIT */
/* The sealing store filter (store_seal.h): seals answers on their way into
 * the wrapped store and opens them on their way out. Runs on whatever thread
 * the caller or the wrapped store's callback runs on; the keys are read only. */
#include "idemproxy/store_seal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/log.h"
#include "idemproxy/record.h"
#include "idemproxy/seal.h"
#include "idemproxy/store.h"

struct store_seal {
    struct store base;
    struct store *inner;    /* owned */
    struct seal_keys *keys; /* owned; NULL: answers in clear */
};

static struct store_seal *seal_of(struct store *st) { return (struct store_seal *)(void *)st; }

/* One call whose answer is opened on its way back: the caller's callback,
 * and the store key that a sealed answer is bound to. */
struct opening {
    struct store_seal *s;
    union {
        store_done_fn *done;
        store_list_fn *listed;
    } fn;
    void *ctx;
    bool with_body; /* a listing: whether its caller asked for the bodies */
    size_t key_len;
    char key[]; /* acquire: the store key, NUL-terminated */
};

static struct opening *opening_new(struct store_seal *s, struct span key, void *ctx)
{
    struct opening *o = malloc(sizeof(*o) + key.len + 1);

    if (!o)
        return NULL;
    *o = (struct opening){ .s = s, .ctx = ctx, .key_len = key.len };
    if (key.len)
        memcpy(o->key, key.base, key.len);
    o->key[key.len] = '\0';
    return o;
}

/* Opens the stored answer <rec> of <store_key>. Returns 0 with the answer in
 * clear in <ret> (a reference), or -EBADMSG with why in <why> (and the key
 * id that sealed it in <id>, "" when none), or -ENOMEM. */
static int open_answer(const struct store_seal *s, struct span store_key, struct record *rec,
                       struct record **ret, char *why, size_t why_len, char id[SEAL_ID_MAX + 1])
{
    enum seal_failure failure;
    int err = seal_open(s->keys, store_key, rec, ret, &failure, id);

    if (err == -EBADMSG)
        snprintf(why, why_len, "%s%s%s%s", seal_failure_text(failure), id[0] ? " (key id " : "", id,
                 id[0] ? ")" : "");
    else if (err < 0)
        snprintf(why, why_len, "out of memory");
    return err;
}

static void on_acquired(void *ctx, int err, const struct store_result *res)
{
    struct opening *o = ctx;
    struct store_result opened;
    struct record *rec = NULL;
    char why[160], id[SEAL_ID_MAX + 1];

    if (err < 0 || res->status != STORE_COMPLETED) {
        o->fn.done(o->ctx, err, res);
        free(o);
        return;
    }
    opened = *res; /* the rest as it came: the trace context is an id, not a secret */
    if (open_answer(o->s, (struct span){ o->key, o->key_len }, res->rec, &rec, why, sizeof(why),
                    id) < 0) {
        opened.status = STORE_UNREADABLE;
        opened.rec = NULL;
        opened.unreadable = why;
    } else {
        opened.rec = rec;
    }
    o->fn.done(o->ctx, 0, &opened);
    record_unref(rec);
    free(o);
}

static int seal_acquire(struct store *st, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                        const struct store_token *tok, const struct store_lock *lk,
                        store_done_fn *done, void *ctx)
{
    struct store_seal *s = seal_of(st);
    struct opening *o = opening_new(s, key, ctx);
    int err;

    if (!o)
        return -ENOMEM;
    o->fn.done = done;
    err = store_acquire(s->inner, key, fp, tok, lk, on_acquired, o);
    if (err < 0)
        free(o); /* no callback comes */
    return err;
}

/* The record that stands for <rec> in the store under <key>: <rec> sealed, or
 * (it cannot be sealed) a bare too-large marker of its status, which does not
 * open, so that nothing is stored in clear and nothing runs twice. Returns a
 * new reference, or NULL when out of memory. */
static struct record *sealed_for(const struct store_seal *s, struct span key,
                                 const struct record *rec)
{
    struct record *sealed = NULL;
    int err = seal_record(s->keys, key, rec, &sealed);

    if (err == 0)
        return sealed;
    log_error("key %.*s: cannot seal its answer (%s): a marker without it is stored, and its "
              "duplicates get 503 store_unavailable; it does not run again",
              (int)key.len, key.base, strerror(-err));
    return record_new_too_large(rec->status);
}

static int seal_complete(struct store *st, struct span key, const struct store_token *tok,
                         struct record *rec, uint64_t ttl_ms, const struct store_link *link,
                         store_done_fn *done, void *ctx)
{
    struct store_seal *s = seal_of(st);
    struct record *sealed;
    int err;

    if (!s->keys)
        return store_complete(s->inner, key, tok, rec, ttl_ms, link, done, ctx);
    if (!(sealed = sealed_for(s, key, rec)))
        return -ENOMEM;
    err = store_complete(s->inner, key, tok, sealed, ttl_ms, link, done, ctx);
    record_unref(sealed); /* the store took its own reference */
    return err;
}

static int seal_resolve(struct store *st, struct span store_key, struct record *rec,
                        uint64_t ttl_ms, store_done_fn *done, void *ctx)
{
    struct store_seal *s = seal_of(st);
    struct record *sealed = NULL;
    int err;

    if (!s->keys)
        return store_resolve(s->inner, store_key, rec, ttl_ms, done, ctx);
    /* An operator's answer that cannot be sealed is refused, not replaced. */
    if ((err = seal_record(s->keys, store_key, rec, &sealed)) < 0)
        return err;
    err = store_resolve(s->inner, store_key, sealed, ttl_ms, done, ctx);
    record_unref(sealed);
    return err;
}

static int seal_probe(struct store *st, struct span store_key, const struct store_probe *p,
                      store_done_fn *done, void *ctx)
{
    struct store_seal *s = seal_of(st);
    struct store_probe sealed_p = *p;
    int err;

    if (!s->keys || p->step != STORE_PROBE_FOUND)
        return store_probe(s->inner, store_key, p, done, ctx);
    /* A found answer that cannot be sealed is refused: the key stays unknown. */
    if ((err = seal_record(s->keys, store_key, p->rec, &sealed_p.rec)) < 0)
        return err;
    err = store_probe(s->inner, store_key, &sealed_p, done, ctx);
    record_unref(sealed_p.rec);
    return err;
}

/* Opens the answer of the listed <info> in place: its record in clear, the
 * key id that sealed it, or why it does not open. Returns 0 or -ENOMEM. */
static int open_info(const struct store_seal *s, struct store_info *info, bool with_body)
{
    struct record *rec = NULL;
    char why[160], id[SEAL_ID_MAX + 1];
    int err;

    if (!info->completed || !info->rec)
        return 0;
    err = open_answer(s, span_from_cstr(info->store_key), info->rec, &rec, why, sizeof(why), id);
    record_unref(info->rec);
    info->rec = rec; /* NULL when it does not open */
    if (err < 0 && !(info->unreadable = strdup(why)))
        return -ENOMEM;
    if (id[0] && !(info->sealed_by = strdup(id)))
        return -ENOMEM;
    /* Opened with keys, it is a record of its own: the body goes unless asked
     * for, as the listing promises. */
    if (rec && s->keys && !with_body)
        buf_done(&rec->body);
    return 0;
}

static void on_listed(void *ctx, int err, struct store_info_list *list)
{
    struct opening *o = ctx;

    for (size_t i = 0; err == 0 && i < list->n; i++)
        err = open_info(o->s, &list->items[i], o->with_body);
    if (err < 0)
        store_info_list_done(list);
    o->fn.listed(o->ctx, err, list);
    free(o);
}

/* Starts a listing of <inner> through <start>, whose answers are opened
 * before <done> gets them. A sealed answer's status is inside it: with
 * keys, the whole record is read whatever <with_body> asks. */
static int seal_listing(struct store *st, struct span prefix, struct span what, bool with_body,
                        int (*start)(struct store *, struct span, struct span, bool,
                                     store_list_fn *, void *),
                        store_list_fn *done, void *ctx)
{
    struct store_seal *s = seal_of(st);
    struct opening *o = opening_new(s, (struct span){ "", 0 }, ctx);
    int err;

    if (!o)
        return -ENOMEM;
    o->fn.listed = done;
    o->with_body = with_body;
    err = start(s->inner, prefix, what, with_body || s->keys, on_listed, o);
    if (err < 0)
        free(o);
    return err;
}

static int seal_inspect(struct store *st, struct span prefix, struct span key, bool with_body,
                        store_list_fn *done, void *ctx)
{
    return seal_listing(st, prefix, key, with_body, store_inspect, done, ctx);
}

static int seal_find_resource(struct store *st, struct span prefix, struct span resource,
                              bool with_body, store_list_fn *done, void *ctx)
{
    return seal_listing(st, prefix, resource, with_body, store_find_resource, done, ctx);
}

/* ---- what passes through ---- */

static int seal_release(struct store *st, struct span key, const struct store_token *tok,
                        store_done_fn *done, void *ctx)
{
    return store_release(seal_of(st)->inner, key, tok, done, ctx);
}

static int seal_unknown(struct store *st, struct span key, const struct store_token *tok,
                        enum store_cause cause, const struct store_about *about, uint64_t keep_ms,
                        store_done_fn *done, void *ctx)
{
    return store_unknown(seal_of(st)->inner, key, tok, cause, about, keep_ms, done, ctx);
}

static int seal_extend(struct store *st, struct span key, const struct store_token *tok,
                       uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    return store_extend(seal_of(st)->inner, key, tok, lock_ttl_ms, done, ctx);
}

static int seal_purge(struct store *st, struct span store_key, size_t prefix_len,
                      store_done_fn *done, void *ctx)
{
    return store_purge(seal_of(st)->inner, store_key, prefix_len, done, ctx);
}

static int seal_list_unknown(struct store *st, struct span prefix, const char *cursor,
                             store_list_fn *done, void *ctx)
{
    return store_list_unknown(seal_of(st)->inner, prefix, cursor, done, ctx); /* no answers */
}

static int seal_set_notify(struct store *st, store_notify_fn *fn, void *ctx)
{
    return store_set_notify(seal_of(st)->inner, fn, ctx);
}

static bool seal_is_ready(struct store *st) { return store_is_ready(seal_of(st)->inner); }

static void seal_last_failure(struct store *st, char *buf, size_t len)
{
    struct store *inner = seal_of(st)->inner;

    if (inner->ops->last_failure)
        inner->ops->last_failure(inner, buf, len);
    else if (len)
        buf[0] = '\0';
}

static int seal_metrics(struct store *st, store_metric_fn *emit, void *ctx)
{
    return store_metrics(seal_of(st)->inner, emit, ctx);
}

static void seal_free(struct store *st)
{
    struct store_seal *s = seal_of(st);

    store_free(s->inner);
    seal_keys_free(s->keys);
    free(s);
}

static const struct store_ops seal_ops = {
    .name = "seal",
    .acquire = seal_acquire,
    .complete = seal_complete,
    .release = seal_release,
    .unknown = seal_unknown,
    .extend = seal_extend,
    .inspect = seal_inspect,
    .find_resource = seal_find_resource,
    .purge = seal_purge,
    .list_unknown = seal_list_unknown,
    .resolve = seal_resolve,
    .probe = seal_probe,
    .set_notify = seal_set_notify,
    .is_ready = seal_is_ready,
    .last_failure = seal_last_failure,
    .metrics = seal_metrics,
    .free = seal_free,
};

int store_seal_new(struct store *inner, struct seal_keys *keys, struct store **ret)
{
    struct store_seal *s = calloc(1, sizeof(*s));

    if (!s) {
        store_free(inner);
        seal_keys_free(keys);
        return -ENOMEM;
    }
    s->base.ops = &seal_ops;
    s->inner = inner;
    s->keys = keys;
    *ret = &s->base;
    return 0;
}
