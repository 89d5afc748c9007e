/* SPDX-License-Identifier: MIT */
/* The PostgreSQL store (store_pg.h): its operations, each one prepared
 * statement (sql/<op>.sql) whose parameters are set here and whose answer
 * is read here, run as an op on a connection of store_pg_link.c; the
 * readiness ping and the expired-row job (every second, from the pool);
 * metrics; the store's life, with its check of the table at start. No
 * thread waits on the database but the main one, once, at start. */
#include "idemproxy/store_pg.h"

#include <endian.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/log.h"
#include "idemproxy/pg_url.h"
#include "idemproxy/record.h"
#include "idemproxy/worker.h"
#include "store_pg_impl.h"

#define TICK_MS 1000       /* the ping and the expired-row job */
#define REAP_BATCH 1000    /* rows deleted (or tombstones emptied) by one statement */
#define ACQUIRE_TRIES 5    /* sends of an acquire that found no row (a race with an insert) */
#define GIVE_BACK_MAX 4096 /* give-backs under way at once; past it, locks expire by themselves */
#define START_CONNECT_TIMEOUT "5"

uint64_t store_pg_u64(const PGresult *res, int row, int col)
{
    uint64_t v = 0;

    if (PQgetlength(res, row, col) == (int)sizeof(v))
        memcpy(&v, PQgetvalue(res, row, col), sizeof(v));
    return be64toh(v);
}

struct span store_pg_field(const PGresult *res, int row, int col)
{
    if (PQgetisnull(res, row, col))
        return (struct span){ .base = NULL, .len = 0 };
    return (struct span){ .base = PQgetvalue(res, row, col),
                          .len = (size_t)PQgetlength(res, row, col) };
}

/* ---- parameters ---- */

/* Puts <about> into the op's <head> as text PostgreSQL takes whatever the
 * client sent (pg_text_escape(): no byte sequence that is not UTF-8, no NUL). */
static int op_set_about(struct pg_op *op, const struct store_about *about)
{
    char raw[STORE_ABOUT_MAX];
    size_t n = store_about_format(about, raw, sizeof(raw));

    if (buf_reserve(&op->head, n * 3 + 1) < 0)
        return -ENOMEM;
    op->head.len = pg_text_escape(raw, n, op->head.data, n * 3 + 1);
    return 0;
}

/* The trace context <lk> keeps (store_lock_trace()) as a text column takes
 * it: a traceparent is printable ASCII, and one that is not (no caller
 * makes one) is kept as none rather than fail the statement (a NUL, bytes
 * that are not UTF-8). */
static struct span pg_trace(const struct store_lock *lk)
{
    struct span t = store_lock_trace(lk);

    for (size_t i = 0; i < t.len; i++) {
        unsigned char c = (unsigned char)t.base[i];

        if (c < 0x20 || c > 0x7e)
            return (struct span){ .base = NULL, .len = 0 };
    }
    return t;
}

/* ---- answers ---- */

/* One row: done; none: the token does not hold the key. */
static void read_ok_or_stale(struct pg_op *op, int err, const PGresult *res)
{
    struct store_result r = { .status = STORE_OK };

    if (err == 0 && PQntuples(res) == 0)
        err = -ESTALE;
    op->done(op->ctx, err, err == 0 ? &r : NULL);
}

/* A give-back's answer: it is sent again on any failure of the store until
 * the lock would have expired by itself. */
static void read_give_back(struct pg_op *op, int err, const PGresult *res)
{
    if (err < 0 && err != -ESTALE && err != -ECANCELED && now_ms() < op->deadline_ms) {
        op->resend = true;
        return;
    }
    read_ok_or_stale(op, err, res);
}

static void give_back_done(void *ctx, int err, const struct store_result *res)
{
    struct store_pg *st = ctx;

    (void)err, (void)res; /* one not given back expires within --lock-ttl */
    atomic_fetch_sub(&st->releases_pending, 1);
}

/* <acq>, an acquire that was sent, failed: its answer was lost, and its
 * statement may have committed all the same. The request will not go
 * upstream, so the lock is given back with its token, retried until the
 * lock would have expired by itself. */
