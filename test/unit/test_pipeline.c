/* SPDX-License-Identifier: MIT */
/* The pipeline's state machine (README.md, What it does with each request;
 * doc/architecture.md, A request's path), without sockets: requests are
 * built as the front end builds them, the store is the in-process memory
 * store (or a fake that fails), and the upstream is a fake forwarder that
 * answers at once, fails, or holds a request until the test lets it answer.
 * Every outcome of README.md, the lock released after an upstream failure,
 * the --wait hand-off, and the forwarded request's target and Host. */
#define _GNU_SOURCE /* memmem */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "idemproxy/config.h"
#include "idemproxy/config_file.h"
#include "idemproxy/log.h"
#include "idemproxy/pipeline.h"
#include "idemproxy/record.h"
#include "idemproxy/request.h"
#include "idemproxy/route.h"
#include "idemproxy/seal.h"
#include "idemproxy/store_memory.h"
#include "idemproxy/store_seal.h"
#include "idemproxy/worker.h"

/* ---- the fake upstream ---- */

enum fwd_mode { FWD_ANSWER, FWD_HOLD, FWD_REFUSE };

struct fwd {
    pthread_mutex_t mu;
    enum fwd_mode mode;
    unsigned status; /* FWD_ANSWER: the status answered */
    int calls;
    char last_target[256], last_host[256];
    upstream_done_fn *held_done; /* FWD_HOLD */
    void *held_ctx;
    void (*held_overdue)(void *ctx); /* what the held request asked for, if anything */
};

static struct fwd fwd = { .mu = PTHREAD_MUTEX_INITIALIZER };

static struct record *answer_record(unsigned status, const char *body)
{
    struct record *rec = record_new(1 << 20);

    CHECK(rec != NULL);
    rec->status = status;
    CHECK_EQ_INT(record_add_header(rec, SPAN_LIT("Content-Type"), SPAN_LIT("text/plain")), 0);
    CHECK_EQ_INT(buf_append(&rec->body, body, strlen(body)), 0);
    return rec;
}

static int fake_submit(void *ctx, struct loop *loop, const struct upstream_request *req,
                       upstream_done_fn *done, void *done_ctx)
{
    struct fwd *f = ctx;
    enum fwd_mode mode;
    unsigned status;

    (void)loop;
    pthread_mutex_lock(&f->mu);
    f->calls++;
    snprintf(f->last_target, sizeof(f->last_target), "%.*s", (int)req->target.len,
             req->target.base);
    snprintf(f->last_host, sizeof(f->last_host), "%.*s", (int)req->host.len,
             req->host.base ? req->host.base : "");
    mode = f->mode;
    status = f->status;
    if (mode == FWD_HOLD) {
        f->held_done = done;
        f->held_ctx = done_ctx;
        f->held_overdue = req->overdue;
    }
    pthread_mutex_unlock(&f->mu);
    if (mode == FWD_REFUSE)
        return -ECONNREFUSED; /* <done> never runs: the pipeline answers 502 itself */
    if (mode == FWD_ANSWER)
        done(done_ctx, 0, answer_record(status, "hello"));
    return 0;
}

/* Lets the held request answer <status> (or fail with <err>). */
static void release_held(unsigned status, int err)
{
    upstream_done_fn *done;
    void *ctx;

    pthread_mutex_lock(&fwd.mu);
    done = fwd.held_done;
    ctx = fwd.held_ctx;
    fwd.held_done = NULL;
    pthread_mutex_unlock(&fwd.mu);
    CHECK(done != NULL);
    if (done)
        done(ctx, err, err ? NULL : answer_record(status, "held"));
}

/* --upstream-timeout passes for the held request, as the upstream client
 * says when the exchange goes on (doc/guarantees.md, Unknown outcomes); it
 * stays held. */
static void overdue_held(void)
{
    void (*overdue)(void *ctx);
    void *ctx;

    pthread_mutex_lock(&fwd.mu);
    overdue = fwd.held_overdue;
    ctx = fwd.held_ctx;
    pthread_mutex_unlock(&fwd.mu);
    CHECK(overdue != NULL);
    if (overdue)
        overdue(ctx);
}

static bool holding(void)
{
    bool held;

    pthread_mutex_lock(&fwd.mu);
    held = fwd.held_done != NULL;
    pthread_mutex_unlock(&fwd.mu);
    return held;
}

static void set_fwd(enum fwd_mode mode, unsigned status)
{
    pthread_mutex_lock(&fwd.mu);
    fwd.mode = mode;
    fwd.status = status;
    pthread_mutex_unlock(&fwd.mu);
}

static int fwd_calls(void)
{
    int n;

    pthread_mutex_lock(&fwd.mu);
    n = fwd.calls;
    pthread_mutex_unlock(&fwd.mu);
    return n;
}

/* ---- a failing store ---- */

static int failing_acquire(struct store *st, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                           const struct store_token *tok, const struct store_lock *lk,
                           store_done_fn *done, void *ctx)
{
    (void)st, (void)key, (void)fp, (void)tok, (void)lk;
    done(ctx, -ECONNREFUSED, NULL);
    return 0;
}

static const struct store_ops failing_ops = { .name = "failing", .acquire = failing_acquire };
static struct store failing_store = { .ops = &failing_ops };

