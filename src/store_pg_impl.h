/* SPDX-License-Identifier: MIT */
/* What the PostgreSQL store's files share: store_pg.c (the operations, the
 * statements' parameters and answers, readiness, the expired-row job, the
 * store's life), store_pg_link.c (the connections, one per loop and a
 * service one, and the statements in flight on them) and store_pg_admin.c
 * (inspect, purge, list, resolve, probe). Not an interface: the rest of the
 * program sees store.h and store_pg.h only. */
#ifndef IDEMPROXY_STORE_PG_IMPL_H
#define IDEMPROXY_STORE_PG_IMPL_H

#include <arpa/inet.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>

#include "idemproxy/buf.h"
#include "idemproxy/list.h"
#include "idemproxy/loop.h"
#include "idemproxy/pg_url.h"
#include "idemproxy/store.h"
#include "sql_scripts.h"
#include "store_impl.h"

#define PG_TABLE "idemproxy_keys"
#define PG_CHANNEL "idemproxy_done" /* the statements NOTIFY it with the key: --wait */
#define PG_SCHEMA_FILE "contrib/postgresql/schema.sql"
/* True when the table is there as this version needs it (a table made
 * before resource links lacks their column: schema.sql adds it). */
#define PG_HAVE_SCHEMA                                                                             \
    "(to_regclass('" PG_TABLE "') IS NOT NULL AND (SELECT count(*) = 7 FROM pg_attribute WHERE "   \
    "attrelid = to_regclass('" PG_TABLE "') AND attname IN ('resource', 'answer_until', "          \
    "'probes', 'probe_next', 'probe_result', 'absent_at', 'trace') AND NOT attisdropped))"
#define PG_MAX_PARAMS 9
#define PG_HEAD_MAX (64u << 20) /* far above what RECORD_MAX_HEADERS headers can need */

struct store_pg;
struct pg_op;

/* Reads the answer of <op>: <err> 0 and <res> its statement's result (a
 * successful one), or a negative errno and <res> NULL. Calls the op's
 * caller back, unless it sets op->resend (sent again, not freed). */
typedef void pg_op_fn(struct pg_op *op, int err, const PGresult *res);

/* One accepted operation: a prepared statement and its parameters, owned by
 * the store until it calls back. */
struct pg_op {
    struct store_pg *st;
    struct list_node node; /* on a lane's queue, waiting or sent list */
    enum sql_script_id stmt;
    pg_op_fn *fn;
    store_done_fn *done;      /* the hot operations, purge and resolve */
    store_list_fn *list_done; /* inspect and list_unknown */
    void *ctx;
    bool service;         /* goes on the service connection (the operator's, the jobs') */
    bool sent;            /* written to a connection at least once */
    bool give_back;       /* a release of a failed acquire: waits out failures until its deadline */
    bool resend;          /* set by <fn>: send it again */
    bool ended;           /* its statement's results have ended; its batch's sync comes next */
    unsigned tries;       /* sends so far */
    uint64_t life_ms;     /* its deadline's distance from the submit; 0: --store-timeout */
    uint64_t deadline_ms; /* it fails with -ETIMEDOUT from here */
    PGresult *res;        /* its statement's result, kept until its sync */
    int nparams;
    const char *values[PG_MAX_PARAMS];
    int lengths[PG_MAX_PARAMS];
    int formats[PG_MAX_PARAMS];
    char nums[4][24]; /* decimal parameters */
    struct store_token tok;
    uint8_t fp[32];
    uint64_t ttl_ms;             /* acquire: the lease, a give-back's life */
    char trace[STORE_TRACE_LEN]; /* acquire: the lock's trace context, a parameter */
    struct buf head;             /* complete, resolve: the encoded head; acquire, unknown: about;
                                    inspect, list: the text parameters */
    struct record *rec;          /* complete, resolve: own reference; its body is a parameter */
    char *resource;              /* complete: owned, the resource its answer created; NULL: none */
    bool with_body;              /* inspect */
    struct span prefix;          /* inspect, list_unknown: in <head> */
    size_t key_len;
    char key[];
};

