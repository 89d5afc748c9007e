/* SPDX-License-Identifier: MIT */
/* The PostgreSQL store's connections (store_pg_impl.h): one per event loop
 * for the hot operations and a service one on the first loop, each driven
 * by its loop with libpq's asynchronous API. A connection is made with
 * PQconnectStartParams() and PQconnectPoll(), then set up without a
 * pipeline (is the table there, what the server is; the schema when it is
 * missing), then enters pipeline mode and prepares the statements (and the
 * service connection LISTENs). A loop's connection sends the ops that wait
 * as one batch: their statements and one sync, so one transaction and one
 * commit (one WAL flush) for all, answered only once committed; the next
 * batch goes when its answer is in. The service connection sends each op
 * with its own sync. Answers come back in order. A connection that fails is made again with
 * backoff; ops waiting inside the backoff fail fast, and an op sent on it fails (an acquire's lock
 * is given back: store_pg.c). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "idemproxy/log.h"
#include "idemproxy/record.h"
#include "store_pg_impl.h"

#define BATCH_MAX 64 /* ops in one transaction, at most */
#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 1000
#define CONNECT_MIN_MS 5000 /* a connect (TLS, several hosts) may take longer than an op */
#define CHECK_SQL                                                                                  \
    "SELECT " PG_HAVE_SCHEMA ", current_setting('fsync') = 'on' AND "                              \
    "current_setting('synchronous_commit') <> 'off', pg_is_in_recovery()"

static void lane_dispatch(struct pg_lane *ln);
static void lane_drop(struct pg_lane *ln, int err, const char *why);

static struct pg_op *op_first(const struct list *l)
{
    struct list_node *n = list_first(l);

    return n ? list_entry(n, struct pg_op, node) : NULL;
}

int store_pg_op_new(struct store_pg *st, enum sql_script_id stmt, struct span key, pg_op_fn *fn,
                    struct pg_op **ret)
{
    struct pg_op *op = calloc(1, sizeof(*op) + key.len + 1);

    if (!op)
        return -ENOMEM;
    op->st = st;
    op->stmt = stmt;
    op->fn = fn;
    op->head = BUF_INIT(PG_HEAD_MAX);
    if (key.len)
        memcpy(op->key, key.base, key.len);
    op->key_len = key.len;
    *ret = op;
    return 0;
}

void store_pg_op_free(struct pg_op *op)
{
    if (!op)
        return;
    PQclear(op->res);
    record_unref(op->rec);
    buf_done(&op->head);
    free(op->resource);
    free(op);
}

void store_pg_param_text(struct pg_op *op, const char *v)
{
    int i = op->nparams++;

    op->values[i] = v;
    op->lengths[i] = 0;
    op->formats[i] = 0;
}

void store_pg_param_bin(struct pg_op *op, const void *v, size_t n)
{
    int i = op->nparams++;

    op->values[i] = n ? v : "";
    op->lengths[i] = (int)n;
    op->formats[i] = 1;
}

void store_pg_param_num(struct pg_op *op, int slot, uint64_t v)
{
    snprintf(op->nums[slot], sizeof(op->nums[slot]), "%llu", (unsigned long long)v);
    store_pg_param_text(op, op->nums[slot]);
}

int store_pg_param_record(struct pg_op *op, struct record *rec)
{
    int err = record_encode_head(rec, &op->head);

    if (err < 0)
        return err;
    op->rec = record_ref(rec);
    store_pg_param_bin(op, op->head.data, op->head.len);
    store_pg_param_bin(op, rec->body.data, rec->body.len);
    return 0;
}

/* ---- the log ---- */

void store_pg_log_failure(struct store_pg *st, const char *why)
{
    bool news;

    pthread_mutex_lock(&st->log_mu);
    news = strcmp(st->logged_why, why) != 0;
    if (news)
        snprintf(st->logged_why, sizeof(st->logged_why), "%s", why);
    pthread_mutex_unlock(&st->log_mu);
    if (news)
        log_warn("PostgreSQL %s: %s", st->name, why);
}

void store_pg_last_failure(struct store *base, char *buf, size_t len)
{
    struct store_pg *st = store_pg_of(base);

    pthread_mutex_lock(&st->log_mu);
    snprintf(buf, len, "%s%s%s", st->logged_why[0] ? "PostgreSQL " : "",
             st->logged_why[0] ? st->name : "", st->logged_why[0] ? ": " : "");
    if (st->logged_why[0])
        snprintf(buf + strlen(buf), len - strlen(buf), "%s", st->logged_why);
    pthread_mutex_unlock(&st->log_mu);
}