/* ---- a store whose locks are always lost ----
 * Every acquire gets the lock (after <stall_ms>, inside the call: a slow
 * store), and every later call for it finds the token stale, as when the lock
 * expired and another request took it. */

static unsigned stale_stall_ms;
static int stale_completes; /* complete calls made: none may be retried */
static int stale_releases;  /* release calls made */

static int stale_acquire(struct store *st, struct span key, const uint8_t fp[FINGERPRINT_LEN],
                         const struct store_token *tok, const struct store_lock *lk,
                         store_done_fn *done, void *ctx)
{
    struct timespec ts = { .tv_sec = stale_stall_ms / 1000,
                           .tv_nsec = (long)(stale_stall_ms % 1000) * 1000000L };

    (void)st, (void)key, (void)fp, (void)tok, (void)lk;
    nanosleep(&ts, NULL);
    done(ctx, 0, &(struct store_result){ .status = STORE_ACQUIRED });
    return 0;
}

static int stale_complete(struct store *st, struct span key, const struct store_token *tok,
                          struct record *rec, uint64_t ttl_ms, const struct store_link *link,
                          store_done_fn *done, void *ctx)
{
    (void)st, (void)key, (void)tok, (void)rec, (void)ttl_ms, (void)link;
    __atomic_add_fetch(&stale_completes, 1, __ATOMIC_RELAXED);
    done(ctx, -ESTALE, NULL);
    return 0;
}

static int stale_release(struct store *st, struct span key, const struct store_token *tok,
                         store_done_fn *done, void *ctx)
{
    (void)st, (void)key, (void)tok;
    __atomic_add_fetch(&stale_releases, 1, __ATOMIC_RELAXED);
    done(ctx, -ESTALE, NULL);
    return 0;
}

static int stale_extend(struct store *st, struct span key, const struct store_token *tok,
                        uint64_t lock_ttl_ms, store_done_fn *done, void *ctx)
{
    (void)st, (void)key, (void)tok, (void)lock_ttl_ms;
    done(ctx, -ESTALE, NULL);
    return 0;
}

static const struct store_ops stale_ops = {
    .name = "stale",
    .acquire = stale_acquire,
    .complete = stale_complete,
    .release = stale_release,
    .extend = stale_extend,
};
static struct store stale_store = { .ops = &stale_ops };

/* ---- requests, as the front end builds them ---- */

struct env {
    struct config cfg;
    struct route_table *routes;
    struct worker_pool *pool;
    struct store *st;    /* what the pipeline uses */
    struct store *plain; /* with next_keys: the store behind the sealing filter <st> */
    struct pipeline *pl;
};

/* A request as the test's front end holds it: the request it hands the
 * pipeline, the pipeline's handle, and the answer it gets back. */
struct req {
    struct request *rq;      /* until begin() hands it over */
    struct pipeline_req *pr; /* from begin() on */
    struct {
        struct record *answer; /* a reference of ours */
        const char *replayed;
        enum outcome outcome;
        bool decided;
    } out;
};

struct answer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct req *r;
    int calls;    /* of the answer callback: exactly one is due */
    bool decided; /* the answer was set when it signalled */
};

static void on_done(void *ctx, const struct pipeline_answer *pa)
{
    struct answer *a = ctx;

    pthread_mutex_lock(&a->mu);
    a->r->out.answer = pa->rec;
    a->r->out.replayed = pa->replayed;
    a->r->out.outcome = pa->outcome;
    a->r->out.decided = true;
    a->calls++;
    a->decided = a->r->out.decided;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* Hands <r> to the pipeline, its answer to come to <a>. */
static void begin(struct env *e, struct req *r, struct answer *a)
{
    a->r = r;
    r->pr = pipeline_begin(e->pl, r->rq, on_done, a);
    r->rq = NULL;
    CHECK(r->pr != NULL);
}

static void req_free(struct req *r)
{
    request_free(r->rq);
    pipeline_req_free(r->pr);
    record_unref(r->out.answer);
    free(r);
}

/* Waits up to <ms> for the answer; true once it came, through one callback. */
static bool answered(struct answer *a, unsigned ms)
{
    struct timespec ts;
    int calls;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&a->mu);
    while (a->calls == 0 && pthread_cond_timedwait(&a->cv, &a->mu, &ts) == 0)
        ;
    calls = a->calls;
    CHECK(calls <= 1);
    CHECK(calls == 0 || a->decided);
    pthread_mutex_unlock(&a->mu);
    return calls == 1;
}

/* The keys the next env_up() seals answers with (it takes them over); NULL: none. */
static struct seal_keys *next_keys;