static void give_back(const struct pg_op *acq)
{
    struct store_pg *st = acq->st;
    struct pg_op *rel;

    if (atomic_fetch_add(&st->releases_pending, 1) >= GIVE_BACK_MAX ||
        store_pg_op_new(st, SQL_RELEASE, (struct span){ acq->key, acq->key_len }, read_give_back,
                        &rel) < 0) {
        atomic_fetch_sub(&st->releases_pending, 1);
        return;
    }
    rel->done = give_back_done;
    rel->ctx = st;
    rel->give_back = true;
    rel->life_ms = acq->ttl_ms;
    rel->tok = acq->tok;
    store_pg_param_text(rel, rel->key);
    store_pg_param_text(rel, rel->tok.hex);
    if (store_pg_op_submit(rel) < 0)
        atomic_fetch_sub(&st->releases_pending, 1); /* stopping: freed, nothing calls back */
}

/* The acquire's row: state, changed, mismatch, mine, cause, about, head, body,
 * resource, tomb, trace. */
static int acquire_result(const PGresult *res, struct store_result *r)
{
    char state = *PQgetvalue(res, 0, 0);
    bool changed = *PQgetvalue(res, 0, 1), mismatch = *PQgetvalue(res, 0, 2),
         mine = *PQgetvalue(res, 0, 3);
    struct span cause = store_pg_field(res, 0, 4);

    if (*PQgetvalue(res, 0, 9) == 1) { /* binary: true */
        r->status = STORE_EXPIRED;     /* whatever the fingerprint */
    } else if (mismatch) {
        r->status = STORE_MISMATCH;
        r->resource = store_pg_field(res, 0, 8);
    } else if (state == 'L') {
        r->status = changed || mine ? STORE_ACQUIRED : STORE_IN_FLIGHT;
    } else if (state == 'C') {
        r->status = STORE_COMPLETED;
        if (record_decode(store_pg_field(res, 0, 6), store_pg_field(res, 0, 7), &r->rec) < 0)
            return -EPROTO;
    } else if (state == 'U') {
        r->status = STORE_UNKNOWN;
        r->became = changed;
        r->about = store_pg_field(res, 0, 5);
        if (store_cause_parse(cause, &r->cause) < 0)
            return -EPROTO;
    } else {
        return -EPROTO;
    }
    if (r->status != STORE_ACQUIRED && r->status != STORE_EXPIRED)
        r->trace = store_pg_field(res, 0, 10); /* the key's, or (became unknown) its holder's */
    return 0;
}

static void read_acquire(struct pg_op *op, int err, const PGresult *res)
{
    struct store_result r = { .rec = NULL };

    if (err == 0 && PQntuples(res) == 0 && op->tries < ACQUIRE_TRIES) {
        op->resend = true; /* a row another proxy inserted after this statement began */
        return;
    }
    if (err == 0)
        err = PQntuples(res) == 1 && PQnfields(res) == 11 ? acquire_result(res, &r) : -EPROTO;
    if (err < 0 && op->sent)
        give_back(op);
    op->done(op->ctx, err, err == 0 ? &r : NULL);
    record_unref(r.rec);
}

/* ---- operations ---- */

/* A new op of <stmt> for <key> under <tok>, its first two parameters set. */
static int keyed_op(struct store *base, enum sql_script_id stmt, struct span key,
                    const struct store_token *tok, store_done_fn *done, void *ctx, pg_op_fn *fn,
                    struct pg_op **ret)
{
    struct pg_op *op;
    int err;

    if (!store_call_is_valid(key, tok, done))
        return -EINVAL;
    err = store_pg_op_new(store_pg_of(base), stmt, key, fn, &op);
    if (err < 0)
        return err;
    op->done = done;
    op->ctx = ctx;
    op->tok = *tok;
    store_pg_param_text(op, op->key);
    if (stmt != SQL_ACQUIRE)
        store_pg_param_text(op, op->tok.hex);
    *ret = op;
    return 0;
}

static int pg_acquire(struct store *base, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                      const struct store_token *tok, const struct store_lock *lk,
                      store_done_fn *done, void *ctx)
{
    struct span trace;
    struct pg_op *op;
    int err;

    if (!fp || !lk || lk->lease_ms == 0 || lk->keep_ms == 0)
        return -EINVAL;
    err = keyed_op(base, SQL_ACQUIRE, key, tok, done, ctx, read_acquire, &op);
    if (err < 0)
        return err;
    if (op_set_about(op, &lk->about) < 0) {
        store_pg_op_free(op);
        return -ENOMEM;
    }
    memcpy(op->fp, fp, FINGERPRINT_LEN);
    op->ttl_ms = lk->lease_ms;
    store_pg_param_bin(op, op->fp, FINGERPRINT_LEN);
    store_pg_param_text(op, op->tok.hex);
    store_pg_param_num(op, 0, lk->lease_ms);
    store_pg_param_num(op, 1, lk->keep_ms);
    store_pg_param_text(op, lk->take_over ? "t" : "f");
    store_pg_param_text(op, op->head.data);
    store_pg_param_text(op, lk->tombstones ? "t" : "f");
    trace = pg_trace(lk);
    memcpy(op->trace, trace.base ? trace.base : "", trace.len);
    store_pg_param_bin(op, op->trace, trace.len); /* as text, raw; '': none */
    return store_pg_op_submit(op);
}

