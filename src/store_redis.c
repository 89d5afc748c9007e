/* SPDX-License-Identifier: MIT */
/* The Redis store (store_redis.h): its operations, each one embedded Lua
 * script (EVALSHA, EVAL on NOSCRIPT) run as an op on the calling loop's own
 * connection (store_redis_link.c), readiness (a PING of each master every
 * second, which also looks host names up again), metrics, and the store's
 * life. Where an op goes is store_redis_topology.c's; what they share is
 * store_redis_impl.h. No thread waits on Redis. */
#include "idemproxy/store_redis.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/buf.h"
#include "idemproxy/idemkey.h"
#include "idemproxy/list.h"
#include "idemproxy/record.h"
#include "idemproxy/redis_sentinel.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/worker.h"
#include "lua_scripts.h"
#include "store_redis_impl.h"

#define PING_INTERVAL_MS 1000
#define REFRESH_IDLE_MS 10000 /* and every 10 s when nothing asked for one */

/* The token of an operator's or a probe's call, which holds no lock. */
static const struct store_token no_token = { .hex = "00000000000000000000000000000000" };

/* probe.lua's ARGV[1], by step. */
static const char *const probe_steps[] = { [STORE_PROBE_CLAIM] = "claim",
                                           [STORE_PROBE_FOUND] = "found",
                                           [STORE_PROBE_ABSENT] = "absent",
                                           [STORE_PROBE_FAILED] = "failed" };

/* probe.lua releases a key on the second absent of a run this far apart: it says 1000. */
_Static_assert(STORE_ABSENT_GAP_MS == 1000, "lua/probe.lua holds STORE_ABSENT_GAP_MS");

struct store_redis *store_redis_of(struct store *st) { return (struct store_redis *)st; }

/* Puts <about> into the op's <head>, as the scripts keep it: written in
 * place, one allocation. */
static int op_set_about(struct op *op, const struct store_about *about)
{
    size_t n = about->route.len + about->method.len + about->target.len + 3;

    if (n > STORE_ABOUT_MAX)
        n = STORE_ABOUT_MAX;
    if (buf_reserve(&op->head, n) < 0)
        return -ENOMEM;
    op->head.len = store_about_format(about, op->head.data, n);
    return 0;
}

/* Writes <v> in decimal into <out> (21 bytes at least), NUL-terminated;
 * returns its length. On every op's path: snprintf() costs several times more. */
static size_t u64_text(uint64_t v, char *out)
{
    char tmp[20];
    size_t n = 0;

    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = '\0';
    return n;
}

/* The probe script's arguments after its key, from argv[<argc>] on: the
 * step, then the record (found) or the numbers made into text when it was
 * submitted (claim, absent). Returns the new count. */
static int probe_args(const struct op *op, const char **argv, size_t *lens, int argc, char *ttl,
                      char *keep)
{
    const char *p = op->head.data;

    argv[argc] = probe_steps[op->step];
    lens[argc] = strlen(argv[argc]);
    argc++;
    if (op->step == STORE_PROBE_FOUND) {
        argv[argc] = op->head.data;
        lens[argc++] = op->head.len;
        argv[argc] = op->rec->body.data ? op->rec->body.data : "";
        lens[argc++] = op->rec->body.len;
        lens[argc] = u64_text(op->ttl_ms, ttl);
        argv[argc++] = ttl;
        lens[argc] = u64_text(op->keep_ms, keep); /* the claim's time */
        argv[argc++] = keep;
        return argc;
    }
    for (int i = 0; i < op->argc; i++) {
        argv[argc] = p;
        lens[argc++] = op->arglen[i];
        p += op->arglen[i];
    }
    return argc;
}

/* The arguments of <op>'s script after its key, from argv[<argc>] on: its
 * token, what it writes, its TTL (<ttl> and <keep> hold the numbers as
 * text). Returns the new count. */