static void env_up(struct env *e, struct store *st, const char *const *args)
{
    static char words[16][64];
    char *argv[16], *envp[] = { NULL };
    char err[256];
    int argc = 0;

    memset(e, 0, sizeof(*e));
    snprintf(words[argc++], sizeof(words[0]), "idemproxy");
    snprintf(words[argc++], sizeof(words[0]), "--upstream");
    snprintf(words[argc++], sizeof(words[0]), "http://127.0.0.1:1");
    for (; args && *args && argc < 16; args++)
        snprintf(words[argc++], sizeof(words[0]), "%s", *args);
    for (int i = 0; i < argc; i++)
        argv[i] = words[i];
    CHECK_EQ_INT(config_file_load(&e->cfg, &e->routes, argc, argv, envp, err, sizeof(err)), 0);
    log_setup(LOG_LEVEL_ERROR, LOG_FORMAT_TEXT); /* the access lines would drown the results */
    CHECK_EQ_INT(worker_pool_new(2, &e->pool), 0);
    if (st)
        e->st = st;
    else
        CHECK_EQ_INT(store_memory_new(64u << 20, 1000, e->pool, &e->st), 0);
    if (next_keys) {
        e->plain = e->st;
        CHECK_EQ_INT(store_seal_new(e->plain, next_keys, &e->st), 0);
        next_keys = NULL;
    }
    CHECK_EQ_INT(pipeline_new(&e->cfg, e->routes, e->st, e->pool,
                              &(struct pipeline_forwarder){ .submit = fake_submit, .ctx = &fwd },
                              &e->pl),
                 0);
    set_fwd(FWD_ANSWER, 201);
}

static void env_down(struct env *e)
{
    pipeline_stop(e->pl);
    worker_pool_free(e->pool);
    if (e->st != &failing_store && e->st != &stale_store)
        store_free(e->st);
    pipeline_free(e->pl);
    route_table_unref(e->routes);
    config_done(&e->cfg);
}

/* A request with its header section in; "Name: value" header strings. */
static struct req *request(struct env *e, const char *method, const char *target,
                           const char *const *headers)
{
    struct req *r = calloc(1, sizeof(*r));

    (void)e;
    CHECK(r != NULL);
    r->rq = request_new(target);
    CHECK(r->rq != NULL);
    r->rq->method = span_from_cstr(method);
    r->rq->http11 = true;
    snprintf(r->rq->client_ip, sizeof(r->rq->client_ip), "127.0.0.1");
    CHECK_EQ_INT(request_add_header(r->rq, SPAN_LIT("Host"), SPAN_LIT("api.test")), 0);
    for (; headers && *headers; headers++) {
        const char *colon = strchr(*headers, ':');

        CHECK_EQ_INT(request_add_header(r->rq,
                                        (struct span){ *headers, (size_t)(colon - *headers) },
                                        span_from_cstr(colon + 2)),
                     0);
    }
    return r;
}

/* Feeds <body>, runs <r> and waits for its answer (it may come inside any of
 * the three calls). Returns <r>, answered; the caller frees it. */
static struct req *run(struct env *e, struct req *r, const char *body)
{
    struct answer a = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

    begin(e, r, &a);
    if (body && !r->out.decided)
        pipeline_body(r->pr, body, strlen(body));
    pipeline_end(r->pr); /* does nothing once decided */
    CHECK(answered(&a, 10000));
    /* Nothing more comes, even for a request answered early. */
    pipeline_body(r->pr, "late", 4);
    pipeline_end(r->pr);
    CHECK_EQ_INT(a.calls, 1);
    return r;
}

/* Runs a request in the background: the answer is awaited with finished(). */
struct pending {
    struct answer a;
    struct req *r;
};

static void start(struct env *e, struct pending *p, struct req *r, const char *body)
{
    p->a = (struct answer){ .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
    p->r = r;
    begin(e, r, &p->a);
    CHECK(!r->out.decided);
    pipeline_body(r->pr, body, strlen(body));
    pipeline_end(r->pr);
}

static bool finished(struct pending *p, unsigned ms) { return answered(&p->a, ms); }

static unsigned status_of(const struct req *r) { return r->out.answer ? r->out.answer->status : 0; }

static bool has_code(const struct req *r, const char *code)
{
    return r->out.answer && r->out.answer->body.data &&
           memmem(r->out.answer->body.data, r->out.answer->body.len, code, strlen(code));
}

#define KEY(k) ((const char *const[]){ "Idempotency-Key: " k, NULL })

/* ---- the outcomes ---- */

static void test_pipeline_executed_then_replayed_then_mismatch(void)
{
    struct env e;
    struct req *r;
    int before;

    env_up(&e, NULL, NULL);
    before = fwd_calls();
    r = run(&e, request(&e, "POST", "/pay", KEY("k1")), "amount=1");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_EXECUTED);
    CHECK_EQ_INT(status_of(r), 201);
    CHECK_EQ_STR(r->out.replayed, "false");
    CHECK_EQ_INT(fwd_calls(), before + 1);
    req_free(r);

    r = run(&e, request(&e, "POST", "/pay", KEY("\"k1\"")), "amount=1"); /* the sf-string form */
    CHECK_EQ_INT(r->out.outcome, OUTCOME_REPLAYED);
    CHECK_EQ_INT(status_of(r), 201);
    CHECK_EQ_STR(r->out.replayed, "true");
    CHECK(r->out.answer && r->out.answer->body.len == 5 &&
          memcmp(r->out.answer->body.data, "hello", 5) == 0);
    CHECK_EQ_INT(fwd_calls(), before + 1); /* not forwarded again */
    req_free(r);

    r = run(&e, request(&e, "POST", "/pay", KEY("k1")), "amount=2");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_MISMATCH);
    CHECK_EQ_INT(status_of(r), 422);
    CHECK(has_code(r, "idempotency_key_mismatch"));
    req_free(r);
    r = run(&e, request(&e, "POST", "/pay?x", KEY("k1")), "amount=1"); /* another target */
    CHECK_EQ_INT(r->out.outcome, OUTCOME_MISMATCH);
    req_free(r);
    CHECK_EQ_INT(fwd_calls(), before + 1);
    env_down(&e);
}