void store_pg_log_ok(struct store_pg *st)
{
    bool was_down;

    pthread_mutex_lock(&st->log_mu);
    was_down = st->logged_why[0] != '\0';
    st->logged_why[0] = '\0';
    pthread_mutex_unlock(&st->log_mu);
    if (was_down)
        log_info("PostgreSQL %s: answering again", st->name);
}

/* libpq's message <msg> on one line, without its line ends. */
static void one_line(const char *msg, char *out, size_t len)
{
    size_t n = 0;

    for (const char *p = msg ? msg : ""; *p && n + 1 < len; p++)
        out[n++] = *p == '\n' || *p == '\r' || *p == '\t' ? ' ' : *p;
    while (n > 0 && out[n - 1] == ' ')
        n--;
    out[n] = '\0';
}

int store_pg_result_err(struct store_pg *st, const PGresult *res)
{
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    char why[400];

    one_line(res ? PQresultErrorMessage(res) : "no answer", why, sizeof(why));
    if (!state)
        state = "";
    /* 08: the connection; 57P0x: the server shutting down or starting; 25006: a standby */
    if (strncmp(state, "08", 2) == 0 || strncmp(state, "57P0", 4) == 0 ||
        strcmp(state, "25006") == 0)
        return -ECONNRESET;
    store_pg_log_failure(st, why);
    if (strcmp(state, "42501") == 0)
        return -EACCES;
    if (strcmp(state, "57014") == 0)
        return -ETIMEDOUT;
    return -EPROTO;
}

/* ---- ops ---- */

/* Calls <op> back with <err> or <res>, and frees it (unless its reader asks
 * for it to be sent again). */
static void op_finish(struct pg_lane *ln, struct pg_op *op, int err, const PGresult *res)
{
    op->fn(op, err, err == 0 ? res : NULL);
    if (op->resend) {
        op->resend = false;
        if (!atomic_load(&ln->st->stopping)) {
            op->ended = false;
            PQclear(op->res);
            op->res = NULL;
            list_append(&ln->waiting, &op->node);
            return;
        }
        op->fn(op, -ECANCELED, NULL); /* the store is stopping: it calls back now */
    }
    store_pg_op_free(op);
}

/* Fails every op of <l> with <err>. Takes the list first: a callback may
 * submit again. */
static void op_list_fail(struct pg_lane *ln, struct list *l, int err)
{
    struct list taken;
    struct pg_op *op;

    list_init(&taken);
    list_splice(&taken, l);
    while ((op = op_first(&taken))) {
        list_remove(&op->node);
        op_finish(ln, op, err, NULL);
    }
}

/* The lane an op goes to: the calling loop's, or the first loop's (the
 * service lane for <service> ops). */
static struct pg_lane *lane_for(struct store_pg *st, bool service)
{
    struct loop *cur = loop_current();

    if (service)
        return &st->lanes[st->nlanes - 1];
    for (unsigned i = 0; cur && i + 1 < st->nlanes; i++) {
        if (st->lanes[i].loop == cur)
            return &st->lanes[i];
    }
    return &st->lanes[0];
}

/* Has <ln>'s loop look at it at its next turn: its timer, due now. */
static void lane_kick(struct pg_lane *ln) { ln->timer.due_ms = 0; }

int store_pg_op_submit(struct pg_op *op)
{
    struct store_pg *st = op->st;
    struct pg_lane *ln = lane_for(st, op->service);
    bool post;

    op->deadline_ms = now_ms() + (op->life_ms ? op->life_ms : st->timeout_ms);
    if (loop_on_thread(ln->loop)) {
        if (atomic_load(&st->stopping)) {
            store_pg_op_free(op);
            return -ECANCELED;
        }
        list_append(&ln->waiting, &op->node);
        lane_kick(ln); /* sent at the end of this turn, with the others of this turn */
        return 0;
    }
    pthread_mutex_lock(&ln->mu);
    if (ln->stopping) {
        pthread_mutex_unlock(&ln->mu);
        store_pg_op_free(op);
        return -ECANCELED;
    }
    list_append(&ln->queue, &op->node);
    post = !ln->posted;
    ln->posted = true;
    pthread_mutex_unlock(&ln->mu);
    if (post && loop_post(ln->loop, &ln->task) < 0) {
        /* The loop has stopped: the store is being freed, which runs the lane. */
        pthread_mutex_lock(&ln->mu);
        ln->posted = false;
        pthread_mutex_unlock(&ln->mu);
    }
    return 0;
}

