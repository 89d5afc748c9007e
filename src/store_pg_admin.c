/* SPDX-License-Identifier: MIT */
/* The PostgreSQL store's operator calls (store.h): inspect, purge, list the
 * unknown keys a page at a time, resolve; and a reconcile's probe steps.
 * Each is one statement on the service connection (store_pg_link.c),
 * called back on the first loop's thread. A store key's layout is idemkey.h's: the statements
 * narrow the rows to a range of keys, and each row is checked here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/idemkey.h"
#include "idemproxy/record.h"
#include "store_pg_impl.h"

/* Above every store key under a prefix, in byte order: the prefix and the
 * highest character there is (U+10FFFF), which no scope begins with. */
#define RANGE_END "\xf4\x8f\xbf\xbf"

/* A new service op of <stmt> on <key>, called back through <fn>. */
static int admin_op(struct store *base, enum sql_script_id stmt, struct span key, pg_op_fn *fn,
                    struct pg_op **ret)
{
    int err = store_pg_op_new(store_pg_of(base), stmt, key, fn, ret);

    if (err == 0)
        (*ret)->service = true;
    return err;
}

/* Puts the range [<prefix>, <prefix>RANGE_END) into <op>'s head, as its
 * next two parameters, and keeps the prefix for the checks. */
static int set_range(struct pg_op *op, struct span prefix)
{
    size_t n = prefix.len;

    if (buf_reserve(&op->head, 2 * n + sizeof(RANGE_END) + 1) < 0)
        return -ENOMEM;
    if (n)
        memcpy(op->head.data, prefix.base, n);
    op->head.data[n] = '\0';
    if (n)
        memcpy(op->head.data + n + 1, prefix.base, n);
    memcpy(op->head.data + 2 * n + 1, RANGE_END, sizeof(RANGE_END));
    op->prefix = (struct span){ .base = op->head.data, .len = n };
    store_pg_param_text(op, op->head.data);
    store_pg_param_text(op, op->head.data + n + 1);
    return 0;
}

/* One row of inspect.sql (or list_unknown.sql) as <in>. Returns 0 or -EPROTO. */
static int row_info(const PGresult *res, int row, bool with_body, struct store_info *in)
{
    struct span key = store_pg_field(res, row, 0), fp = store_pg_field(res, row, 2);
    char state = *PQgetvalue(res, row, 1);

    *in = (struct store_info){ .completed = state == 'C', .unknown = state == 'U' };
    /* inspect: a tombstone's answer expired (its row keeps it until it goes) */
    in->tombstone = in->completed && PQnfields(res) > 11 && *PQgetvalue(res, row, 11) == 1;
    if (fp.len != FINGERPRINT_LEN || !(in->store_key = strndup(key.base, key.len)))
        return -EPROTO;
    fingerprint_hex((const uint8_t *)fp.base, in->fp_hex);
    in->age_ms = store_pg_u64(res, row, 3);
    in->ttl_ms = store_pg_u64(res, row, 4);
    in->lease_ms = store_pg_u64(res, row, 5);
    if (in->completed && !in->tombstone &&
        record_decode(store_pg_field(res, row, 8),
                      with_body ? store_pg_field(res, row, 9) : (struct span){ NULL, 0 },
                      &in->rec) < 0)
        return -EPROTO;
    if (in->completed && !PQgetisnull(res, row, 10)) { /* inspect, find_resource */
        struct span r = store_pg_field(res, row, 10);

        if (!(in->resource = strndup(r.base, r.len)))
            return -ENOMEM;
    }
    if (in->unknown && PQfnumber(res, "probes") >= 0) { /* its reconcile's probes */
        struct span r = store_pg_field(res, row, PQfnumber(res, "probe_result"));

        in->probes = (unsigned)store_pg_u64(res, row, PQfnumber(res, "probes"));
        in->last_result = r.len != 1         ? STORE_PROBE_NONE
                          : r.base[0] == 'a' ? STORE_PROBE_WAS_ABSENT
                                             : STORE_PROBE_WAS_FAILED;
    }
    if (in->unknown) {
        struct span about = store_pg_field(res, row, 7);

        if (store_cause_parse(store_pg_field(res, row, 6), &in->cause) < 0 ||
            !(in->about = strndup(about.base ? about.base : "", about.len)))
            return -EPROTO;
    }
    return 0;
}