static void test_pipeline_passthrough_and_key_errors(void)
{
    static const char *const require[] = { "--require-key", "--max-body", "8", NULL };
    struct env e;
    struct req *r;

    env_up(&e, NULL, require);
    r = run(&e, request(&e, "GET", "/pay", NULL), NULL);
    CHECK_EQ_INT(r->out.outcome, OUTCOME_PASSTHROUGH);
    CHECK_EQ_INT(status_of(r), 201);
    CHECK(r->out.replayed == NULL);
    req_free(r);
    r = run(&e, request(&e, "POST", "/pay", NULL), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_MISSING_KEY);
    CHECK_EQ_INT(status_of(r), 400);
    req_free(r);
    r = run(&e, request(&e, "POST", "/pay", KEY("\"a b\"")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_INVALID_KEY);
    CHECK(has_code(r, "idempotency_key_invalid"));
    req_free(r);
    r = run(&e,
            request(&e, "POST", "/pay",
                    (const char *const[]){ "Idempotency-Key: a", "idempotency-key: a", NULL }),
            "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_INVALID_KEY); /* two key headers */
    req_free(r);
    r = run(&e, request(&e, "POST", "/pay", KEY("big")), "123456789");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_TOO_LARGE);
    CHECK_EQ_INT(status_of(r), 413);
    req_free(r);
    r = run(&e,
            request(&e, "POST", "/pay",
                    (const char *const[]){ "Idempotency-Key: big", "Content-Length: 99", NULL }),
            NULL);
    CHECK_EQ_INT(r->out.outcome, OUTCOME_TOO_LARGE); /* announced: refused before the body */
    req_free(r);
    /* nothing was locked by the refusals: the key executes */
    r = run(&e, request(&e, "POST", "/pay", KEY("big")), "small");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_EXECUTED);
    req_free(r);
    env_down(&e);
}

