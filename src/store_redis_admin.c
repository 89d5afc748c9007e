/* SPDX-License-Identifier: MIT */
/* The Redis store's operator calls (store.h: inspect, purge). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/idemkey.h"
#include "idemproxy/record.h"
#include "store_impl.h"
#include "store_redis_impl.h"

/* ---- for operators: inspect and purge ----
 * They run on the first loop's connections, as chains of ops whose replies
 * come as they are: SCAN page by page (never KEYS: it would stall Redis on a
 * large database) on each master in turn (one, unless it is a cluster), the
 * inspect script for each key found and DEL for a purge on the key's slot's
 * master. A pool thread only starts them: nothing waits on Redis. */

/* Appends <s> to <b> with the glob characters of SCAN MATCH escaped. */
static int append_glob_escaped(struct buf *b, struct span s)
{
    for (size_t i = 0; i < s.len; i++) {
        int err = s.base[i] && strchr("*?[]\\", s.base[i]) ? buf_append(b, "\\", 1) : 0;

        if (err == 0)
            err = buf_append(b, &s.base[i], 1);
        if (err < 0)
            return err;
    }
    return 0;
}

static bool reply_is(const redisReply *r, int type) { return r && r->type == type; }

/* The probes of an unknown key (inspect's el[11], el[12]: probe.lua's
 * probes and result) into <info>. Returns 0 or -EPROTO. */
static int parse_probes(redisReply *const *el, struct store_info *info)
{
    if (reply_is(el[11], REDIS_REPLY_STRING)) {
        unsigned long n = strtoul(el[11]->str, NULL, 10);

        info->probes = n > UINT_MAX ? UINT_MAX : (unsigned)n;
    }
    if (!reply_is(el[12], REDIS_REPLY_STRING))
        info->last_result = STORE_PROBE_NONE;
    else if (el[12]->len == 6 && memcmp(el[12]->str, "absent", 6) == 0)
        info->last_result = STORE_PROBE_WAS_ABSENT;
    else if (el[12]->len == 6 && memcmp(el[12]->str, "failed", 6) == 0)
        info->last_result = STORE_PROBE_WAS_FAILED;
    else
        return -EPROTO;
    return 0;
}

/* Reads the inspect script's reply for the store key <key> into <info>.
 * Returns 1 when filled, 0 when the key went meanwhile, or a negative errno. */
static int parse_inspect(const redisReply *r, struct span key, struct store_info *info)
{
    redisReply **el;
    int err;

    if (reply_is(r, REDIS_REPLY_ARRAY) && r->elements == 0)
        return 0;
    if (!reply_is(r, REDIS_REPLY_ARRAY) || r->elements != 13)
        return -EPROTO;
    el = r->element;
    if (!reply_is(el[0], REDIS_REPLY_STRING) || !reply_is(el[1], REDIS_REPLY_STRING) ||
        el[1]->len != FINGERPRINT_HEX || !reply_is(el[5], REDIS_REPLY_INTEGER) ||
        !reply_is(el[6], REDIS_REPLY_INTEGER))
        return -EPROTO;
    *info = (struct store_info){ .completed = el[0]->len == 1 && el[0]->str[0] == 'C',
                                 .unknown = el[0]->len == 1 && el[0]->str[0] == 'U' };
    memcpy(info->fp_hex, el[1]->str, FINGERPRINT_HEX);
    info->fp_hex[FINGERPRINT_HEX] = '\0';
    info->ttl_ms = el[5]->integer > 0 ? (uint64_t)el[5]->integer : 0;
    if (parse_probes(el, info) < 0)
        return -EPROTO;
    if (!info->completed && !info->unknown) {
        uint64_t keep = reply_is(el[7], REDIS_REPLY_STRING) ? strtoull(el[7]->str, NULL, 10) : 0;

        info->lease_ms = info->ttl_ms > keep ? info->ttl_ms - keep : 0;
    }
    if (info->unknown && reply_is(el[8], REDIS_REPLY_STRING) &&
        store_cause_parse((struct span){ el[8]->str, el[8]->len }, &info->cause) < 0)
        return -EPROTO;
    if (info->unknown && reply_is(el[9], REDIS_REPLY_STRING) &&
        !(info->about = strndup(el[9]->str, el[9]->len)))
        return -ENOMEM;
    if (reply_is(el[2], REDIS_REPLY_STRING)) {
        long long ts = strtoll(el[2]->str, NULL, 10);

        info->age_ms = el[6]->integer > ts ? (uint64_t)(el[6]->integer - ts) : 0;
    }
    if (info->completed && reply_is(el[3], REDIS_REPLY_STRING)) {
        struct span body = { "", 0 };

        if (reply_is(el[4], REDIS_REPLY_STRING))
            body = (struct span){ el[4]->str, el[4]->len };
        err = record_decode((struct span){ el[3]->str, el[3]->len }, body, &info->rec);
        if (err < 0) {
            free(info->about);
            return err == -ENOMEM ? err : -EPROTO;
        }
    }
    info->store_key = strndup(key.base, key.len);
    if (reply_is(el[10], REDIS_REPLY_STRING))
        info->resource = strndup(el[10]->str, el[10]->len);
    if (!info->store_key || (reply_is(el[10], REDIS_REPLY_STRING) && !info->resource)) {
        store_info_done(info);
        return -ENOMEM;
    }
    return 1;
}