static int script_args(const struct op *op, const char **argv, size_t *lens, int argc, char *ttl,
                       char *keep)
{
    switch (op->script) {
    case LUA_ACQUIRE:
        argv[argc] = op->fp;
        lens[argc++] = FINGERPRINT_HEX;
        argv[argc] = op->tok.hex;
        lens[argc++] = STORE_TOKEN_HEX;
        lens[argc] = u64_text(op->ttl_ms, ttl);
        argv[argc++] = ttl;
        lens[argc] = u64_text(op->keep_ms, keep);
        argv[argc++] = keep;
        argv[argc] = op->take_over ? "1" : "0";
        lens[argc++] = 1;
        argv[argc] = op->head.data ? op->head.data : "";
        lens[argc++] = op->head.len;
        argv[argc] = op->probe ? "1" : "0";
        lens[argc++] = 1;
        argv[argc] = op->trace; /* "": none */
        lens[argc++] = op->trace_len;
        return argc;
    case LUA_UNKNOWN:
        argv[argc] = op->tok.hex;
        lens[argc++] = STORE_TOKEN_HEX;
        argv[argc] = store_cause_name(op->cause);
        lens[argc] = strlen(argv[argc]);
        argc++;
        argv[argc] = op->head.data ? op->head.data : "";
        lens[argc++] = op->head.len;
        break;
    case LUA_RESOLVE:
        argv[argc] = op->head.data;
        lens[argc++] = op->head.len;
        argv[argc] = op->rec->body.data ? op->rec->body.data : "";
        lens[argc++] = op->rec->body.len;
        break;
    case LUA_COMPLETE:
        argv[argc] = op->tok.hex;
        lens[argc++] = STORE_TOKEN_HEX;
        argv[argc] = op->head.data;
        lens[argc++] = op->head.len;
        argv[argc] = op->rec->body.data ? op->rec->body.data : "";
        lens[argc++] = op->rec->body.len;
        lens[argc] = u64_text(op->ttl_ms, ttl);
        argv[argc++] = ttl;
        argv[argc] = op->resource ? op->resource : ""; /* "": no resource link */
        lens[argc++] = op->resource_len;
        if (op->tomb) { /* KEYS[2]: its tombstone, with the fingerprint */
            argv[argc] = (const char *)op->tomb_fp;
            lens[argc++] = FINGERPRINT_LEN;
            lens[argc] = u64_text(op->tomb_ttl_ms, keep);
            argv[argc++] = keep;
        }
        return argc;
    case LUA_INSPECT:
        argv[argc] = op->fp; /* "1": with the body, "0": without */
        lens[argc++] = 1;
        return argc;
    case LUA_PROBE:
        return probe_args(op, argv, lens, argc, ttl, keep);
    default: /* LUA_RELEASE, LUA_EXTEND */
        argv[argc] = op->tok.hex;
        lens[argc++] = STORE_TOKEN_HEX;
        if (op->script == LUA_RELEASE)
            return argc;
        break;
    }
    lens[argc] = u64_text(op->ttl_ms, ttl);
    argv[argc++] = ttl;
    return argc;
}

int store_redis_op_args(const struct op *op, const char **argv, size_t *lens, char *ttl, char *keep)
{
    const struct lua_script *s = &lua_scripts[op->script < _LUA_MAX ? op->script : 0];
    int argc = 0;

    if (op->script == OP_PING) {
        argv[0] = "PING";
        lens[0] = 4;
        return 1;
    }
    if (op->script == OP_RAW) {
        const char *p = op->head.data;

        for (; argc < op->argc; argc++) {
            argv[argc] = p;
            lens[argc] = op->arglen[argc];
            p += op->arglen[argc];
        }
        return argc;
    }
    argv[argc] = op->eval ? "EVAL" : "EVALSHA";
    lens[argc++] = op->eval ? 4 : 7;
    argv[argc] = op->eval ? s->src : s->sha1;
    lens[argc++] = op->eval ? s->len : strlen(s->sha1);
    argv[argc] = op->tomb ? "2" : "1"; /* the key, and an acquire's tombstone */
    lens[argc++] = 1;
    argv[argc] = op->key;
    lens[argc++] = op->key_len;
    if (op->tomb) {
        argv[argc] = op->tomb;
        lens[argc++] = op->tomb_len;
    }
    return script_args(op, argv, lens, argc, ttl, keep);
}

/* An acquire that looks for a tombstone (doc/configuration.md, Tombstones):
 * the script probes (a known key answers at once), then where there is no
 * record EXISTS <tombstone> (a key of its own, maybe in another slot), then
 * the script again, which locks. Nothing is locked over a tombstone. */
struct probe {
    struct store_redis *st;
    struct store_token tok;
    char fp[FINGERPRINT_HEX + 1];
    uint64_t lease_ms, keep_ms;
    bool take_over;
    store_done_fn *done;
    void *ctx;
    char *tomb;     /* owned: the tombstone's key */
    bool tomb_seen; /* EXISTS found it: probed again, as its record may have come meanwhile */
    char trace[STORE_TRACE_LEN]; /* the lock's trace context, <trace_len> bytes (0: none) */
    size_t trace_len;
    size_t key_len, about_len;
    char bytes[]; /* the store key, then the about text */
};