static int pg_complete(struct store *base, struct span key, const struct store_token *tok,
                       struct record *rec, uint64_t ttl_ms, const struct store_link *link,
                       store_done_fn *done, void *ctx)
{
    struct pg_op *op;
    int err;

    if (!rec || ttl_ms == 0 || (link && link->resource.len > STORE_RESOURCE_MAX))
        return -EINVAL;
    err = keyed_op(base, SQL_COMPLETE, key, tok, done, ctx, read_ok_or_stale, &op);
    if (err < 0)
        return err;
    /* here, so that a record that cannot be stored is refused at once */
    err = store_pg_param_record(op, rec);
    if (err == 0 && link && link->resource.len &&
        !(op->resource = strndup(link->resource.base, link->resource.len)))
        err = -ENOMEM;
    if (err < 0) {
        store_pg_op_free(op);
        return err;
    }
    store_pg_param_num(op, 0, ttl_ms);
    store_pg_param_text(op, op->resource ? op->resource : ""); /* the link: a column, indexed */
    store_pg_param_num(op, 1, link ? link->tomb_ms : 0);
    return store_pg_op_submit(op);
}

static int pg_release(struct store *base, struct span key, const struct store_token *tok,
                      store_done_fn *done, void *ctx)
{
    struct pg_op *op;
    int err = keyed_op(base, SQL_RELEASE, key, tok, done, ctx, read_ok_or_stale, &op);

    return err < 0 ? err : store_pg_op_submit(op);
}

static int pg_unknown(struct store *base, struct span key, const struct store_token *tok,
                      enum store_cause cause, const struct store_about *about, uint64_t keep_ms,
                      store_done_fn *done, void *ctx)
{
    struct pg_op *op;
    int err;

    if (!about || keep_ms == 0 || cause >= STORE_CAUSE_MAX)
        return -EINVAL;
    err = keyed_op(base, SQL_UNKNOWN, key, tok, done, ctx, read_ok_or_stale, &op);
    if (err < 0)
        return err;
    if (op_set_about(op, about) < 0) {
        store_pg_op_free(op);
        return -ENOMEM;
    }
    store_pg_param_text(op, store_cause_name(cause));
    store_pg_param_text(op, op->head.data);
    store_pg_param_num(op, 0, keep_ms);
    return store_pg_op_submit(op);
}

static int pg_extend(struct store *base, struct span key, const struct store_token *tok,
                     uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    struct pg_op *op;
    int err;

    if (lock_ttl_ms == 0)
        return -EINVAL;
    err = keyed_op(base, SQL_EXTEND, key, tok, done, ctx, read_ok_or_stale, &op);
    if (err < 0)
        return err;
    store_pg_param_num(op, 0, lock_ttl_ms);
    return store_pg_op_submit(op);
}

static int pg_set_notify(struct store *base, store_notify_fn *fn, void *ctx)
{
    struct store_pg *st = store_pg_of(base);

    atomic_store(&st->notify_ctx, ctx);
    atomic_store(&st->notify_fn, fn); /* the service connection LISTENs from its set-up */
    return 0;
}

static bool pg_is_ready(struct store *base) { return atomic_load(&store_pg_of(base)->up); }

static int pg_metrics(struct store *base, store_metric_fn *emit, void *ctx)
{
    struct store_pg *st = store_pg_of(base);
    int err = emit(ctx, "idemproxy_postgres_connected", NULL, "gauge",
                   "1 while the PostgreSQL primary answers", pg_is_ready(base) ? 1 : 0);

    if (err == 0)
        err = emit(ctx, "idemproxy_store_durable", NULL, "gauge",
                   "1 while PostgreSQL commits to disk before it answers (fsync on, "
                   "synchronous_commit not off, as the last connection read); 0: a crash may "
                   "forget the last keys",
                   atomic_load(&st->durable) == 1 ? 1 : 0);
    if (err == 0)
        err = emit(ctx, "idemproxy_postgres_expired_deleted_total", NULL, "counter",
                   "expired rows this proxy's background job deleted", atomic_load(&st->reaped));
    return err;
}

/* ---- the jobs ---- */