/* One inspect call, from its first SCAN to its callback. On the first
 * loop's thread once started. */
struct inspect {
    struct store_redis *st;
    struct store_admin_job *job;
    struct buf pattern; /* <prefix><32 '?'>:<key>, glob-escaped (find_resource: <prefix>r:...) */
    struct buf links;   /* find_resource: <prefix>r:, the links' own prefix */
    char cursor[32];
    bool scanned;               /* a SCAN was answered: cursor "0" now means this master's end */
    unsigned masters[NODE_MAX]; /* the nodes to scan, in turn */
    unsigned nmasters, at;
    unsigned pending; /* inspect scripts not answered yet */
    unsigned pages;   /* list_unknown: SCAN pages looked at */
    bool tombs;       /* inspect: the second pass, over the tombstones' keys (<links>) */
    struct store_info_list list;
    size_t cap;
    int err;
};

#define LIST_PAGE_SCANS 10 /* list_unknown: SCAN pages (of 1000) per page of the listing */

/* One key being read. */
struct inspect_key {
    struct inspect *in;
    size_t len;
    char key[];
};

static void inspect_finish(struct inspect *in)
{
    struct store_redis *st = in->st;

    if (in->err == 0 && in->job->unknown_only && in->at < in->nmasters)
        snprintf(in->list.cursor, sizeof(in->list.cursor), "%u.%s", in->at, in->cursor);
    if (in->err < 0)
        store_info_list_done(&in->list);
    in->job->list_done(in->job->ctx, in->err < 0 ? in->err : 0, &in->list);
    store_info_list_done(&in->list);
    buf_done(&in->pattern);
    buf_done(&in->links);
    store_admin_job_free(in->job);
    free(in);
    store_calls_end(&st->calls);
}

static void on_scan(void *ctx, int err, const redisReply *r);

/* The second pass of an inspect: every master again, for the keys
 * <prefix>t:<scope>:<key> of the tombstones (doc/configuration.md,
 * Tombstones). Returns 0 or -ENOMEM. */
static int tombs_start(struct inspect *in)
{
    struct buf *b = &in->pattern;
    int err;

    in->tombs = true;
    in->at = 0;
    snprintf(in->cursor, sizeof(in->cursor), "0");
    in->links.len = 0;
    err = buf_append(&in->links, in->job->prefix, in->job->prefix_len);
    if (err == 0)
        err = buf_append(&in->links, IDEMKEY_TOMB_MARK, strlen(IDEMKEY_TOMB_MARK));
    b->len = 0;
    if (err == 0)
        err = append_glob_escaped(b, buf_span(&in->links));
    for (int i = 0; err == 0 && i < IDEMKEY_SCOPE_HEX; i++)
        err = buf_append(b, "?", 1);
    if (err == 0)
        err = buf_append(b, ":", 1);
    if (err == 0)
        err = append_glob_escaped(b, (struct span){ in->job->key, in->job->key_len });
    if (err == 0)
        err = buf_append(b, "", 1); /* NUL-terminated, not counted */
    if (err == 0)
        b->len--;
    return err;
}