/* Takes the ops queued by other threads. */
static void lane_take_queue(struct pg_lane *ln)
{
    pthread_mutex_lock(&ln->mu);
    list_splice(&ln->waiting, &ln->queue);
    ln->posted = false;
    pthread_mutex_unlock(&ln->mu);
}

static uint64_t lane_next_due(const struct pg_lane *ln);

/* Has the timer come no later than what <ln> must be looked at for next. */
static void lane_arm(struct pg_lane *ln)
{
    uint64_t due = lane_next_due(ln);

    if (due < ln->timer.due_ms)
        ln->timer.due_ms = due;
}

static void on_task(void *ctx)
{
    struct pg_lane *ln = ctx;

    lane_take_queue(ln);
    lane_dispatch(ln);
    lane_arm(ln);
}

/* ---- the connection ---- */

/* Watches the connection's socket for <events>; <fresh>: registers it anew
 * (while connecting, libpq may have closed it and opened another under the
 * same number). */
static void lane_watch(struct pg_lane *ln, uint32_t events, bool fresh)
{
    int fd = ln->conn ? PQsocket(ln->conn) : -1;

    if (ln->watch.fd >= 0 && (fresh || fd != ln->watch.fd)) {
        loop_watch_del(ln->loop, &ln->watch);
        ln->watch.fd = -1;
    }
    if (fd < 0)
        return;
    if (ln->watch.fd < 0) {
        ln->watch.fd = fd;
        if (loop_watch_add(ln->loop, &ln->watch, events) < 0) {
            ln->watch.fd = -1;
            return;
        }
    } else if (events != ln->events) {
        (void)loop_watch_mod(ln->loop, &ln->watch, events);
    }
    ln->events = events;
}

static void backoff_start(struct pg_lane *ln)
{
    ln->backoff_ms = ln->backoff_ms ? ln->backoff_ms * 2 : BACKOFF_FIRST_MS;
    if (ln->backoff_ms > BACKOFF_MAX_MS)
        ln->backoff_ms = BACKOFF_MAX_MS;
    ln->retry_at_ms = now_ms() + ln->backoff_ms;
}

/* Gives the connection up: what was sent on it fails with <err> (its
 * answer is lost); what waits stays for the next one, or fails fast inside
 * the backoff. */
static void lane_drop(struct pg_lane *ln, int err, const char *why)
{
    if (ln->watch.fd >= 0) {
        loop_watch_del(ln->loop, &ln->watch);
        ln->watch.fd = -1;
    }
    PQfinish(ln->conn);
    ln->conn = NULL;
    ln->state = LANE_DOWN;
    ln->last_err = err;
    ln->batch_failed = false; /* of the batch lost with the connection */
    atomic_store(&ln->st->up, false);
    if (why && why[0])
        store_pg_log_failure(ln->st, why);
    backoff_start(ln);
    op_list_fail(ln, &ln->sent, err);
    lane_kick(ln);
}

/* libpq's error on <ln>'s connection, as its errno: a host name that does
 * not resolve, a refused connection, a password refused. */
static int conn_err(PGconn *conn, const char *msg)
{
    if (strstr(msg, "could not translate host name"))
        return -ENXIO;
    if (strstr(msg, "password authentication failed") || strstr(msg, "no password supplied") ||
        strstr(msg, "permission denied"))
        return -EACCES;
    if (strstr(msg, "Connection refused"))
        return -ECONNREFUSED;
    (void)conn;
    return -ECONNRESET;
}

static void connect_failed(struct pg_lane *ln, const char *what)
{
    char why[512];
    int err;

    one_line(ln->conn ? PQerrorMessage(ln->conn) : "out of memory", why, sizeof(why));
    err = conn_err(ln->conn, why);
    if (what)
        snprintf(why, sizeof(why), "%s", what);
    lane_drop(ln, err, why);
}