/* Submits the acquire script for <p>'s key, probing or not. */
static int probe_submit(struct probe *p, bool probe, store_done_fn *done, void *ctx)
{
    struct op *op;
    int err = store_redis_op_new(p->st, LUA_ACQUIRE, (struct span){ p->bytes, p->key_len }, &p->tok,
                                 done, ctx, &op);

    if (err < 0)
        return err;
    memcpy(op->fp, p->fp, sizeof(op->fp));
    op->ttl_ms = p->lease_ms;
    op->keep_ms = p->keep_ms;
    op->take_over = p->take_over;
    op->probe = probe;
    memcpy(op->trace, p->trace, p->trace_len);
    op->trace_len = p->trace_len;
    if (buf_append(&op->head, p->bytes + p->key_len, p->about_len) < 0) {
        store_redis_op_free(op);
        return -ENOMEM;
    }
    return store_redis_op_submit(op);
}

static void probe_free(struct probe *p)
{
    free(p->tomb);
    free(p);
}

static void on_probed(void *ctx, int err, const struct store_result *res);

static void on_tomb_exists(void *ctx, int err, const redisReply *r)
{
    struct probe *p = ctx;

    if (err == 0 && (!r || r->type != REDIS_REPLY_INTEGER))
        err = -EPROTO;
    if (err == 0 && r->integer == 0) { /* no tombstone: lock it */
        err = probe_submit(p, false, p->done, p->ctx);
    } else if (err == 0) {
        /* A tombstone is written when its record completes: a request racing
         * this one may have just done so. Probed again: a record there now
         * answers as itself; none, and its tombstone is that of an expired
         * record (a purge deletes both). */
        p->tomb_seen = true;
        err = probe_submit(p, true, on_probed, p);
        if (err == 0)
            return;
    }
    if (err < 0)
        p->done(p->ctx, err, NULL);
    probe_free(p);
}

static void on_probed(void *ctx, int err, const struct store_result *res)
{
    struct probe *p = ctx;
    const char *argv[] = { "EXISTS", p->tomb };
    size_t lens[] = { 6, strlen(p->tomb) };

    if (err < 0 || res->status != STORE_EXPIRED || p->tomb_seen) {
        /* a known key, a failure, or (probed again) no record beside a tombstone */
        p->done(p->ctx, err, res);
        probe_free(p);
        return;
    }
    /* "absent": no record */
    err = store_redis_raw(p->st, OP_RAW, NODE_BY_SLOT, 2, argv, lens, on_tomb_exists, p);
    if (err < 0) {
        p->done(p->ctx, err, NULL);
        probe_free(p);
    }
}

/* The acquire script in one call, with <tomb> (taken over; NULL: none) as
 * its second key. */
static int acquire_one_call(struct store *base, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                            const struct store_token *tok, const struct store_lock *lk, char *tomb,
                            store_done_fn *done, void *ctx)
{
    struct span trace = store_lock_trace(lk);
    struct op *op;
    int err = store_redis_op_new(store_redis_of(base), LUA_ACQUIRE, key, tok, done, ctx, &op);

    if (err < 0) {
        free(tomb);
        return err;
    }
    fingerprint_hex(fp, op->fp);
    op->ttl_ms = lk->lease_ms;
    op->keep_ms = lk->keep_ms;
    op->take_over = lk->take_over;
    op->tomb = tomb;
    op->tomb_len = tomb ? strlen(tomb) : 0;
    op->trace_len = trace.len;
    if (trace.len)
        memcpy(op->trace, trace.base, trace.len);
    if (op_set_about(op, &lk->about) < 0) {
        store_redis_op_free(op);
        return -ENOMEM;
    }
    return store_redis_op_submit(op);
}

static int redis_acquire(struct store *base, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                         const struct store_token *tok, const struct store_lock *lk,
                         store_done_fn *done, void *ctx)
{
    char about[STORE_ABOUT_MAX], *tomb = NULL;
    struct span trace;
    struct probe *p;
    size_t n;
    int err;

    if (!fp || !lk || lk->lease_ms == 0 || lk->keep_ms == 0 || !tok || !done)
        return -EINVAL;
    /* A store key a tombstone's key cannot be made from has none. */
    if (lk->tombstones && (err = idemkey_tomb_key(key, lk->prefix_len, &tomb)) == -ENOMEM)
        return err;
    /* No tombstone to look for, or one server, where the script looks for it
     * itself (KEYS[2]): one call. A cluster (or a mode not known yet) may
     * keep it in another slot: a probe, EXISTS, then the lock. */
    if (!tomb ||
        atomic_load_explicit(&store_redis_of(base)->mode, memory_order_relaxed) == MODE_SINGLE)
        return acquire_one_call(base, key, fp, tok, lk, tomb, done, ctx);
    n = store_about_format(&lk->about, about, sizeof(about));
    trace = store_lock_trace(lk);
    p = malloc(sizeof(*p) + key.len + n);
    if (!p) {
        free(tomb);
        return -ENOMEM;
    }
    *p = (struct probe){ .st = store_redis_of(base),
                         .tok = *tok,
                         .lease_ms = lk->lease_ms,
                         .keep_ms = lk->keep_ms,
                         .take_over = lk->take_over,
                         .done = done,
                         .ctx = ctx,
                         .tomb = tomb,
                         .key_len = key.len,
                         .about_len = n };
    fingerprint_hex(fp, p->fp);
    memcpy(p->bytes, key.base, key.len);
    memcpy(p->bytes + key.len, about, n);
    p->trace_len = trace.len;
    if (trace.len)
        memcpy(p->trace, trace.base, trace.len);
    err = probe_submit(p, true, on_probed, p);
    if (err < 0)
        probe_free(p);
    return err;
}