/* Asks for the next page, or ends the call. */
static void inspect_next(struct inspect *in)
{
    const char *argv[] = { "SCAN", in->cursor, "MATCH", NULL, "COUNT", "1000" };
    size_t lens[] = { 4, 0, 5, 0, 5, 4 };
    int err;

    if (in->err == 0 && in->scanned && strcmp(in->cursor, "0") == 0) {
        in->scanned = false; /* this master is done: the next one from cursor "0" */
        in->at++;
    }
    if (in->err == 0 && in->at == in->nmasters && !in->tombs && !in->job->unknown_only &&
        !in->job->resource)
        in->err = tombs_start(in); /* the records are listed: their tombstones now */
    if (in->err < 0 || in->at == in->nmasters ||
        (in->job->unknown_only &&
         (in->list.n >= STORE_LIST_PAGE || in->pages >= LIST_PAGE_SCANS))) {
        inspect_finish(in);
        return;
    }
    in->pages++;
    lens[1] = strlen(in->cursor);
    argv[3] = in->pattern.data; /* the second pass's, maybe */
    lens[3] = in->pattern.len;
    err = store_redis_raw(in->st, OP_RAW, (int)in->masters[in->at], 6, argv, lens, on_scan, in);
    if (err < 0) {
        in->err = err;
        inspect_finish(in);
    }
}

static void on_inspected(void *ctx, int err, const redisReply *r)
{
    struct inspect_key *ik = ctx;
    struct inspect *in = ik->in;
    struct store_info info;

    if (err == 0 && in->err == 0) {
        err = parse_inspect(r, (struct span){ ik->key, ik->len }, &info);
        if (err == 1 && in->job->unknown_only && !info.unknown) {
            free(info.store_key);
            free(info.about);
            record_unref(info.rec);
        } else if (err == 1 && (err = store_info_list_add(&in->list, &in->cap, &info)) < 0) {
            free(info.store_key);
            free(info.about);
            record_unref(info.rec);
        }
    }
    if (err < 0 && in->err == 0)
        in->err = err;
    free(ik);
    if (--in->pending == 0)
        inspect_next(in);
}

/* Asks for the record of the store key in <ik> (<in->pending> counts it). */
static int inspect_one(struct inspect *in, struct inspect_key *ik)
{
    const char *argv[] = { ik->key, in->job->with_body ? "1" : "0" };
    size_t lens[] = { ik->len, 1 };

    return store_redis_raw(in->st, LUA_INSPECT, NODE_BY_SLOT, 2, argv, lens, on_inspected, ik);
}

/* find_resource: a link's value, the store key it leads to, which must be
 * under the prefix and in the link's scope; then its record, as inspect's. */
static void on_link_got(void *ctx, int err, const redisReply *r)
{
    struct inspect_key *ik = ctx, *to = NULL;
    struct inspect *in = ik->in;
    struct span prefix = { in->job->prefix, in->job->prefix_len };
    size_t at = in->links.len; /* the link's scope, then ':' */

    /* A link gone meanwhile, or one that leads elsewhere, lists nothing. */
    if (err == 0 && reply_is(r, REDIS_REPLY_STRING) &&
        idemkey_store_key_is_under((struct span){ r->str, r->len }, prefix) &&
        !memcmp(r->str + prefix.len, ik->key + at, IDEMKEY_SCOPE_HEX)) {
        err = (to = malloc(sizeof(*to) + r->len)) ? 0 : -ENOMEM;
        if (to) {
            to->in = in;
            to->len = r->len;
            memcpy(to->key, r->str, r->len);
            err = inspect_one(in, to);
        }
        if (err == 0) {
            free(ik);
            return; /* on_inspected counts it down */
        }
        free(to);
    }
    if (err < 0 && in->err == 0)
        in->err = err;
    free(ik);
    if (--in->pending == 0)
        inspect_next(in);
}

/* A tombstone found by the second pass: its record's store key (<key>, the
 * tombstone's key less its mark), read with GET (the fingerprint) then
 * PTTL. */
struct tomb_key {
    struct inspect *in;
    struct store_info info;
    size_t tomb_len;
    char tomb[];
};

static void tomb_done(struct tomb_key *tk, int err)
{
    struct inspect *in = tk->in;

    if (err == 0)
        err = store_info_list_add(&in->list, &in->cap, &tk->info);
    if (err < 0)
        free(tk->info.store_key);
    if (err < 0 && in->err == 0)
        in->err = err;
    free(tk);
    if (--in->pending == 0)
        inspect_next(in);
}