static void lane_connect(struct pg_lane *ln)
{
    struct store_pg *st = ln->st;
    const char *keys[8], *vals[8];
    struct pg_target t;
    char why[400];
    int n = 0, r;

    ln->rotate = atomic_load(&st->rotate);
    r = store_pg_target(st, ln->rotate, &t, why, sizeof(why));

    if (r < 0) {
        lane_drop(ln, r, why);
        return;
    }
    keys[n] = "dbname", vals[n++] = st->url; /* the URL, its parameters: the later keys beat it */
    if (r == 1) {
        keys[n] = "host", vals[n++] = t.host;
        keys[n] = "hostaddr", vals[n++] = t.hostaddr;
        keys[n] = "port", vals[n++] = t.port;
    }
    if (st->password) /* else the URL's, or libpq's PGPASSFILE */
        keys[n] = "password", vals[n++] = st->password;
    keys[n] = "fallback_application_name", vals[n++] = "idemproxy";
    keys[n] = vals[n] = NULL;
    ln->conn = PQconnectStartParams(keys, vals, 1);
    if (!ln->conn || PQstatus(ln->conn) == CONNECTION_BAD) {
        connect_failed(ln, NULL);
        return;
    }
    ln->state = LANE_CONNECTING;
    ln->connect_deadline_ms =
        now_ms() + (st->timeout_ms > CONNECT_MIN_MS ? st->timeout_ms : CONNECT_MIN_MS);
    lane_watch(ln, EPOLLOUT, true); /* PQconnectPoll() starts as if it had said writing */
}

/* The statements prepared on every connection: all but the schema. */
static bool is_prepared(enum sql_script_id id) { return id != SQL_SCHEMA; }

static void stmt_name(enum sql_script_id id, char *out, size_t len)
{
    snprintf(out, len, "idemproxy_%s", sql_scripts[id].name);
}

/* Pipeline mode, and the statements prepared (the service lane also
 * LISTENs), all in one round trip. */
static void setup_prepare(struct pg_lane *ln)
{
    char name[64];
    bool ok = PQenterPipelineMode(ln->conn) == 1;

    for (int i = 0; ok && i < _SQL_MAX; i++) {
        if (!is_prepared((enum sql_script_id)i))
            continue;
        stmt_name((enum sql_script_id)i, name, sizeof(name));
        ok = PQsendPrepare(ln->conn, name, sql_scripts[i].src, 0, NULL) == 1;
    }
    if (ok && ln->service)
        ok = PQsendQueryParams(ln->conn, "LISTEN " PG_CHANNEL, 0, NULL, NULL, NULL, NULL, 0) == 1;
    if (ok)
        ok = PQpipelineSync(ln->conn) == 1;
    if (!ok) {
        connect_failed(ln, NULL);
        return;
    }
    ln->setup_why[0] = '\0';
    ln->state = LANE_PREPARING;
}

/* The connection is up: asks whether the table is there, and what the server is. */
static void setup_start(struct pg_lane *ln)
{
    if (PQsetnonblocking(ln->conn, 1) != 0 || PQsendQuery(ln->conn, CHECK_SQL) != 1) {
        connect_failed(ln, NULL);
        return;
    }
    ln->setup_why[0] = '\0';
    ln->state = LANE_CHECKING;
}

static void lane_ready(struct pg_lane *ln)
{
    ln->state = LANE_READY;
    ln->backoff_ms = 0;
    ln->last_err = 0;
    atomic_store(&ln->st->up, true);
    store_pg_log_ok(ln->st);
    lane_dispatch(ln);
}

/* One result of the setup step under way: kept in setup_why when it failed. */
static void setup_result(struct pg_lane *ln, PGresult *r)
{
    struct store_pg *st = ln->st;
    ExecStatusType s = PQresultStatus(r);

    if (s == PGRES_FATAL_ERROR || s == PGRES_PIPELINE_ABORTED) {
        if (!ln->setup_why[0]) {
            char msg[300];
            const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);

            one_line(PQresultErrorMessage(r), msg, sizeof(msg));
            if (ln->state == LANE_CREATING && state && strcmp(state, "42501") == 0)
                snprintf(ln->setup_why, sizeof(ln->setup_why),
                         "the table " PG_TABLE " is missing, or lacks a column of this version, "
                         "and this role may not create or change it (%s): have it created or "
                         "brought up to date with " PG_SCHEMA_FILE
                         " (/usr/share/idemproxy/postgresql/schema.sql)",
                         msg);
            else
                snprintf(ln->setup_why, sizeof(ln->setup_why), "%s", msg);
        }
    } else if (ln->state == LANE_CHECKING && s == PGRES_TUPLES_OK && PQntuples(r) == 1) {
        bool have = PQgetvalue(r, 0, 0)[0] == 't', standby = PQgetvalue(r, 0, 2)[0] == 't';

        atomic_store(&st->durable, PQgetvalue(r, 0, 1)[0] == 't' ? 1 : 0);
        if (standby)
            snprintf(ln->setup_why, sizeof(ln->setup_why),
                     "the server is a standby (read-only): name the primary, or list every host "
                     "with target_session_attrs=read-write");
        else if (!have)
            ln->need_create = true; /* sent when this step ends */
    }
    PQclear(r);
}