enum pg_lane_state {
    LANE_DOWN,       /* no connection: one is made when an op comes, after the backoff */
    LANE_CONNECTING, /* PQconnectPoll() under way */
    LANE_CHECKING,   /* asked whether the table is there, and what the server is */
    LANE_CREATING,   /* the table was not there: the schema is being created */
    LANE_PREPARING,  /* in pipeline mode, the statements being prepared */
    LANE_READY,      /* ops go out */
};

/* One connection, driven by one loop: each loop's for the hot operations,
 * and the service one on the first loop. Everything below <stopping>
 * belongs to the loop thread (or, once the loop has stopped, the thread
 * freeing the store). */
struct pg_lane {
    struct store_pg *st;
    struct loop *loop; /* borrowed */
    bool service;
    struct loop_timer timer; /* registered on <loop> for good */
    struct loop_task task;   /* posted when <queue> stops being empty */
    pthread_mutex_t mu;
    struct list queue; /* guarded by mu: struct pg_op from other threads */
    bool posted;       /* guarded by mu: <task> is posted */
    bool stopping;     /* guarded by mu: refuse ops from other threads */
    bool draining;     /* the store is being freed: give-backs wait out no backoff */
    PGconn *conn;
    struct loop_watch watch; /* fd -1: not watched */
    uint32_t events;
    enum pg_lane_state state;
    uint64_t connect_deadline_ms;
    unsigned rotate;      /* the store's <rotate> its connect started from */
    uint64_t retry_at_ms; /* no connect attempt before this */
    uint64_t backoff_ms;  /* the wait after the last failure; 0: it worked */
    int last_err;         /* what ops get inside the backoff */
    bool need_create;     /* the check found no table: the schema is sent next */
    char setup_why[640];  /* a setup step's failure, for the log */
    struct list waiting;  /* struct pg_op not sent yet */
    struct list sent;     /* struct pg_op sent, in the order their answers come */
    bool batch_failed;    /* an error came for the batch in flight after its ops' results */
};

/* Where a lane connects: libpq's host, hostaddr and port lists (store_pg_hosts.c). */
struct pg_target {
    char host[PG_URL_MAX_HOSTS * (PG_URL_HOST_MAX + 1)];
    char hostaddr[PG_URL_MAX_HOSTS * (INET6_ADDRSTRLEN + 1)];
    char port[PG_URL_MAX_HOSTS * 9];
};

struct store_pg {
    struct store base;
    struct worker_pool *pool; /* borrowed */
    char *url;                /* owned */
    char *password;           /* owned; NULL: the URL's, or libpq's PGPASSFILE */
    char name[512];           /* the URL with its passwords hidden: what the log calls it */
    uint64_t timeout_ms;
    uint64_t reap_ms;
    bool names;         /* the URL names hosts to look up (store_pg_hosts.c); set once */
    atomic_uint rotate; /* connects start from the URL's host of this index: the hosts
                           before it hung a connect */
    pthread_mutex_t addr_mu;
    char addrs[PG_URL_MAX_HOSTS][INET6_ADDRSTRLEN]; /* under addr_mu: each host's last address */
    char resolve_why[400];                          /* under addr_mu: the last lookup's failure */
    atomic_bool up;     /* the last ping answered, and no connection failed since */
    atomic_int durable; /* 1: fsync and synchronous_commit on, as the last setup read; -1: unread */
    atomic_bool stopping;         /* refuse ops called on a loop thread */
    atomic_uint releases_pending; /* give-backs of acquires that failed, under way */
    atomic_bool reaping;          /* a run of the expired-row job is under way */
    uint64_t next_reap_ms;        /* the tick (one at a time) starts the job again then */
    atomic_ullong reaped;         /* expired rows deleted by this proxy */
    store_notify_fn *_Atomic notify_fn;
    void *_Atomic notify_ctx;
    pthread_mutex_t log_mu;
    char logged_why[700];  /* the last failure logged, "" once connected again */
    struct pg_lane *lanes; /* owned array: one per loop, then the service lane */
    unsigned nlanes;
    struct worker_every *pinger; /* owned: the ping and the expired-row job */
};

static inline struct store_pg *store_pg_of(struct store *st) { return (struct store_pg *)st; }

/* ---- store_pg_link.c ---- */

/* The lanes of <st>: one per loop of <loops>, and the service lane on the
 * first, each with its timer registered. Returns 0 or -ENOMEM. */