/* Lists the rows of <res> that <op> asked for: under its prefix, and (inspect) of its key. */
static int read_rows(struct pg_op *op, const PGresult *res, struct store_info_list *l)
{
    struct span key = { .base = op->key, .len = op->key_len };
    size_t cap = 0;

    for (int i = 0; i < PQntuples(res); i++) {
        struct span sk = store_pg_field(res, i, 0);
        struct store_info in;
        int err;

        if (op->stmt == SQL_INSPECT ? !idemkey_store_key_matches(sk, op->prefix, key)
                                    : !idemkey_store_key_is_under(sk, op->prefix))
            continue;
        err = row_info(res, i, op->with_body, &in);
        if (err == 0)
            err = store_info_list_add(l, &cap, &in);
        if (err < 0) {
            store_info_done(&in);
            return err;
        }
    }
    return 0;
}

static void read_list(struct pg_op *op, int err, const PGresult *res)
{
    struct store_info_list l = { .items = NULL, .n = 0, .cursor = "" };

    if (err == 0)
        err = read_rows(op, res, &l);
    if (err == 0 && op->stmt == SQL_LIST_UNKNOWN && PQntuples(res) == STORE_LIST_PAGE)
        snprintf(l.cursor, sizeof(l.cursor), "%llu.0",
                 (unsigned long long)store_pg_u64(res, PQntuples(res) - 1, 10));
    if (err < 0)
        store_info_list_done(&l);
    op->list_done(op->ctx, err, &l);
    store_info_list_done(&l);
}

/* inspect.sql or find_resource.sql: the rows under <prefix> of the key, or
 * the resource, <what>. */
static int list_op(struct store *base, enum sql_script_id stmt, struct span prefix,
                   struct span what, bool with_body, store_list_fn *done, void *ctx)
{
    struct pg_op *op;
    int err = admin_op(base, stmt, what, read_list, &op);

    if (err < 0)
        return err;
    op->list_done = done;
    op->ctx = ctx;
    op->with_body = with_body;
    if (set_range(op, prefix) < 0) {
        store_pg_op_free(op);
        return -ENOMEM;
    }
    store_pg_param_text(op, op->key);
    store_pg_param_text(op, with_body ? "t" : "f");
    return store_pg_op_submit(op);
}

int store_pg_inspect(struct store *base, struct span prefix, struct span key, bool with_body,
                     store_list_fn *done, void *ctx)
{
    if (!done || !key.len)
        return -EINVAL;
    return list_op(base, SQL_INSPECT, prefix, key, with_body, done, ctx);
}

int store_pg_find_resource(struct store *base, struct span prefix, struct span resource,
                           bool with_body, store_list_fn *done, void *ctx)
{
    if (!done || resource.len == 0 || resource.len > STORE_RESOURCE_MAX)
        return -EINVAL;
    return list_op(base, SQL_FIND_RESOURCE, prefix, resource, with_body, done, ctx);
}

int store_pg_list_unknown(struct store *base, struct span prefix, const char *cursor,
                          store_list_fn *done, void *ctx)
{
    uint64_t after, unused;
    struct pg_op *op;
    int err;

    if (!done || store_cursor_parse(cursor, &after, &unused) < 0)
        return -EINVAL;
    err = admin_op(base, SQL_LIST_UNKNOWN, (struct span){ NULL, 0 }, read_list, &op);
    if (err < 0)
        return err;
    op->list_done = done;
    op->ctx = ctx;
    store_pg_param_num(op, 0, after);
    if (set_range(op, prefix) < 0) {
        store_pg_op_free(op);
        return -ENOMEM;
    }
    store_pg_param_num(op, 1, STORE_LIST_PAGE);
    return store_pg_op_submit(op);
}

/* purge.sql's and resolve.sql's answers. */
static void read_admin(struct pg_op *op, int err, const PGresult *res)
{
    struct store_result r = { .status = STORE_OK };

    if (err == 0 && PQntuples(res) == 0)
        err = -ENOENT;
    else if (err == 0 && op->stmt == SQL_RESOLVE && strcmp(PQgetvalue(res, 0, 0), "ok") != 0)
        err = -EBUSY;
    op->done(op->ctx, err, err == 0 ? &r : NULL);
}