/* The setup step under way has ended: the next one. */
static void setup_step_done(struct pg_lane *ln)
{
    if (ln->setup_why[0]) {
        lane_drop(ln, strstr(ln->setup_why, "may not create") ? -EACCES : -ECONNREFUSED,
                  ln->setup_why);
        return;
    }
    if (ln->state == LANE_CHECKING && ln->need_create) {
        ln->need_create = false;
        if (PQsendQuery(ln->conn, sql_scripts[SQL_SCHEMA].src) != 1) {
            connect_failed(ln, NULL);
            return;
        }
        ln->state = LANE_CREATING;
        return;
    }
    if (ln->state == LANE_CREATING)
        log_info("PostgreSQL %s: created the table " PG_TABLE " (" PG_SCHEMA_FILE ")",
                 ln->st->name);
    setup_prepare(ln);
}

/* ---- reading and writing ---- */

/* Hands the notifications read to the --wait listener. */
static void read_notifies(struct pg_lane *ln)
{
    store_notify_fn *fn = atomic_load(&ln->st->notify_fn);
    void *ctx = atomic_load(&ln->st->notify_ctx);
    PGnotify *n;

    while (ln->conn && (n = PQnotifies(ln->conn))) {
        if (fn && n->extra)
            fn(ctx, span_from_cstr(n->extra));
        PQfreemem(n);
    }
}

/* The answer of <op> has come whole (its sync): calls it back. */
static void op_answered(struct pg_lane *ln, struct pg_op *op)
{
    ExecStatusType s = op->res ? PQresultStatus(op->res) : PGRES_FATAL_ERROR;
    int err = 0;

    list_remove(&op->node);
    if (s != PGRES_TUPLES_OK && s != PGRES_COMMAND_OK)
        err = store_pg_result_err(ln->st, op->res);
    op_finish(ln, op, err, op->res);
    if (err == -ECONNRESET && ln->conn) /* the server is going away, or is a standby now */
        lane_drop(ln, err, "the server stopped answering for the primary");
}

/* The first op sent whose results have not ended: the one the next result
 * is for; NULL: all have (the batch's sync comes next). */
static struct pg_op *op_reading(const struct pg_lane *ln)
{
    if (ln->service) { /* each op has a sync of its own: the next result is the first's */
        struct pg_op *op = op_first(&ln->sent);

        return op && !op->ended ? op : NULL;
    }
    for (struct list_node *n = list_first(&ln->sent); n; n = list_next(&ln->sent, n)) {
        struct pg_op *op = list_entry(n, struct pg_op, node);

        if (!op->ended)
            return op;
    }
    return NULL;
}

static void batch_answered(struct pg_lane *ln);

/* Reads what has come: setup steps' results, or ops' answers in order. */
static void lane_read(struct pg_lane *ln)
{
    int nulls = 0;

    while (ln->conn && ln->state >= LANE_CHECKING && !PQisBusy(ln->conn)) {
        PGresult *r;
        struct pg_op *op = op_reading(ln);

        if (ln->state == LANE_READY && list_is_empty(&ln->sent))
            break;
        r = PQgetResult(ln->conn);
        if (!r) {
            if (ln->state == LANE_CHECKING || ln->state == LANE_CREATING) {
                setup_step_done(ln);
                continue;
            }
            if (++nulls > 1)
                break; /* the next result has not come yet */
            if (op && op->res)
                op->ended = true; /* a NULL ends each statement's results */
            continue;
        }
        nulls = 0;
        if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
            PQclear(r);
            if (ln->state == LANE_PREPARING) {
                if (ln->setup_why[0])
                    lane_drop(ln, -EPROTO, ln->setup_why);
                else
                    lane_ready(ln);
            } else {
                batch_answered(ln);
            }
            continue;
        }
        if (ln->state != LANE_READY) {
            setup_result(ln, r);
        } else if (op && !op->res) {
            op->res = r;
        } else {
            /* After the batch's statements: its commit failed (nothing of it
             * was committed). */
            if (!op && PQresultStatus(r) == PGRES_FATAL_ERROR)
                ln->batch_failed = true;
            PQclear(r);
        }
    }
    if (ln->conn && ln->service)
        read_notifies(ln);
}