static void read_ping(struct pg_op *op, int err, const PGresult *res)
{
    bool answered = err == 0 && PQntuples(res) == 1 && PQnfields(res) == 2,
         primary = answered && *PQgetvalue(res, 0, 0) == 0,
         rights = answered && *PQgetvalue(res, 0, 1) == 1;

    atomic_store(&op->st->up, primary && rights);
    if (answered && !primary)
        store_pg_log_failure(op->st, "the server is a standby (read-only) now");
    else if (answered && !rights)
        store_pg_log_failure(op->st,
                             "this role may not read and write the table " PG_TABLE
                             ": GRANT SELECT, INSERT, UPDATE, DELETE ON " PG_TABLE " TO it");
}

static void submit_reap(struct store_pg *st);

static void read_reap(struct pg_op *op, int err, const PGresult *res)
{
    struct store_pg *st = op->st;
    bool one = err == 0 && PQntuples(res) == 1 && PQnfields(res) == 2;
    uint64_t n = one ? store_pg_u64(res, 0, 0) : 0, emptied = one ? store_pg_u64(res, 0, 1) : 0;

    atomic_fetch_add(&st->reaped, n);
    if ((n >= REAP_BATCH || emptied >= REAP_BATCH) && !atomic_load(&st->stopping)) {
        submit_reap(st); /* more: the next batch at once */
        return;
    }
    atomic_store(&st->reaping, false);
}

/* Queues <stmt> on the service connection, read by <fn>. */
static int submit_service(struct store_pg *st, enum sql_script_id stmt, pg_op_fn *fn,
                          struct pg_op **ret)
{
    struct pg_op *op;
    int err = store_pg_op_new(st, stmt, (struct span){ NULL, 0 }, fn, &op);

    if (err < 0)
        return err;
    op->service = true;
    *ret = op;
    return 0;
}

static void submit_reap(struct store_pg *st)
{
    struct pg_op *op;

    if (submit_service(st, SQL_REAP, read_reap, &op) < 0) {
        atomic_store(&st->reaping, false);
        return;
    }
    store_pg_param_num(op, 0, REAP_BATCH);
    if (store_pg_op_submit(op) < 0)
        atomic_store(&st->reaping, false);
}

/* Every TICK_MS, on a pool thread: a ping (readiness, and the service
 * connection made again when it failed), and the expired-row job unless
 * its last run is still under way. */
static void tick(void *arg)
{
    struct store_pg *st = arg;
    struct pg_op *op;
    uint64_t now = now_ms();

    store_pg_look_up(st); /* for the lanes' next connects */
    if (submit_service(st, SQL_PING, read_ping, &op) == 0)
        (void)store_pg_op_submit(op);
    if (now >= st->next_reap_ms && !atomic_exchange(&st->reaping, true)) {
        st->next_reap_ms = now + st->reap_ms;
        submit_reap(st);
    }
}

/* ---- life ---- */

static void pg_free(struct store *base)
{
    struct store_pg *st = store_pg_of(base);

    worker_every_stop(st->pinger); /* waits for a tick in progress */
    if (st->lanes)
        store_pg_lanes_stop(st); /* everything accepted has called back */
    pthread_mutex_destroy(&st->log_mu);
    pthread_mutex_destroy(&st->addr_mu);
    free(st->url);
    if (st->password) {
        explicit_bzero(st->password, strlen(st->password));
        free(st->password);
    }
    free(st);
}

/* True when libpq's <msg> refuses a value of the URL (checked before any
 * connect: "invalid sslmode value", "invalid port number", "could not match
 * 2 port numbers to 3 hosts"). */
static bool is_option_error(const char *msg)
{
    return strncmp(msg, "invalid ", 8) == 0 || strncmp(msg, "could not match ", 16) == 0;
}

/* At start, on this thread: connects once to create the table when it is
 * missing, so that a role that may not is told at once. A server that does
 * not answer yet is no error: the lanes do this when it does. */