int store_pg_lanes_start(struct store_pg *st, struct loop *const *loops, unsigned nloops);

/* Refuses new ops, then runs each lane until every op it accepted has
 * called back, and closes its connection: on its loop's thread, or on this
 * one once that loop has stopped. Then frees the lanes. */
void store_pg_lanes_stop(struct store_pg *st);

/* A new op of <stmt> on <key>, calling <fn> with its answer. Returns 0 with
 * it in <ret>, or -ENOMEM. */
int store_pg_op_new(struct store_pg *st, enum sql_script_id stmt, struct span key, pg_op_fn *fn,
                    struct pg_op **ret);

/* Adds a parameter to <op>: text (NUL-terminated), bytes, or <v> in
 * decimal, written into op->nums[<slot>]. Each borrowed until it calls back. */
void store_pg_param_text(struct pg_op *op, const char *v);
void store_pg_param_bin(struct pg_op *op, const void *v, size_t n);
void store_pg_param_num(struct pg_op *op, int slot, uint64_t v);

/* Adds <rec>'s encoded head (into op->head) and its body as the next two
 * parameters; <op> keeps a reference. Returns 0, -E2BIG or -ENOMEM. */
int store_pg_param_record(struct pg_op *op, struct record *rec);

/* Frees an op never submitted, or one that called back. NULL-safe. */
void store_pg_op_free(struct pg_op *op);

/* Hands <op> to a connection: the calling loop's own, or (from any other
 * thread, or <op>->service) the first loop's or the service one; never
 * calls back inside. Returns 0, or -ECANCELED (stopping: <op> is freed and
 * nothing calls back). */
int store_pg_op_submit(struct pg_op *op);

/* A statement's failure <res> as an errno: -ECONNRESET for a server going
 * away or a standby, -EACCES, -ETIMEDOUT, else -EPROTO. Logs why. */
int store_pg_result_err(struct store_pg *st, const PGresult *res);

/* Logs <why> about <st> once (warn), until store_pg_log_ok() says it is
 * answering again (info). */
void store_pg_log_failure(struct store_pg *st, const char *why);
void store_pg_log_ok(struct store_pg *st);

/* The store's last_failure op: "PostgreSQL <name>: <the failure logged>", or "". */
void store_pg_last_failure(struct store *base, char *buf, size_t len);

/* ---- store_pg_hosts.c ---- */

/* True when <url> names hosts to look up (and gives no hostaddr itself). */
bool store_pg_has_names(const char *url);

/* Looks the URL's host names up (blocking: never on a loop thread). */
void store_pg_look_up(struct store_pg *st);

/* Where to connect now, into <t>: the URL's hosts from its <rotate>th on
 * (a connect that hung on one host starts from the next), names given
 * their addresses. Returns 0: the URL as it is (nothing to look up or
 * reorder); 1: <t>'s lists; -ENXIO with why when no host name resolves. */
int store_pg_target(struct store_pg *st, unsigned rotate, struct pg_target *t, char *why,
                    size_t why_len);

/* ---- store_pg.c ---- */

/* The expired-row job's answer: <n> rows deleted. */
void store_pg_reaped(struct store_pg *st, uint64_t n, bool more);

/* ---- store_pg_admin.c: store.h's operator calls, and probe ---- */

int store_pg_inspect(struct store *base, struct span prefix, struct span key, bool with_body,
                     store_list_fn *done, void *ctx);
int store_pg_purge(struct store *base, struct span store_key, size_t prefix_len,
                   store_done_fn *done, void *ctx);
int store_pg_find_resource(struct store *base, struct span prefix, struct span resource,
                           bool with_body, store_list_fn *done, void *ctx);
int store_pg_list_unknown(struct store *base, struct span prefix, const char *cursor,
                          store_list_fn *done, void *ctx);
int store_pg_probe(struct store *base, struct span store_key, const struct store_probe *p,
                   store_done_fn *done, void *ctx);
int store_pg_resolve(struct store *base, struct span store_key, struct record *rec, uint64_t ttl_ms,
                     store_done_fn *done, void *ctx);

/* Big-endian integers of a binary result, and a field as a span. */
uint64_t store_pg_u64(const PGresult *res, int row, int col);
struct span store_pg_field(const PGresult *res, int row, int col);

#endif