/* Writes what libpq holds; watches for room when it could not. */
static void lane_flush(struct pg_lane *ln)
{
    int r = PQflush(ln->conn);

    if (r < 0) {
        connect_failed(ln, NULL);
        return;
    }
    lane_watch(ln, EPOLLIN | (r == 1 ? EPOLLOUT : 0), false);
}

/* Whether <res> (an op's answer within its batch) is a success. */
static bool res_ok(const PGresult *res)
{
    ExecStatusType s = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;

    return s == PGRES_TUPLES_OK || s == PGRES_COMMAND_OK;
}

/* Whether <res> is an op's own failure, to be its answer; else (skipped
 * after another's failure, rolled back, a deadlock or a serialization
 * failure: SQLSTATE class 40) the op is sent again. */
static bool res_failed_itself(const PGresult *res)
{
    const char *state;

    if (!res || PQresultStatus(res) != PGRES_FATAL_ERROR)
        return false;
    state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    return !(state && strncmp(state, "40", 2) == 0);
}

/* The sync of the batch at the head of what was sent has come. All went
 * well: each op is answered. Else each op that failed itself is answered
 * with its failure, and the others go again, first, in the next batch
 * (nothing of the batch was committed). */
static void batch_answered(struct pg_lane *ln)
{
    struct list batch, again;
    struct pg_op *op;
    bool whole = !ln->batch_failed;

    ln->batch_failed = false;
    list_init(&batch);
    list_init(&again);
    while ((op = op_first(&ln->sent)) && op->ended) {
        list_remove(&op->node);
        list_append(&batch, &op->node);
        whole = whole && res_ok(op->res);
    }
    while ((op = op_first(&batch))) {
        if (whole || res_failed_itself(op->res)) {
            op_answered(ln, op);
            continue;
        }
        list_remove(&op->node);
        op->ended = false;
        PQclear(op->res);
        op->res = NULL;
        list_append(&again, &op->node);
    }
    list_splice(&again, &ln->waiting);
    list_splice(&ln->waiting, &again);
    lane_kick(ln); /* the next batch */
}

/* Sends <op>'s statement (its sync comes after). Returns false on failure. */
static bool send_one(struct pg_lane *ln, struct pg_op *op)
{
    char name[64];

    list_remove(&op->node);
    stmt_name(op->stmt, name, sizeof(name));
    op->sent = true;
    op->tries++;
    list_append(&ln->sent, &op->node);
    return PQsendQueryPrepared(ln->conn, name, op->nparams, op->values, op->lengths, op->formats,
                               1) == 1;
}

/* Whether <a>'s key sorts before <b>'s. */
static bool key_before(const struct pg_op *a, const struct pg_op *b)
{
    size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
    int c = memcmp(a->key, b->key, n);

    return c < 0 || (c == 0 && a->key_len < b->key_len);
}

/* The ops that wait, BATCH_MAX at most, into <batch> in the order of their
 * keys (stable): every loop's batch locks its rows in one order, so two
 * batches never wait for each other in a circle. Returns how many. */
static size_t batch_take(struct pg_lane *ln, struct pg_op **batch)
{
    size_t n = 0;
    struct pg_op *op;

    while (n < BATCH_MAX && (op = op_first(&ln->waiting))) {
        size_t i = n++;

        list_remove(&op->node);
        while (i > 0 && key_before(op, batch[i - 1])) {
            batch[i] = batch[i - 1];
            i--;
        }
        batch[i] = op;
    }
    return n;
}

/* Sends what waits: on a loop's lane one batch, when none is in flight (the
 * ops that come meanwhile make the next one); on the service lane every op
 * with its own sync. Then writes it all at once. */
static void lane_send(struct pg_lane *ln)
{
    struct pg_op *batch[BATCH_MAX], *op;
    bool ok = true;

    if (ln->service) {
        while (ok && ln->conn && (op = op_first(&ln->waiting)))
            ok = send_one(ln, op) && PQpipelineSync(ln->conn) == 1;
    } else if (list_is_empty(&ln->sent)) {
        size_t n = batch_take(ln, batch);

        for (size_t i = 0; i < n; i++) {
            list_append(&ln->waiting, &batch[i]->node); /* send_one() takes it from there */
            ok = ok && send_one(ln, batch[i]);
        }
        ok = ok && (n == 0 || PQpipelineSync(ln->conn) == 1);
    }
    if (!ok) {
        connect_failed(ln, NULL); /* which fails it with what was sent */
        return;
    }
    if (ln->conn)
        lane_flush(ln);
}