static int check_schema(struct store_pg *st, char *why, size_t why_len)
{
    const char *keys[] = { "dbname", "connect_timeout", "fallback_application_name", "password",
                           NULL };
    const char *vals[] = { st->url, START_CONNECT_TIMEOUT, "idemproxy", st->password, NULL };
    PGconn *conn;
    PGresult *r;
    int err = 0;

    if (!st->password)
        keys[3] = vals[3] = NULL;
    conn = PQconnectdbParams(keys, vals, 1);
    if (!conn)
        return -ENOMEM;
    if (PQstatus(conn) != CONNECTION_OK && is_option_error(PQerrorMessage(conn))) {
        snprintf(why, why_len, "%.*s", (int)strcspn(PQerrorMessage(conn), "\n"),
                 PQerrorMessage(conn));
        PQfinish(conn);
        return -EINVAL; /* a value libpq refuses before it connects: a bad option */
    }
    if (PQstatus(conn) != CONNECTION_OK) {
        log_warn("PostgreSQL %s: not answering yet (%.*s); requests get 503 until it does",
                 st->name, (int)strcspn(PQerrorMessage(conn), "\n"), PQerrorMessage(conn));
        PQfinish(conn);
        return 0;
    }
    r = PQexec(conn, "SELECT to_regclass('" PG_TABLE "') IS NOT NULL, " PG_HAVE_SCHEMA);
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQgetvalue(r, 0, 1)[0] == 'f') {
        bool had = PQgetvalue(r, 0, 0)[0] == 't'; /* a table of an older version */

        PQclear(r);
        r = PQexec(conn, sql_scripts[SQL_SCHEMA].src);
        if (PQresultStatus(r) == PGRES_COMMAND_OK) {
            log_info("PostgreSQL %s: %s the table " PG_TABLE " (" PG_SCHEMA_FILE ")", st->name,
                     had ? "added the columns of this version (resource, answer_until, probes..., "
                           "trace) to"
                         : "created");
        } else {
            snprintf(
                why, why_len,
                "the table " PG_TABLE
                " %s and this role may not %s (%.*s): have it %s with " PG_SCHEMA_FILE
                " (/usr/share/idemproxy/postgresql/schema.sql)",
                had ? "lacks a column of this version (resource, answer_until, probes..., trace)"
                    : "is missing",
                had ? "add it" : "create it", (int)strcspn(PQresultErrorMessage(r), "\n"),
                PQresultErrorMessage(r), had ? "brought up to date" : "created");
            err = -EACCES;
        }
    }
    PQclear(r);
    PQfinish(conn);
    return err;
}

static const struct store_ops pg_ops = {
    .name = "postgresql",
    .acquire = pg_acquire,
    .complete = pg_complete,
    .release = pg_release,
    .unknown = pg_unknown,
    .extend = pg_extend,
    .inspect = store_pg_inspect,
    .find_resource = store_pg_find_resource,
    .purge = store_pg_purge,
    .list_unknown = store_pg_list_unknown,
    .resolve = store_pg_resolve,
    .probe = store_pg_probe,
    .set_notify = pg_set_notify,
    .is_ready = pg_is_ready,
    .last_failure = store_pg_last_failure,
    .metrics = pg_metrics,
    .free = pg_free,
};

int store_pg_new(const struct store_pg_opts *o, struct worker_pool *pool, struct loop *const *loops,
                 unsigned nloops, struct store **ret, char *why, size_t why_len)
{
    struct store_pg *st;
    int err;

    if (why && why_len)
        why[0] = '\0';
    if (!pool || o->timeout_ms == 0 || !loops || nloops == 0)
        return -EINVAL;
    for (unsigned i = 0; i < nloops; i++) {
        if (!loops[i])
            return -EINVAL;
    }
    err = pg_url_check(o->url, why, why_len);
    if (err < 0)
        return err;
    st = calloc(1, sizeof(*st));
    if (!st)
        return -ENOMEM;
    st->base.ops = &pg_ops;
    st->pool = pool;
    st->timeout_ms = o->timeout_ms;
    st->reap_ms = o->reap_interval_ms ? o->reap_interval_ms : TICK_MS;
    atomic_init(&st->durable, -1);
    pthread_mutex_init(&st->log_mu, NULL);
    pthread_mutex_init(&st->addr_mu, NULL);
    pg_url_redact(o->url, st->name, sizeof(st->name));
    st->url = strdup(o->url);
    st->password = o->password ? strdup(o->password) : NULL;
    err = !st->url || (o->password && !st->password) ? -ENOMEM : 0;
    if (err == 0) {
        st->names = store_pg_has_names(st->url);
        store_pg_look_up(st); /* here, before any loop runs; then every tick */
        err = check_schema(st, why, why_len);
    }
    if (err == 0)
        err = store_pg_lanes_start(st, loops, nloops);
    /* The first tick at once (it waits for the first loop to start): /readyz
     * should not wait a whole interval. */
    if (err == 0)
        err = worker_every_start(pool, 0, TICK_MS, tick, st, &st->pinger);
    if (err < 0) {
        pg_free(&st->base);
        return err;
    }
    *ret = &st->base;
    return 0;
}