static void test_pipeline_bad_request_is_decided_first(void)
{
    struct env e;
    struct req *r;
    int before;

    env_up(&e, NULL, NULL);
    before = fwd_calls();
    r = run(
        &e,
        request(&e, "POST", "/pay", (const char *const[]){ "Idempotency-Key: k", "X: a\rb", NULL }),
        "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_BAD_REQUEST);
    CHECK_EQ_INT(status_of(r), 400);
    CHECK(r->out.answer && record_header_get(r->out.answer, "Connection") &&
          strcmp(record_header_get(r->out.answer, "Connection"), "close") == 0);
    req_free(r);
    r = run(&e, request(&e, "GET", "@127.0.0.1:6202/x", NULL), NULL);
    CHECK_EQ_INT(r->out.outcome, OUTCOME_BAD_REQUEST);
    req_free(r);
    r = run(&e, request(&e, "CONNECT", "127.0.0.1:443", NULL), NULL);
    CHECK_EQ_INT(r->out.outcome, OUTCOME_BAD_REQUEST);
    CHECK_EQ_INT(status_of(r), 501);
    req_free(r);
    r = request(&e, "GET", "/x", NULL);
    r->rq->head_error = "a NUL the HTTP layer hid";
    run(&e, r, NULL);
    CHECK_EQ_INT(r->out.outcome, OUTCOME_BAD_REQUEST);
    req_free(r);
    CHECK_EQ_INT(fwd_calls(), before);
    /* the key of the refused request was never locked */
    r = run(&e, request(&e, "POST", "/pay", KEY("k")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_EXECUTED);
    req_free(r);
    env_down(&e);
}

/* The one exit: a refusal comes through the callback, inside the call that
 * decides it; the memory store and the fake forwarder answer inside
 * pipeline_end(); nothing is called twice. */
static void test_pipeline_answers_through_the_callback_only(void)
{
    struct answer a = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
    struct answer b = a, c = a;
    struct env e;
    struct req *r;

    env_up(&e, NULL, (const char *const[]){ "--max-body", "8", NULL });
    r = request(&e, "GET", "/x", (const char *const[]){ "X: a\x01b", NULL });
    begin(&e, r, &a);
    CHECK_EQ_INT(a.calls, 1); /* inside pipeline_begin() */
    CHECK(a.decided && r->out.decided);
    CHECK_EQ_INT(r->out.outcome, OUTCOME_BAD_REQUEST);
    pipeline_body(r->pr, "ignored", 7);
    pipeline_end(r->pr);
    CHECK_EQ_INT(a.calls, 1);
    req_free(r);

    r = request(&e, "POST", "/pay", KEY("cb"));
    begin(&e, r, &b);
    CHECK_EQ_INT(b.calls, 0);
    CHECK(!r->out.decided);
    pipeline_body(r->pr, "12345", 5);
    CHECK_EQ_INT(b.calls, 0);
    pipeline_body(r->pr, "6789", 4); /* past --max-body 8 */
    CHECK_EQ_INT(b.calls, 1);        /* inside pipeline_body() */
    CHECK_EQ_INT(r->out.outcome, OUTCOME_TOO_LARGE);
    pipeline_body(r->pr, "more", 4);
    pipeline_end(r->pr);
    CHECK_EQ_INT(b.calls, 1);
    req_free(r);

    r = request(&e, "POST", "/pay", KEY("cb"));
    begin(&e, r, &c);
    pipeline_body(r->pr, "small", 5);
    CHECK_EQ_INT(c.calls, 0);
    pipeline_end(r->pr);
    CHECK(answered(&c, 10000));
    CHECK_EQ_INT(r->out.outcome, OUTCOME_EXECUTED);
    pipeline_end(r->pr);
    CHECK_EQ_INT(c.calls, 1);
    req_free(r);
    env_down(&e);
}

static void test_pipeline_absolute_form_forwards_its_path_and_host(void)
{
    struct env e;
    struct req *r;

    env_up(&e, NULL, NULL);
    r = run(&e, request(&e, "POST", "http://api.example:8443?q=1", KEY("abs")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_EXECUTED);
    CHECK_EQ_STR(fwd.last_target, "/?q=1");
    CHECK_EQ_STR(fwd.last_host, "api.example:8443");
    req_free(r);
    /* fingerprinted as that origin-form: the same request in origin-form replays */
    r = run(&e, request(&e, "POST", "/?q=1", KEY("abs")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_REPLAYED);
    req_free(r);
    r = run(&e, request(&e, "GET", "/plain", NULL), NULL);
    CHECK_EQ_STR(fwd.last_target, "/plain");
    CHECK_EQ_STR(fwd.last_host, ""); /* the client's Host goes on */
    req_free(r);
    env_down(&e);
}

static void test_pipeline_in_flight_then_completed(void)
{
    struct env e;
    struct pending first;
    struct req *r;

    env_up(&e, NULL, NULL);
    set_fwd(FWD_HOLD, 0);
    start(&e, &first, request(&e, "POST", "/slow", KEY("k2")), "x");
    CHECK(!finished(&first, 50));
    r = run(&e, request(&e, "POST", "/slow", KEY("k2")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_IN_FLIGHT);
    CHECK_EQ_INT(status_of(r), 409);
    CHECK(r->out.answer && record_header_get(r->out.answer, "Retry-After"));
    req_free(r);
    release_held(200, 0);
    CHECK(finished(&first, 5000));
    CHECK_EQ_INT(first.r->out.outcome, OUTCOME_EXECUTED);
    req_free(first.r);
    set_fwd(FWD_ANSWER, 201);
    r = run(&e, request(&e, "POST", "/slow", KEY("k2")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_REPLAYED);
    CHECK_EQ_INT(status_of(r), 200);
    req_free(r);
    env_down(&e);
}

/* An upstream failure (or a status not cached) releases the lock: the
 * client's retry runs again. */
static void test_pipeline_upstream_error_and_5xx_release_the_lock(void)
{
    struct env e;
    struct pending first;
    struct req *r;
    int before;

    env_up(&e, NULL, NULL);
    set_fwd(FWD_REFUSE, 0);
    r = run(&e, request(&e, "POST", "/pay", KEY("k3")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_UPSTREAM_ERROR);
    CHECK_EQ_INT(status_of(r), 502);
    req_free(r);
    set_fwd(FWD_HOLD, 0);
    start(&e, &first, request(&e, "POST", "/pay", KEY("k3")), "x");
    release_held(0, -ENOTCONN); /* timed out connecting: nothing was sent */
    CHECK(finished(&first, 5000));
    CHECK_EQ_INT(first.r->out.outcome, OUTCOME_UPSTREAM_ERROR);
    CHECK_EQ_INT(status_of(first.r), 504);
    req_free(first.r);
    start(&e, &first, request(&e, "POST", "/pay", KEY("k3")), "x");
    release_held(0, -ECONNREFUSED);
    CHECK(finished(&first, 5000));
    CHECK_EQ_INT(status_of(first.r), 502);
    req_free(first.r);
    set_fwd(FWD_ANSWER, 503);
    r = run(&e, request(&e, "POST", "/pay", KEY("k3")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_EXECUTED);
    CHECK_EQ_INT(status_of(r), 503);
    req_free(r);
    before = fwd_calls();
    set_fwd(FWD_ANSWER, 201);
    r = run(&e, request(&e, "POST", "/pay", KEY("k3")), "x"); /* 503 was not stored */
    CHECK_EQ_INT(r->out.outcome, OUTCOME_EXECUTED);
    CHECK_EQ_INT(fwd_calls(), before + 1);
    req_free(r);
    env_down(&e);
}

static void test_pipeline_store_error_rejects_or_passes_through(void)
{
    static const char *const pass[] = { "--on-store-error", "passthrough", NULL };
    struct env e;
    struct req *r;
    int before;

    env_up(&e, &failing_store, NULL);
    before = fwd_calls();
    r = run(&e, request(&e, "POST", "/pay", KEY("k4")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_STORE_ERROR);
    CHECK_EQ_INT(status_of(r), 503);
    CHECK(has_code(r, "store_unavailable"));
    CHECK_EQ_INT(fwd_calls(), before);
    req_free(r);
    env_down(&e);

    env_up(&e, &failing_store, pass);
    r = run(&e, request(&e, "POST", "/pay", KEY("k4")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_STORE_ERROR); /* forwarded unprotected, counted so */
    CHECK_EQ_INT(status_of(r), 201);
    CHECK(r->out.replayed == NULL);
    req_free(r);
    env_down(&e);
}

/* A lost lock (a stale token): the request that ran still gets the
 * upstream's answer, though the store refused to keep it, and its complete is
 * not retried; a holder whose acquire stalled past half the lock TTL confirms
 * the lock first, finds it gone, and gets 409 without being forwarded; it
 * gives the key back with its token all the same (fenced: another holder's
 * lock stays), since the key may have been found unknown under it while
 * nothing ran. */
static void test_pipeline_stale_token(void)
{
    static const char *const ttl[] = { "--lock-ttl", "1", NULL };
    struct env e;
    struct req *r;
    int before;

    env_up(&e, &stale_store, ttl);
    stale_stall_ms = 0;
    stale_completes = 0;
    before = fwd_calls();
    r = run(&e, request(&e, "POST", "/pay", KEY("s1")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_EXECUTED);
    CHECK_EQ_INT(status_of(r), 201);
    CHECK_EQ_STR(r->out.replayed, "false");
    CHECK_EQ_INT(fwd_calls(), before + 1);
    req_free(r);
    CHECK_EQ_INT(__atomic_load_n(&stale_completes, __ATOMIC_RELAXED), 1);

    stale_stall_ms = 600; /* past half of --lock-ttl 1 */
    stale_releases = 0;
    r = run(&e, request(&e, "POST", "/pay", KEY("s2")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_IN_FLIGHT);
    CHECK_EQ_INT(status_of(r), 409);
    CHECK(has_code(r, "idempotency_key_in_use"));
    CHECK_EQ_INT(fwd_calls(), before + 1); /* never forwarded */
    req_free(r);
    CHECK_EQ_INT(__atomic_load_n(&stale_completes, __ATOMIC_RELAXED), 1);
    CHECK_EQ_INT(__atomic_load_n(&stale_releases, __ATOMIC_RELAXED), 1);
    stale_stall_ms = 0;
    env_down(&e);
}

/* --wait: a duplicate is held while the first runs and replayed when it
 * completes; when the first ends without storing, the held one executes. */
static void test_pipeline_wait_hands_off(void)
{
    static const char *const wait[] = { "--wait", "5", NULL };
    struct env e;
    struct pending first, dup;

    env_up(&e, NULL, wait);
    set_fwd(FWD_HOLD, 0);
    start(&e, &first, request(&e, "POST", "/w", KEY("k5")), "x");
    start(&e, &dup, request(&e, "POST", "/w", KEY("k5")), "x");
    CHECK(!finished(&dup, 100)); /* held, not 409 */
    release_held(201, 0);
    CHECK(finished(&first, 5000));
    CHECK(finished(&dup, 5000));
    CHECK_EQ_INT(first.r->out.outcome, OUTCOME_EXECUTED);
    CHECK_EQ_INT(dup.r->out.outcome, OUTCOME_REPLAYED);
    req_free(first.r);
    req_free(dup.r);

    start(&e, &first, request(&e, "POST", "/w", KEY("k6")), "x");
    start(&e, &dup, request(&e, "POST", "/w", KEY("k6")), "x");
    CHECK(!finished(&dup, 100));
    release_held(0, -ECONNREFUSED); /* the first ends without storing: the key is released */
    CHECK(finished(&first, 5000));
    CHECK_EQ_INT(first.r->out.outcome, OUTCOME_UPSTREAM_ERROR);
    /* the held duplicate takes the key and is forwarded: it is held upstream now */
    for (int i = 0; i < 500 && !holding(); i++) {
        struct timespec ts = { .tv_nsec = 10000000L };

        nanosleep(&ts, NULL);
    }
    release_held(201, 0);
    CHECK(finished(&dup, 5000));
    CHECK_EQ_INT(dup.r->out.outcome, OUTCOME_EXECUTED);
    req_free(first.r);
    req_free(dup.r);

    /* The first's outcome is unknown: the held duplicate gets the 502 too. */
    start(&e, &first, request(&e, "POST", "/w", KEY("k7")), "x");
    start(&e, &dup, request(&e, "POST", "/w", KEY("k7")), "x");
    CHECK(!finished(&dup, 100));
    release_held(0, -ECONNRESET);
    CHECK(finished(&first, 5000));
    CHECK(finished(&dup, 5000));
    CHECK_EQ_INT(first.r->out.outcome, OUTCOME_UPSTREAM_ERROR);
    CHECK_EQ_INT(dup.r->out.outcome, OUTCOME_UNKNOWN);
    CHECK(!holding());
    req_free(first.r);
    req_free(dup.r);
    set_fwd(FWD_ANSWER, 201);
    env_down(&e);
}

/* A request that may have reached the upstream without an answer: its key
 * is unknown, and every duplicate gets 502 without being forwarded
 * (doc/guarantees.md, Unknown outcomes). */
static void test_pipeline_lost_answer_makes_the_key_unknown(void)
{
    static const int maybe_sent[] = { -ECONNRESET, -ETIMEDOUT, -ESHUTDOWN };
    struct env e;
    struct pending first;
    struct req *r;
    int before;

    env_up(&e, NULL, NULL);
    for (size_t i = 0; i < ARRAY_SIZE(maybe_sent); i++) {
        char key[32];
        const char *hdr[] = { key, NULL };

        snprintf(key, sizeof(key), "Idempotency-Key: u%zu", i);
        set_fwd(FWD_HOLD, 0);
        start(&e, &first, request(&e, "POST", "/pay", hdr), "x");
        release_held(0, maybe_sent[i]);
        CHECK(finished(&first, 5000));
        CHECK_EQ_INT(first.r->out.outcome, OUTCOME_UPSTREAM_ERROR);
        CHECK_EQ_INT(status_of(first.r), maybe_sent[i] == -ETIMEDOUT ? 504 : 502);
        req_free(first.r);
        set_fwd(FWD_ANSWER, 201);
        before = fwd_calls();
        r = run(&e, request(&e, "POST", "/pay", hdr), "x");
        CHECK_EQ_INT(r->out.outcome, OUTCOME_UNKNOWN);
        CHECK_EQ_INT(status_of(r), 502);
        CHECK(has_code(r, "idempotency_outcome_unknown"));
        CHECK_EQ_STR(record_header_get(r->out.answer, "X-Should-Retry"), "false");
        CHECK(!record_header_get(r->out.answer, "Retry-After"));
        CHECK(r->out.replayed == NULL);
        CHECK_EQ_INT(fwd_calls(), before); /* never forwarded */
        req_free(r);
        r = run(&e, request(&e, "POST", "/pay", hdr), "another body");
        CHECK_EQ_INT(r->out.outcome, OUTCOME_MISMATCH);
        req_free(r);
    }
    env_down(&e);
}

/* on-unknown-outcome retry: the lock is released as before (at least once). */
static void test_pipeline_retry_policy_releases_a_lost_answer(void)
{
    static const char *const retry[] = { "--on-unknown-outcome", "retry", NULL };
    struct env e;
    struct pending first;
    struct req *r;
    int before;

    env_up(&e, NULL, retry);
    set_fwd(FWD_HOLD, 0);
    start(&e, &first, request(&e, "POST", "/pay", KEY("r1")), "x");
    release_held(0, -ECONNRESET);
    CHECK(finished(&first, 5000));
    CHECK_EQ_INT(status_of(first.r), 502);
    req_free(first.r);
    set_fwd(FWD_ANSWER, 201);
    before = fwd_calls();
    r = run(&e, request(&e, "POST", "/pay", KEY("r1")), "x");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_EXECUTED);
    CHECK_EQ_INT(fwd_calls(), before + 1);
    req_free(r);
    env_down(&e);
}

/* Past --upstream-timeout the client gets its 504 while the exchange goes on:
 * a late cacheable answer completes the key, a late non-cacheable one
 * releases it, none makes it unknown; the front end may free the request in
 * between (doc/guarantees.md, Unknown outcomes: Late answers). */
static void test_pipeline_late_answers(void)
{
    static const struct {
        unsigned status;
        int err;
        enum outcome next; /* what a duplicate gets once it ended */
    } cases[] = {
        { 201, 0, OUTCOME_REPLAYED },
        { 503, 0, OUTCOME_EXECUTED },
        { 0, -ETIMEDOUT, OUTCOME_UNKNOWN },
    };
    struct env e;
    struct pending first;
    struct req *r;

    env_up(&e, NULL, NULL);
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        char key[32];
        const char *hdr[] = { key, NULL };

        snprintf(key, sizeof(key), "Idempotency-Key: l%zu", i);
        set_fwd(FWD_HOLD, 0);
        start(&e, &first, request(&e, "POST", "/pay", hdr), "x");
        overdue_held();
        CHECK(finished(&first, 5000));
        CHECK_EQ_INT(first.r->out.outcome, OUTCOME_UPSTREAM_ERROR);
        CHECK_EQ_INT(status_of(first.r), 504);
        req_free(first.r); /* the client is gone: the exchange holds its own reference */
        set_fwd(FWD_ANSWER, 201);
        r = run(&e, request(&e, "POST", "/pay", hdr), "x");
        CHECK_EQ_INT(r->out.outcome, OUTCOME_IN_FLIGHT); /* still under its lock */
        req_free(r);
        release_held(cases[i].status, cases[i].err);
        r = run(&e, request(&e, "POST", "/pay", hdr), "x");
        CHECK_EQ_INT(r->out.outcome, cases[i].next);
        if (cases[i].next == OUTCOME_REPLAYED)
            CHECK_EQ_INT(status_of(r), 201);
        req_free(r);
    }
    CHECK_EQ_INT(pipeline_late(e.pl), 0);
    env_down(&e);
}

/* ---- encryption at rest (doc/configuration.md), read in the memory store itself ---- */

struct listing {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int err;
    struct store_info_list list;
};

static void on_listing(void *ctx, int err, struct store_info_list *list)
{
    struct listing *l = ctx;

    pthread_mutex_lock(&l->mu);
    l->err = err;
    if (list) {
        l->list = *list;
        *list = (struct store_info_list){ 0 };
    }
    l->done = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* What the store holds of <key>, whole. */
static struct store_info_list inspect_key(struct store *st, const char *key)
{
    struct listing l = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

    CHECK_EQ_INT(store_inspect(st, SPAN_LIT("idem:"), span_from_cstr(key), true, on_listing, &l),
                 0);
    pthread_mutex_lock(&l.mu);
    while (!l.done)
        pthread_cond_wait(&l.cv, &l.mu);
    pthread_mutex_unlock(&l.mu);
    CHECK_EQ_INT(l.err, 0);
    return l.list;
}

static void on_sync(void *ctx, int err, const struct store_result *res)
{
    *(int *)ctx = err < 0 ? err : (int)res->status;
}

/* Locks <key> for <fp> and completes it with <rec> straight in the memory
 * store (its calls answer before they return): the last status. */
static int sync_call(struct store *st, const char *key, const uint8_t *fp,
                     const struct store_token *t, struct record *rec)
{
    int got = -1;

    CHECK_EQ_INT(store_acquire(st, span_from_cstr(key), fp, t,
                               &(struct store_lock){ .lease_ms = 10000, .keep_ms = 60000 }, on_sync,
                               &got),
                 0);
    CHECK_EQ_INT(got, STORE_ACQUIRED);
    CHECK_EQ_INT(store_complete(st, span_from_cstr(key), t, rec, 60000, NULL, on_sync, &got), 0);
    return got;
}

/* Answers are sealed by a filter over the store (store_seal.h): the store
 * holds ciphertext only, the pipeline sees answers in clear, and one that
 * does not open is refused with 503 and never run again, even with
 * --on-store-error passthrough. */
static void test_pipeline_memory_store_holds_sealed_answers(void)
{
    static const char text[] = "k1:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n";
    static const char *const passthrough[] = { "--on-store-error", "passthrough", NULL };
    struct store_info_list held;
    struct record *rec;
    struct env e;
    struct req *r;
    char why[128];
    int before;

    CHECK_EQ_INT(seal_keys_parse(SPAN_LIT(text), &next_keys, why, sizeof(why)), 0);
    env_up(&e, NULL, passthrough);
    before = fwd_calls();
    r = run(&e, request(&e, "POST", "/pay", KEY("k1")), "amount=1");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_EXECUTED);
    req_free(r);
    held = inspect_key(e.plain, "k1");
    CHECK_EQ_INT(held.n, 1);
    rec = held.n == 1 ? held.items[0].rec : NULL;
    CHECK(rec && rec->sealed && rec->status == 0 && rec->nheaders == 0);
    CHECK(rec && !memmem(rec->body.data, rec->body.len, "hello", 5) &&
          !memmem(rec->body.data, rec->body.len, "text/plain", 10));
    r = run(&e, request(&e, "POST", "/pay", KEY("k1")), "amount=1");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_REPLAYED);
    CHECK(r->out.answer && r->out.answer->body.len == 5 &&
          !memcmp(r->out.answer->body.data, "hello", 5) && !r->out.answer->sealed);
    CHECK_EQ_STR(record_header_get(r->out.answer, "Content-Type"), "text/plain");
    req_free(r);
    /* The sealed answer of k1 written under k2 for the same request: it
     * does not open there (the store key is its associated data). */
    if (rec) {
        const struct store_info *in = &held.items[0];
        size_t at = strlen(in->store_key) - 2; /* "...:k1" */
        char k2[256];
        uint8_t fp[FINGERPRINT_LEN];
        struct store_token t;

        snprintf(k2, sizeof(k2), "%.*sk2", (int)at, in->store_key);
        for (size_t i = 0; i < FINGERPRINT_LEN; i++)
            sscanf(in->fp_hex + 2 * i, "%2hhx", &fp[i]);
        CHECK_EQ_INT(store_token_new(&t), 0);
        CHECK_EQ_INT(sync_call(e.plain, k2, fp, &t, rec), STORE_OK);
        r = run(&e, request(&e, "POST", "/pay", KEY("k2")), "amount=1");
        CHECK_EQ_INT(r->out.outcome, OUTCOME_STORE_ERROR);
        CHECK_EQ_INT(status_of(r), 503);
        req_free(r);
    }
    /* The store's own record, one bit changed: refused, not run again. */
    if (rec)
        rec->body.data[rec->body.len - 1] ^= 0x10;
    r = run(&e, request(&e, "POST", "/pay", KEY("k1")), "amount=1");
    CHECK_EQ_INT(r->out.outcome, OUTCOME_STORE_ERROR);
    CHECK_EQ_INT(status_of(r), 503);
    CHECK(has_code(r, "store_unavailable"));
    req_free(r);
    CHECK_EQ_INT(fwd_calls(), before + 1);
    store_info_list_done(&held);
    env_down(&e);
}

TEST_MAIN(test_pipeline_executed_then_replayed_then_mismatch,
          test_pipeline_memory_store_holds_sealed_answers, test_pipeline_passthrough_and_key_errors,
          test_pipeline_bad_request_is_decided_first,
          test_pipeline_answers_through_the_callback_only,
          test_pipeline_absolute_form_forwards_its_path_and_host,
          test_pipeline_in_flight_then_completed,
          test_pipeline_upstream_error_and_5xx_release_the_lock,
          test_pipeline_store_error_rejects_or_passes_through, test_pipeline_stale_token,
          test_pipeline_wait_hands_off, test_pipeline_lost_answer_makes_the_key_unknown,
          test_pipeline_retry_policy_releases_a_lost_answer, test_pipeline_late_answers)