static void connect_poll(struct pg_lane *ln)
{
    switch (PQconnectPoll(ln->conn)) {
    case PGRES_POLLING_FAILED:
        connect_failed(ln, NULL);
        return;
    case PGRES_POLLING_READING:
        lane_watch(ln, EPOLLIN, true);
        return;
    case PGRES_POLLING_WRITING:
        lane_watch(ln, EPOLLOUT, true);
        return;
    default:
        lane_watch(ln, EPOLLIN, true);
        setup_start(ln);
        return;
    }
}

static void on_io(void *ctx, uint32_t events)
{
    struct pg_lane *ln = ctx;

    if (!ln->conn)
        return;
    if (ln->state == LANE_CONNECTING) {
        connect_poll(ln);
        return;
    }
    if (events & EPOLLOUT) {
        lane_flush(ln);
        if (!ln->conn)
            return;
    }
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
        if (PQconsumeInput(ln->conn) != 1) {
            connect_failed(ln, NULL);
            return;
        }
        lane_read(ln);
    }
    lane_dispatch(ln);
    lane_arm(ln);
}

/* ---- time ---- */

/* Fails the ops waiting whose deadline has come, and gives the connection
 * up when one sent on it has not been answered by its deadline. */
static void lane_expire(struct pg_lane *ln, uint64_t now)
{
    struct list expired;
    struct list_node *n, *tmp;

    if (ln->state > LANE_DOWN && ln->state < LANE_READY && now >= ln->connect_deadline_ms) {
        char why[400];

        unsigned used = ln->rotate;

        /* A host that swallows packets holds libpq's connect for good: every
         * lane's next try starts from the host after it (once, however
         * many lanes hung on it). */
        snprintf(why, sizeof(why), "no connection set up in time (%.300s did not answer)",
                 PQhost(ln->conn) ? PQhost(ln->conn) : "the server");
        atomic_compare_exchange_strong(&ln->st->rotate, &used, used + 1);
        lane_drop(ln, -ETIMEDOUT, why);
    }
    list_for_each_safe(&ln->sent, n, tmp)
    {
        if (list_entry(n, struct pg_op, node)->deadline_ms <= now) {
            lane_drop(ln, -ETIMEDOUT, "no answer within --store-timeout");
            break;
        }
    }
    list_init(&expired);
    list_for_each_safe(&ln->waiting, n, tmp)
    {
        if (list_entry(n, struct pg_op, node)->deadline_ms <= now) {
            list_remove(n);
            list_append(&expired, n);
        }
    }
    op_list_fail(ln, &expired, -ETIMEDOUT);
}

/* When <ln> must be looked at next: an op's deadline, the connect's, the
 * end of the backoff when ops wait. */
static uint64_t lane_next_due(const struct pg_lane *ln)
{
    uint64_t due = UINT64_MAX;
    const struct list *lists[] = { &ln->waiting, &ln->sent };

    for (size_t i = 0; i < ARRAY_SIZE(lists); i++) {
        for (struct list_node *n = list_first(lists[i]); n; n = list_next(lists[i], n)) {
            uint64_t d = list_entry(n, struct pg_op, node)->deadline_ms;

            due = d < due ? d : due;
        }
    }
    if (ln->state > LANE_DOWN && ln->state < LANE_READY && ln->connect_deadline_ms < due)
        due = ln->connect_deadline_ms;
    if (ln->state == LANE_DOWN && !list_is_empty(&ln->waiting) && ln->retry_at_ms < due)
        due = ln->retry_at_ms;
    return due;
}

static void on_timer(void *ctx)
{
    struct pg_lane *ln = ctx;

    ln->timer.due_ms = UINT64_MAX;
    lane_expire(ln, now_ms());
    lane_dispatch(ln);
    if (ln->timer.due_ms == UINT64_MAX) /* lane_kick() may have asked for sooner */
        ln->timer.due_ms = lane_next_due(ln);
}

/* Sends what waits, connects, or fails it fast inside the backoff (a
 * give-back waits out the backoff: it has a life of its own). */