int store_pg_purge(struct store *base, struct span store_key, size_t prefix_len,
                   store_done_fn *done, void *ctx)
{
    struct pg_op *op;
    int err;

    (void)prefix_len; /* a tombstone is the row itself */
    if (!done || !store_key.len)
        return -EINVAL;
    err = admin_op(base, SQL_PURGE, store_key, read_admin, &op);
    if (err < 0)
        return err;
    op->done = done;
    op->ctx = ctx;
    store_pg_param_text(op, op->key);
    return store_pg_op_submit(op);
}

int store_pg_resolve(struct store *base, struct span store_key, struct record *rec, uint64_t ttl_ms,
                     store_done_fn *done, void *ctx)
{
    struct pg_op *op;
    int err;

    if (!done || !store_key.len || !rec || ttl_ms == 0)
        return -EINVAL;
    err = admin_op(base, SQL_RESOLVE, store_key, read_admin, &op);
    if (err < 0)
        return err;
    op->done = done;
    op->ctx = ctx;
    store_pg_param_text(op, op->key);
    err = store_pg_param_record(op, rec);
    if (err < 0) {
        store_pg_op_free(op);
        return err;
    }
    store_pg_param_num(op, 0, ttl_ms);
    return store_pg_op_submit(op);
}

/* probe.sql's answer. */
static void read_probe(struct pg_op *op, int err, const PGresult *res)
{
    static const struct {
        const char *name;
        enum store_probe_answer answer;
    } answers[] = { { "claimed", STORE_PROBE_CLAIMED }, { "later", STORE_PROBE_LATER },
                    { "spent", STORE_PROBE_SPENT },     { "known", STORE_PROBE_KNOWN },
                    { "noted", STORE_PROBE_NOTED },     { "released", STORE_PROBE_RELEASED } };
    struct store_result r = { .status = STORE_OK };
    bool known = false;

    if (err == 0 && PQntuples(res) == 0)
        err = -ENOENT;
    for (size_t i = 0; err == 0 && i < ARRAY_SIZE(answers) && !known; i++) {
        known = strcmp(PQgetvalue(res, 0, 0), answers[i].name) == 0;
        r.probe = answers[i].answer;
    }
    if (err == 0 && !known)
        err = -EPROTO;
    if (err == 0) {
        r.probe_ms = store_pg_u64(res, 0, 1);
        r.probes = (unsigned)store_pg_u64(res, 0, 2);
    }
    op->done(op->ctx, err, err == 0 ? &r : NULL);
}

int store_pg_probe(struct store *base, struct span store_key, const struct store_probe *p,
                   store_done_fn *done, void *ctx)
{
    static const char *const steps[] = { [STORE_PROBE_CLAIM] = "claim",
                                         [STORE_PROBE_FOUND] = "found",
                                         [STORE_PROBE_ABSENT] = "absent",
                                         [STORE_PROBE_FAILED] = "failed" };
    struct pg_op *op;
    int err;

    if (!done || !store_key.len || (unsigned)p->step >= ARRAY_SIZE(steps) ||
        (p->step == STORE_PROBE_FOUND && !p->rec))
        return -EINVAL;
    err = admin_op(base, SQL_PROBE, store_key, read_probe, &op);
    if (err < 0)
        return err;
    op->done = done;
    op->ctx = ctx;
    store_pg_param_text(op, op->key);
    store_pg_param_text(op, steps[p->step]);
    store_pg_param_num(op, 0,
                       p->step == STORE_PROBE_FOUND ? (p->ttl_ms ? p->ttl_ms : 1) : p->settle_ms);
    store_pg_param_num(op, 1, p->every_ms);
    store_pg_param_num(op, 2, p->attempts);
    store_pg_param_num(op, 3, p->sent_ms);
    if (p->step == STORE_PROBE_FOUND) {
        err = store_pg_param_record(op, p->rec);
    } else {
        store_pg_param_bin(op, "", 0);
        store_pg_param_bin(op, "", 0);
    }
    if (err < 0) {
        store_pg_op_free(op);
        return err;
    }
    return store_pg_op_submit(op);
}