static void on_tomb_ttl(void *ctx, int err, const redisReply *r)
{
    struct tomb_key *tk = ctx;

    if (err == 0 && !reply_is(r, REDIS_REPLY_INTEGER))
        err = -EPROTO;
    if (err == 0 && r->integer < 0) { /* gone meanwhile */
        free(tk->info.store_key);
        tk->info.store_key = NULL;
        err = 1;
    }
    if (err == 0)
        tk->info.ttl_ms = (uint64_t)r->integer;
    if (err == 1) {
        struct inspect *in = tk->in;

        free(tk);
        if (--in->pending == 0)
            inspect_next(in);
        return;
    }
    tomb_done(tk, err);
}

static void on_tomb_got(void *ctx, int err, const redisReply *r)
{
    struct tomb_key *tk = ctx;
    const char *argv[] = { "PTTL", tk->tomb };
    size_t lens[] = { 4, tk->tomb_len };

    if (err == 0 && reply_is(r, REDIS_REPLY_STRING) && r->len == FINGERPRINT_LEN)
        fingerprint_hex((const uint8_t *)r->str, tk->info.fp_hex);
    if (err == 0)
        err = store_redis_raw(tk->in->st, OP_RAW, NODE_BY_SLOT, 2, argv, lens, on_tomb_ttl, tk);
    if (err < 0)
        tomb_done(tk, err);
}

/* Whether <store_key> is listed already (a record outlives nothing: while
 * it lives, its tombstone waits beside it). */
static bool listed(const struct inspect *in, struct span store_key)
{
    for (size_t i = 0; i < in->list.n; i++) {
        const char *k = in->list.items[i].store_key;

        if (k && strlen(k) == store_key.len && memcmp(k, store_key.base, store_key.len) == 0)
            return true;
    }
    return false;
}

/* Asks for the tombstone <k> (a key the second pass found) when it is one
 * of the key inspected, and no record of it is listed. Returns 0 or a
 * negative errno. */
static int tomb_one(struct inspect *in, const redisReply *k)
{
    size_t mark = in->links.len, plen = in->job->prefix_len;
    struct tomb_key *tk;
    const char *argv[2] = { "GET", NULL };
    size_t lens[2] = { 3, k->len };
    int err;

    if (k->len <= mark || memcmp(k->str, in->links.data, mark) != 0)
        return 0;
    tk = calloc(1, sizeof(*tk) + k->len + 1);
    if (!tk)
        return -ENOMEM;
    tk->in = in;
    tk->tomb_len = k->len;
    memcpy(tk->tomb, k->str, k->len);
    tk->info.tombstone = tk->info.completed = true;
    tk->info.store_key = malloc(k->len - (mark - plen) + 1);
    if (!tk->info.store_key) {
        free(tk);
        return -ENOMEM;
    }
    memcpy(tk->info.store_key, k->str, plen);
    memcpy(tk->info.store_key + plen, k->str + mark, k->len - mark);
    tk->info.store_key[k->len - (mark - plen)] = '\0';
    if (!idemkey_store_key_matches(span_from_cstr(tk->info.store_key),
                                   (struct span){ in->job->prefix, plen },
                                   (struct span){ in->job->key, in->job->key_len }) ||
        listed(in, span_from_cstr(tk->info.store_key))) {
        free(tk->info.store_key);
        free(tk);
        return 0;
    }
    argv[1] = tk->tomb;
    in->pending++;
    err = store_redis_raw(in->st, OP_RAW, NODE_BY_SLOT, 2, argv, lens, on_tomb_got, tk);
    if (err < 0) {
        in->pending--;
        free(tk->info.store_key);
        free(tk);
    }
    return err;
}