static void lane_dispatch(struct pg_lane *ln)
{
    struct list failed;
    struct list_node *n, *tmp;

    if (list_is_empty(&ln->waiting))
        return;
    if (ln->state == LANE_READY) {
        lane_send(ln);
        return;
    }
    if (ln->state != LANE_DOWN)
        return; /* they wait for the connection under way */
    if (now_ms() >= ln->retry_at_ms) {
        lane_connect(ln);
        return;
    }
    list_init(&failed);
    list_for_each_safe(&ln->waiting, n, tmp)
    {
        if (ln->draining || !list_entry(n, struct pg_op, node)->give_back) {
            list_remove(n);
            list_append(&failed, n);
        }
    }
    op_list_fail(ln, &failed, ln->last_err ? ln->last_err : -ECONNREFUSED);
    if (ln->timer.due_ms > ln->retry_at_ms)
        ln->timer.due_ms = ln->retry_at_ms;
}

/* ---- life ---- */

int store_pg_lanes_start(struct store_pg *st, struct loop *const *loops, unsigned nloops)
{
    st->lanes = calloc(nloops + 1, sizeof(*st->lanes));
    if (!st->lanes)
        return -ENOMEM;
    st->nlanes = nloops + 1;
    for (unsigned i = 0; i < st->nlanes; i++) {
        struct pg_lane *ln = &st->lanes[i];

        ln->st = st;
        ln->loop = loops[i < nloops ? i : 0];
        ln->service = i == nloops;
        ln->timer = (struct loop_timer){ .fn = on_timer, .ctx = ln, .due_ms = UINT64_MAX };
        ln->task = (struct loop_task){ .fn = on_task, .ctx = ln };
        ln->watch = (struct loop_watch){ .fn = on_io, .ctx = ln, .fd = -1 };
        pthread_mutex_init(&ln->mu, NULL);
        list_init(&ln->queue);
        list_init(&ln->waiting);
        list_init(&ln->sent);
        loop_timer_add(ln->loop, &ln->timer);
    }
    return 0;
}

/* Runs <ln> here, waiting on its socket, until what it accepted has called
 * back: the store is being freed. */
static void lane_run_out(struct pg_lane *ln)
{
    while (!list_is_empty(&ln->waiting) || !list_is_empty(&ln->sent)) {
        uint64_t now = now_ms(), due;
        struct pollfd p;

        on_timer(ln);
        if (list_is_empty(&ln->waiting) && list_is_empty(&ln->sent))
            break;
        due = ln->timer.due_ms;
        p = (struct pollfd){ .fd = ln->conn ? PQsocket(ln->conn) : -1,
                             .events = (short)((ln->events & EPOLLIN ? POLLIN : 0) |
                                               (ln->events & EPOLLOUT ? POLLOUT : 0)) };
        now = now_ms();
        if (poll(&p, p.fd >= 0 ? 1 : 0, due > now ? (int)(due - now > 100 ? 100 : due - now) : 0) >
            0)
            on_io(ln, (p.revents & POLLIN ? EPOLLIN : 0) | (p.revents & POLLOUT ? EPOLLOUT : 0) |
                          (p.revents & (POLLERR | POLLHUP) ? EPOLLERR : 0));
    }
}

static void lane_stop(void *ctx)
{
    struct pg_lane *ln = ctx;

    pthread_mutex_lock(&ln->mu);
    ln->stopping = true;
    pthread_mutex_unlock(&ln->mu);
    lane_take_queue(ln);
    ln->draining = true;
    lane_run_out(ln);
    if (ln->watch.fd >= 0)
        loop_watch_del(ln->loop, &ln->watch);
    ln->watch.fd = -1;
    PQfinish(ln->conn);
    ln->conn = NULL;
    loop_timer_del(ln->loop, &ln->timer);
}

static void nothing(void *ctx) { (void)ctx; }

void store_pg_lanes_stop(struct store_pg *st)
{
    atomic_store(&st->stopping, true);
    for (unsigned i = 0; i < st->nlanes; i++)
        loop_call(st->lanes[i].loop, lane_stop, &st->lanes[i]);
    /* A task posted before a lane stopped runs after it: let it run out. */
    for (unsigned i = 0; i < st->nlanes; i++)
        loop_call(st->lanes[i].loop, nothing, NULL);
    for (unsigned i = 0; i < st->nlanes; i++)
        pthread_mutex_destroy(&st->lanes[i].mu);
    free(st->lanes);
    st->lanes = NULL;
    st->nlanes = 0;
}