static int redis_unknown(struct store *base, struct span key, const struct store_token *tok,
                         enum store_cause cause, const struct store_about *about, uint64_t keep_ms,
                         store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    if (!about || keep_ms == 0 || cause >= STORE_CAUSE_MAX)
        return -EINVAL;
    err = store_redis_op_new(store_redis_of(base), LUA_UNKNOWN, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    op->cause = cause;
    op->ttl_ms = keep_ms;
    if (op_set_about(op, about) < 0) {
        store_redis_op_free(op);
        return -ENOMEM;
    }
    return store_redis_op_submit(op);
}

/* Submits <script> (complete, resolve) storing <rec> as <key>'s answer,
 * with the id of the resource it created (NULL: none). */
/* The op of <script> storing <rec> (complete, resolve), not submitted yet.
 * Returns 0 with it in <ret>, or a negative errno. */
static int record_op(struct store *base, enum lua_script_id script, struct span key,
                     const struct store_token *tok, struct record *rec, uint64_t ttl_ms,
                     const struct span *resource, store_done_fn *done, void *ctx, struct op **ret)
{
    struct op *op;
    int err;

    if (!rec || ttl_ms == 0)
        return -EINVAL;
    err = store_redis_op_new(store_redis_of(base), script, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    if (resource && !(op->resource = strndup(resource->base, resource->len))) {
        store_redis_op_free(op);
        return -ENOMEM;
    }
    op->resource_len = resource ? resource->len : 0;
    /* Encoded here so that a record that cannot be stored is refused at once. */
    err = record_encode_head(rec, &op->head);
    if (err < 0) {
        store_redis_op_free(op);
        return err;
    }
    op->rec = record_ref(rec);
    op->ttl_ms = ttl_ms;
    *ret = op;
    return 0;
}

static int submit_record(struct store *base, enum lua_script_id script, struct span key,
                         const struct store_token *tok, struct record *rec, uint64_t ttl_ms,
                         const struct span *resource, store_done_fn *done, void *ctx)
{
    struct op *op;
    int err = record_op(base, script, key, tok, rec, ttl_ms, resource, done, ctx, &op);

    return err < 0 ? err : store_redis_op_submit(op);
}

/* A complete on one server (or the master Sentinel names) whose tombstone
 * the script writes itself: KEYS[2], in the same call (doc/configuration.md,
 * Tombstones). Takes <tomb> over. */
static int complete_with_tomb(struct store *base, struct span key, const struct store_token *tok,
                              struct record *rec, uint64_t ttl_ms, const struct store_link *link,
                              char *tomb, store_done_fn *done, void *ctx)
{
    struct op *op;
    int err = record_op(base, LUA_COMPLETE, key, tok, rec, ttl_ms, NULL, done, ctx, &op);

    if (err < 0) {
        free(tomb);
        return err;
    }
    op->tomb = tomb;
    op->tomb_len = strlen(tomb);
    memcpy(op->tomb_fp, link->fp, FINGERPRINT_LEN);
    op->tomb_ttl_ms = ttl_ms + link->tomb_ms;
    return store_redis_op_submit(op);
}

/* A complete with a resource link or a tombstone: the script, then the
 * link's own key, SET <link> <store key> PX <ttl>, then the tombstone's,
 * SET <tomb> <fingerprint, 32 bytes> PX <ttl + tombstone TTL> (in a cluster
 * each is in a slot of its own, which no script may span). A failed SET
 * fails the complete, whose retry (its script finds its own answer) writes
 * them again. */
struct link_write {
    struct store_redis *st;
    store_done_fn *done;
    void *ctx;
    char ttl[24], tomb_ttl[24];
    bool linked; /* the link was written */
    uint8_t fp[FINGERPRINT_LEN];
    size_t key_len, link_len, tomb_len;
    char bytes[]; /* the link key, the store key, then the tombstone's key */
};

static void on_link_set(void *ctx, int err, const redisReply *r);

/* Writes what is left of <w>: the link, then the tombstone. Returns 1 when
 * a SET went, 0 when none is left, or a negative errno. */
static int link_write_next(struct link_write *w)
{
    const char *link = w->bytes, *key = w->bytes + w->link_len, *tomb = key + w->key_len;
    const char *argv[] = { "SET", link, key, "PX", w->ttl };
    size_t lens[] = { 3, w->link_len, w->key_len, 2, strlen(w->ttl) };

    if (w->link_len && !w->linked) {
        w->linked = true;
    } else if (w->tomb_len) {
        argv[1] = tomb;
        lens[1] = w->tomb_len;
        argv[2] = (const char *)w->fp;
        lens[2] = FINGERPRINT_LEN;
        argv[4] = w->tomb_ttl;
        lens[4] = strlen(w->tomb_ttl);
        w->tomb_len = 0; /* written with this one */
    } else {
        return 0;
    }
    int err = store_redis_raw(w->st, OP_RAW, NODE_BY_SLOT, 5, argv, lens, on_link_set, w);

    return err < 0 ? err : 1;
}

static void link_write_end(struct link_write *w, int err)
{
    struct store_result res = { .status = STORE_OK };

    if (err == 0 && (err = link_write_next(w)) > 0)
        return;
    w->done(w->ctx, err, err == 0 ? &res : NULL);
    free(w);
}

static void on_link_set(void *ctx, int err, const redisReply *r)
{
    if (err == 0 && (!r || r->type != REDIS_REPLY_STATUS))
        err = -EPROTO;
    link_write_end(ctx, err);
}

static void on_completed(void *ctx, int err, const struct store_result *res)
{
    (void)res; /* STORE_OK: the answer is stored */
    link_write_end(ctx, err);
}

static int redis_complete(struct store *base, struct span key, const struct store_token *tok,
                          struct record *rec, uint64_t ttl_ms, const struct store_link *link,
                          store_done_fn *done, void *ctx)
{
    struct link_write *w;
    char *link_key = NULL, *tomb_key = NULL;
    size_t link_len, tomb_len;
    int err = 0;

    if (!link)
        return submit_record(base, LUA_COMPLETE, key, tok, rec, ttl_ms, NULL, done, ctx);
    if (link->resource.len > STORE_RESOURCE_MAX || !done)
        return -EINVAL;
    /* The link is a key of its own beside the record's: <prefix>r:<scope>:<resource>,
     * and so is the tombstone: <prefix>t:<scope>:<key>. A store key they
     * cannot be made from is stored without them: the answer is what matters. */
    if (link->resource.len)
        err = idemkey_link_key(key, link->prefix_len, link->resource, &link_key);
    if (err != -ENOMEM && link->tomb_ms)
        err = idemkey_tomb_key(key, link->prefix_len, &tomb_key);
    if (err == -ENOMEM) {
        free(link_key);
        return err;
    }
    if (!link_key && !tomb_key)
        return submit_record(base, LUA_COMPLETE, key, tok, rec, ttl_ms, NULL, done, ctx);
    if (!link_key &&
        atomic_load_explicit(&store_redis_of(base)->mode, memory_order_relaxed) == MODE_SINGLE)
        return complete_with_tomb(base, key, tok, rec, ttl_ms, link, tomb_key, done, ctx);
    link_len = link_key ? strlen(link_key) : 0;
    tomb_len = tomb_key ? strlen(tomb_key) : 0;
    w = malloc(sizeof(*w) + link_len + key.len + tomb_len);
    if (w) {
        *w = (struct link_write){ .st = store_redis_of(base),
                                  .done = done,
                                  .ctx = ctx,
                                  .key_len = key.len,
                                  .link_len = link_len,
                                  .tomb_len = tomb_len };
        u64_text(ttl_ms, w->ttl);
        u64_text(ttl_ms + link->tomb_ms, w->tomb_ttl);
        memcpy(w->fp, link->fp, FINGERPRINT_LEN);
        if (link_len)
            memcpy(w->bytes, link_key, link_len);
        memcpy(w->bytes + link_len, key.base, key.len);
        if (tomb_len)
            memcpy(w->bytes + link_len + key.len, tomb_key, tomb_len);
    }
    free(link_key);
    free(tomb_key);
    if (!w)
        return -ENOMEM;
    err = submit_record(base, LUA_COMPLETE, key, tok, rec, ttl_ms,
                        link_len ? &link->resource : NULL, on_completed, w);
    if (err < 0)
        free(w);
    return err;
}

static int redis_resolve(struct store *base, struct span store_key, struct record *rec,
                         uint64_t ttl_ms, store_done_fn *done, void *ctx)
{
    return submit_record(base, LUA_RESOLVE, store_key, &no_token, rec, ttl_ms, NULL, done, ctx);
}

static bool reply_is_word(const redisReply *r, const char *s)
{
    size_t n = strlen(s);

    return (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) && r->len == n &&
           memcmp(r->str, s, n) == 0;
}

int store_redis_parse_probe(const redisReply *r, struct store_result *res)
{
    static const struct {
        const char *word;
        enum store_probe_answer answer;
    } words[] = { { "known", STORE_PROBE_KNOWN },
                  { "noted", STORE_PROBE_NOTED },
                  { "spent", STORE_PROBE_SPENT },
                  { "released", STORE_PROBE_RELEASED } };
    redisReply **el = r->element;

    if (reply_is_word(r, "gone"))
        return -ENOENT;
    res->status = STORE_OK;
    for (size_t i = 0; i < ARRAY_SIZE(words); i++) {
        if (reply_is_word(r, words[i].word)) {
            res->probe = words[i].answer;
            return 0;
        }
    }
    /* {"later", ms to wait} or {"claimed", Redis time in ms, probes} */
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || el[1]->type != REDIS_REPLY_INTEGER ||
        el[1]->integer < 0)
        return -EPROTO;
    res->probe_ms = (uint64_t)el[1]->integer;
    if (r->elements == 2 && reply_is_word(el[0], "later")) {
        res->probe = STORE_PROBE_LATER;
        return 0;
    }
    if (r->elements != 3 || !reply_is_word(el[0], "claimed") ||
        el[2]->type != REDIS_REPLY_INTEGER || el[2]->integer < 1 || el[2]->integer > UINT_MAX)
        return -EPROTO;
    res->probe = STORE_PROBE_CLAIMED;
    res->probes = (unsigned)el[2]->integer;
    return 0;
}

/* PROBE (store.h): probe.lua, on the key's slot like every op. A found
 * step carries its record as resolve's; the numbers of a claim or an
 * absent are made into text once, here (<head>, <arglen>). */
static int redis_probe(struct store *base, struct span store_key, const struct store_probe *p,
                       store_done_fn *done, void *ctx)
{
    uint64_t nums[3] = { 0 };
    struct op *op;
    int n = 0, err;

    if (!p || p->step > STORE_PROBE_FAILED)
        return -EINVAL;
    if (p->step == STORE_PROBE_FOUND)
        err = record_op(base, LUA_PROBE, store_key, &no_token, p->rec, p->ttl_ms ? p->ttl_ms : 1,
                        NULL, done, ctx, &op);
    else
        err = store_redis_op_new(store_redis_of(base), LUA_PROBE, store_key, &no_token, done, ctx,
                                 &op);
    if (err < 0)
        return err;
    op->step = p->step;
    op->keep_ms = p->sent_ms; /* found: the claim's time (probe_args()) */
    if (p->step == STORE_PROBE_CLAIM) {
        nums[n++] = p->settle_ms;
        nums[n++] = p->every_ms;
        nums[n++] = p->attempts;
    } else if (p->step != STORE_PROBE_FOUND) { /* found: its head is in op->head */
        nums[n++] = p->sent_ms;
    }
    for (int i = 0; i < n; i++) {
        char text[24];
        size_t len = u64_text(nums[i], text);

        if (buf_append(&op->head, text, len) < 0) {
            store_redis_op_free(op);
            return -ENOMEM;
        }
        op->arglen[i] = len;
    }
    op->argc = n;
    return store_redis_op_submit(op);
}

static int redis_release(struct store *base, struct span key, const struct store_token *tok,
                         store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    err = store_redis_op_new(store_redis_of(base), LUA_RELEASE, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    return store_redis_op_submit(op);
}

static int redis_extend(struct store *base, struct span key, const struct store_token *tok,
                        uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    struct op *op;
    int err;

    if (lock_ttl_ms == 0)
        return -EINVAL;
    err = store_redis_op_new(store_redis_of(base), LUA_EXTEND, key, tok, done, ctx, &op);
    if (err < 0)
        return err;
    op->ttl_ms = lock_ttl_ms;
    return store_redis_op_submit(op);
}

static int redis_metrics(struct store *base, store_metric_fn *emit, void *ctx)
{
    struct store_redis *st = store_redis_of(base);
    static const struct {
        const char *name;
        enum lua_script_id script;
    } unreplicated_ops[] = { { "acquire", LUA_ACQUIRE }, { "complete", LUA_COMPLETE },
                             { "release", LUA_RELEASE }, { "extend", LUA_EXTEND },
                             { "unknown", LUA_UNKNOWN }, { "resolve", LUA_RESOLVE },
                             { "probe", LUA_PROBE } };
    int err = emit(ctx, "idemproxy_redis_connected", NULL, "gauge",
                   "1 while the (current) Redis master of every slot answers",
                   store_redis_is_ready(base) ? 1 : 0);

    if (err == 0)
        err = emit(ctx, "idemproxy_store_durable", NULL, "gauge",
                   "1 while every Redis master keeps its writes through a restart (an append-only "
                   "file fsynced at least every second, as INFO persistence and CONFIG GET "
                   "appendfsync tell); 0: a restart may forget keys",
                   store_redis_is_durable(st) ? 1 : 0);
    if (err == 0)
        err = emit(ctx, "idemproxy_redis_failovers_total", NULL, "counter",
                   "times another master took over (named by the sentinels, or a cluster slot's)",
                   atomic_load(&st->failovers));
    if (err == 0)
        err = emit(ctx, "idemproxy_redis_redirections_total", NULL, "counter",
                   "Redis Cluster MOVED and ASK redirections followed",
                   atomic_load(&st->redirections));
    for (int i = 0; i < (int)ARRAY_SIZE(unreplicated_ops) && err == 0; i++) {
        char labels[32];

        snprintf(labels, sizeof(labels), "op=\"%s\"", unreplicated_ops[i].name);
        err = emit(ctx, "idemproxy_store_unreplicated_total", labels, i == 0 ? "counter" : NULL,
                   i == 0 ? "Writes that --redis-wait-replicas replicas did not confirm in time "
                            "(an acquire among them was refused)"
                          : NULL,
                   atomic_load(&st->unreplicated[unreplicated_ops[i].script]));
    }
    return err;
}

static void ping_done(void *ctx, int err, const struct store_result *res)
{
    (void)ctx, (void)err, (void)res; /* the op's reply set the node's state */
}

void store_redis_ping(struct store_redis *st, unsigned index)
{
    struct op *op = calloc(1, sizeof(*op));

    if (!op)
        return;
    op->st = st;
    op->script = OP_PING;
    op->done = ping_done;
    op->head = BUF_INIT(0);
    op->to = (int)index;
    (void)store_redis_op_submit(op); /* refused only while the store stops */
}

/* Every PING_INTERVAL_MS, on a pool thread: looks the hosts up again, and
 * PINGs Redis (each master of a cluster) on the first loop's connections
 * (connecting them when there are none), so that /readyz follows Redis
 * without traffic. Asks for the slot map until it is known whether this is
 * a cluster; on a cluster, again while a slot lacks a master that answers,
 * or every REFRESH_IDLE_MS. */
static void ping_run(void *arg)
{
    struct store_redis *st = arg;
    unsigned masters[NODE_MAX], n, nnodes = atomic_load_explicit(&st->nnodes, memory_order_acquire);
    int mode = atomic_load(&st->mode);

    if (st->sentinel)
        redis_sentinel_resolve(st->sentinel);
    for (unsigned i = 0; i < nnodes; i++)
        store_redis_resolve_node(st, i); /* for the loops' next connects */
    n = store_redis_masters(st, masters);
    for (unsigned i = 0; i < n; i++)
        store_redis_ping(st, masters[i]);
    if (mode == MODE_UNKNOWN ||
        (mode == MODE_CLUSTER && (!store_redis_is_ready(&st->base) ||
                                  now_ms() >= atomic_load(&st->refresh_ms) + REFRESH_IDLE_MS)))
        store_redis_cluster_refresh(st);
}

static void redis_free(struct store *base)
{
    struct store_redis *st = store_redis_of(base);
    bool had_sentinel;

    store_redis_notify_stop(st->sub);
    worker_every_stop(st->pinger); /* waits for a ping in progress */
    store_redis_lanes_stop(st);    /* everything accepted has called back */
    had_sentinel = st->sentinel != NULL;
    redis_sentinel_free(st->sentinel); /* no link is left to ask it */
    store_redis_lanes_free(st, had_sentinel);
    store_calls_done(&st->calls); /* inspect and purge */
    for (unsigned i = 0; i < atomic_load(&st->nnodes); i++)
        free(st->nodes[i]);
    pthread_mutex_destroy(&st->addr_mu);
    pthread_mutex_destroy(&st->log_mu);
    redis_url_done(&st->url);
    redis_tls_free(st->tls);
    free(st);
}

/* The URL of <o>, its password (a password file's beats the URL's), and
 * the TLS context of a rediss:// one, into <st>. On failure the caller
 * frees st->url. */
static int parse_url(struct store_redis *st, const struct store_redis_opts *o, char *why,
                     size_t why_len)
{
    int err = redis_url_parse(o->url, &st->url, why, why_len);

    if (err < 0)
        return err;
    if (o->password) {
        char *pw = strdup(o->password);

        if (!pw)
            return -ENOMEM;
        if (st->url.password) {
            explicit_bzero(st->url.password, strlen(st->url.password));
            free(st->url.password);
        }
        st->url.password = pw;
    }
    return st->url.tls ? redis_tls_new(&o->tls, &st->tls, why, why_len) : 0;
}

void store_redis_last_failure(struct store *base, char *buf, size_t len)
{
    struct store_redis *st = store_redis_of(base);

    pthread_mutex_lock(&st->log_mu);
    snprintf(buf, len, "%s%s", st->logged_why[0] ? "redis " : "", st->logged_why);
    pthread_mutex_unlock(&st->log_mu);
}

static const struct store_ops redis_ops = {
    .name = "redis",
    .acquire = redis_acquire,
    .complete = redis_complete,
    .release = redis_release,
    .unknown = redis_unknown,
    .extend = redis_extend,
    .inspect = store_redis_inspect,
    .find_resource = store_redis_find_resource,
    .purge = store_redis_purge,
    .list_unknown = store_redis_list_unknown,
    .resolve = redis_resolve,
    .probe = redis_probe,
    .set_notify = store_redis_set_notify,
    .is_ready = store_redis_is_ready,
    .last_failure = store_redis_last_failure,
    .metrics = redis_metrics,
    .free = redis_free,
};

int store_redis_new(const struct store_redis_opts *o, struct worker_pool *pool,
                    struct loop *const *loops, unsigned nloops, struct store **ret, char *why,
                    size_t why_len)
{
    struct store_redis *st;
    int err;

    if (why && why_len)
        why[0] = '\0';
    if (!pool || o->timeout_ms == 0 || !loops || nloops == 0)
        return -EINVAL;
    for (unsigned i = 0; i < nloops; i++) {
        if (!loops[i])
            return -EINVAL;
    }
    st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    err = parse_url(st, o, why, why_len);
    if (err < 0) {
        redis_url_done(&st->url);
        free(st);
        return err;
    }
    snprintf(st->tls_name, sizeof(st->tls_name), "%s",
             o->tls_server_name ? o->tls_server_name : ""); /* "": the node's host */
    st->base.ops = &redis_ops;
    st->pool = pool;
    st->timeout_ms = o->timeout_ms;
    st->wait_replicas = o->wait_replicas;
    st->wait_timeout_ms = o->wait_timeout_ms;
    atomic_init(&st->stopping, false);
    pthread_mutex_init(&st->addr_mu, NULL);
    pthread_mutex_init(&st->log_mu, NULL);
    if (st->url.kind == REDIS_URL_SENTINEL)
        snprintf(st->name, sizeof(st->name), "master '%.200s'", st->url.master);
    else if (st->url.kind == REDIS_URL_SEEDS)
        snprintf(st->name, sizeof(st->name), "cluster");
    else
        redis_addr_format(&st->url.hosts[0], st->name, sizeof(st->name));
    store_calls_init(&st->calls);
    err = store_redis_add_url_nodes(st);
    if (err == 0) {
        for (unsigned i = 0; i < atomic_load(&st->nnodes); i++)
            store_redis_resolve_node(st, i); /* here, before any loop runs; then by the PING job */
        err = store_redis_lanes_start(st, loops, nloops);
    }
    if (err < 0) {
        redis_free(&st->base);
        return err;
    }
    if (st->url.kind == REDIS_URL_SENTINEL) {
        err = redis_sentinel_new(loops[0],
                                 &(struct redis_sentinel_opts){ .url = &st->url,
                                                                .tls = st->tls,
                                                                .timeout_ms = st->timeout_ms,
                                                                .master = store_redis_on_master,
                                                                .ctx = st },
                                 &st->sentinel);
        if (err < 0) {
            redis_free(&st->base);
            return err;
        }
    }
    /* The first ping at once (it waits for the first loop to start): /readyz
     * should not wait a whole interval. */
    err = worker_every_start(pool, 0, PING_INTERVAL_MS, ping_run, st, &st->pinger);
    if (err < 0) {
        redis_free(&st->base);
        return err;
    }
    *ret = &st->base;
    return 0;
}