static void on_scan(void *ctx, int err, const redisReply *r)
{
    struct inspect *in = ctx;
    struct span prefix = { in->job->prefix, in->job->prefix_len };
    struct span key = { in->job->key, in->job->key_len };
    const redisReply *keys;

    if (err == 0 &&
        (!reply_is(r, REDIS_REPLY_ARRAY) || r->elements != 2 ||
         !reply_is(r->element[0], REDIS_REPLY_STRING) || r->element[0]->len >= sizeof(in->cursor) ||
         !reply_is(r->element[1], REDIS_REPLY_ARRAY)))
        err = -EPROTO;
    if (err < 0) {
        in->err = err;
        inspect_finish(in);
        return;
    }
    memcpy(in->cursor, r->element[0]->str, r->element[0]->len);
    in->cursor[r->element[0]->len] = '\0';
    in->scanned = true;
    keys = r->element[1];
    in->pending++; /* held while the page's keys are asked for */
    for (size_t i = 0; i < keys->elements && in->err == 0; i++) {
        const redisReply *k = keys->element[i];
        struct inspect_key *ik;
        const char *argv[2];
        size_t lens[2];

        if (in->tombs) {
            if (reply_is(k, REDIS_REPLY_STRING) && (err = tomb_one(in, k)) < 0)
                in->err = err;
            continue;
        }
        if (!reply_is(k, REDIS_REPLY_STRING) ||
            !(in->job->unknown_only
                  ? idemkey_store_key_is_under((struct span){ k->str, k->len }, prefix)
                  : idemkey_store_key_matches((struct span){ k->str, k->len },
                                              in->job->resource ? buf_span(&in->links) : prefix,
                                              key)))
            continue;
        ik = malloc(sizeof(*ik) + k->len);
        if (!ik) {
            in->err = -ENOMEM;
            break;
        }
        ik->in = in;
        ik->len = k->len;
        memcpy(ik->key, k->str, k->len);
        argv[0] = "GET";
        lens[0] = 3;
        argv[1] = ik->key;
        lens[1] = k->len;
        in->pending++;
        err = in->job->resource
                  ? store_redis_raw(in->st, OP_RAW, NODE_BY_SLOT, 2, argv, lens, on_link_got, ik)
                  : inspect_one(in, ik);
        if (err < 0) {
            in->pending--;
            in->err = err;
            free(ik);
        }
    }
    if (--in->pending == 0)
        inspect_next(in);
}

/* On a pool thread: starts the chain (its ops go to the first loop). */
static void inspect_run(void *arg)
{
    struct store_admin_job *job = arg;
    struct inspect *in = calloc(1, sizeof(*in));
    int err;

    if (!in) {
        struct store_info_list none = { 0 };
        struct store_redis *st = job->st;

        job->list_done(job->ctx, -ENOMEM, &none);
        store_admin_job_free(job);
        store_calls_end(&st->calls);
        return;
    }
    in->st = job->st;
    in->job = job;
    in->pattern = BUF_INIT(64 << 10); /* a composite key, every byte escaped */
    in->links = BUF_INIT(64 << 10);
    in->nmasters = store_redis_masters(in->st, in->masters);
    snprintf(in->cursor, sizeof(in->cursor), "0");
    err = 0;
    if (job->unknown_only) {
        /* "<master>.<its SCAN cursor>": the masters' order is the slot map's */
        uint64_t at, cursor;

        err = store_cursor_parse(job->cursor, &at, &cursor);
        if (err == 0 && at > in->nmasters)
            err = -EINVAL;
        if (err == 0) {
            in->at = (unsigned)at;
            snprintf(in->cursor, sizeof(in->cursor), "%llu", (unsigned long long)cursor);
            in->scanned = cursor != 0;
        }
    }
    if (err == 0 && job->resource) /* the links: <prefix>r:<scope>:<resource> */
        err = buf_append(&in->links, job->prefix, job->prefix_len);
    if (err == 0 && job->resource)
        err = buf_append(&in->links, IDEMKEY_LINK_MARK, strlen(IDEMKEY_LINK_MARK));
    if (err == 0)
        err = append_glob_escaped(&in->pattern,
                                  job->resource ? buf_span(&in->links)
                                                : (struct span){ job->prefix, job->prefix_len });
    for (int i = 0; err == 0 && i < IDEMKEY_SCOPE_HEX; i++)
        err = buf_append(&in->pattern, "?", 1);
    if (err == 0)
        err = buf_append(&in->pattern, ":", 1);
    if (err == 0 && job->unknown_only)
        err = buf_append(&in->pattern, "*", 1);
    else if (err == 0)
        err = append_glob_escaped(&in->pattern, (struct span){ job->key, job->key_len });
    if (err == 0)
        err = buf_append(&in->pattern, "", 1); /* NUL-terminated, not counted */
    if (err == 0)
        in->pattern.len--;
    in->err = err;
    inspect_next(in);
}

/* A purge: DEL of the store key, then of its tombstone's (doc/configuration.md,
 * Tombstones), a key of its own in <job->prefix> (none: prefix_len 0);
 * <job->with_body> says that one of them was there. */
static void on_purged(void *ctx, int err, const redisReply *r)
{
    struct store_admin_job *job = ctx;
    struct store_redis *st = job->st;
    struct store_result res = { .status = STORE_OK };

    if (err == 0 && !reply_is(r, REDIS_REPLY_INTEGER))
        err = -EPROTO;
    job->with_body |= err == 0 && r->integer > 0;
    if (err == 0 && job->prefix_len) {
        const char *argv[] = { "DEL", job->prefix };
        size_t lens[] = { 3, job->prefix_len };

        job->prefix_len = 0;
        err = store_redis_raw(job->st, OP_RAW, NODE_BY_SLOT, 2, argv, lens, on_purged, job);
        if (err == 0)
            return;
    }
    if (err == 0 && !job->with_body)
        err = -ENOENT;
    job->done(job->ctx, err, err == 0 ? &res : NULL);
    store_admin_job_free(job);
    store_calls_end(&st->calls);
}

static void purge_run(void *arg)
{
    struct store_admin_job *job = arg;
    const char *argv[] = { "DEL", job->key };
    size_t lens[] = { 3, job->key_len };
    int err = store_redis_raw(job->st, OP_RAW, NODE_BY_SLOT, 2, argv, lens, on_purged, job);

    if (err < 0) {
        job->prefix_len = 0;
        on_purged(job, err, NULL);
    }
}

int store_redis_list_unknown(struct store *base, struct span prefix, const char *cursor,
                             store_list_fn *done, void *ctx)
{
    struct store_redis *st = store_redis_of(base);
    struct store_admin_job job = { .st = st, .list_done = done, .ctx = ctx, .unknown_only = true };
    uint64_t a, b;

    if (!done || store_cursor_parse(cursor, &a, &b) < 0 ||
        strlen(cursor ? cursor : "") >= sizeof(job.cursor))
        return -EINVAL;
    snprintf(job.cursor, sizeof(job.cursor), "%s", cursor ? cursor : "");
    return store_admin_job_submit(&st->calls, st->pool, inspect_run, &job, prefix,
                                  (struct span){ "", 0 });
}

int store_redis_inspect(struct store *base, struct span prefix, struct span key, bool with_body,
                        store_list_fn *done, void *ctx)
{
    struct store_redis *st = store_redis_of(base);

    if (!done || !key.base || key.len == 0)
        return -EINVAL;
    return store_admin_job_submit(
        &st->calls, st->pool, inspect_run,
        &(struct store_admin_job){
            .st = st, .list_done = done, .ctx = ctx, .with_body = with_body },
        prefix, key);
}

int store_redis_find_resource(struct store *base, struct span prefix, struct span resource,
                              bool with_body, store_list_fn *done, void *ctx)
{
    struct store_redis *st = store_redis_of(base);

    if (!done || resource.len == 0 || resource.len > STORE_RESOURCE_MAX)
        return -EINVAL;
    return store_admin_job_submit(
        &st->calls, st->pool, inspect_run,
        &(struct store_admin_job){
            .st = st, .list_done = done, .ctx = ctx, .with_body = with_body, .resource = true },
        prefix, resource);
}

int store_redis_purge(struct store *base, struct span store_key, size_t prefix_len,
                      store_done_fn *done, void *ctx)
{
    struct store_redis *st = store_redis_of(base);
    char *tomb = NULL;
    int err;

    if (!done || !store_key.base || store_key.len == 0)
        return -EINVAL;
    if (idemkey_tomb_key(store_key, prefix_len, &tomb) == -ENOMEM)
        return -ENOMEM;
    err = store_admin_job_submit(&st->calls, st->pool, purge_run,
                                 &(struct store_admin_job){ .st = st, .done = done, .ctx = ctx },
                                 tomb ? span_from_cstr(tomb) : (struct span){ NULL, 0 }, store_key);
    free(tomb);
    return err;
}
