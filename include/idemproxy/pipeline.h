/* SPDX-License-Identifier: MIT */
/* The per-request idempotency state machine (SPEC §1, §5): decides the
 * outcome, drives the store and the upstream, keeps the lock alive, and is
 * the only place that maps errors to outcomes. The front end feeds it a
 * request in three steps and gets the answer back through a callback. */
#ifndef IDEMPROXY_PIPELINE_H
#define IDEMPROXY_PIPELINE_H

#include "idemproxy/buf.h"
#include "idemproxy/common.h"
#include "idemproxy/fingerprint.h"
#include "idemproxy/idemkey.h"
#include "idemproxy/outcome.h"
#include "idemproxy/store.h"
#include "idemproxy/upstream.h"
#include "idemproxy/waitlist.h"

struct config;
struct loop;
struct pipeline;
struct record;
struct req;
struct worker_pool;

/* Runs exactly once per pipeline_run(), when <r>->out.answer is set: possibly
 * inside pipeline_run() itself (the memory store answers inside its calls,
 * and so may a forwarder), otherwise on a loop, store or worker thread. */
typedef void req_done_fn(struct req *r, void *ctx);

/* What the front end fills before pipeline_begin(), from the HTTP layer;
 * borrowed spans stay valid for the life of the request. The pipeline only
 * reads it. */
struct req_intake {
    struct span method;
    struct span target;          /* raw request target, exactly as received */
    char *target_buf;            /* owned: the bytes of <target> */
    const char *head_uri;        /* where libmicrohttpd parsed the target, in its own buffer */
    struct http_header *headers; /* owned array; the spans borrow the front end's memory */
    size_t nheaders, headers_cap;
    char client_ip[64];
    bool http11; /* HTTP/1.1 (a Host field is required), not 1.0 */
    /* Set when the HTTP layer hid bytes of the header section from the front
     * end (a NUL inside a value or the target): why, or NULL. */
    const char *head_error;
    struct loop *loop; /* the loop it came in on: the forwarder picks that loop's upstream */
    void *conn;        /* the front end's handle of the client connection */
    bool answered;     /* the front end queued the answer */
};

/* What the pipeline hands back: set once, read by the front end to answer. */
struct req_answer {
    struct record *answer; /* owned reference; NULL: out of memory, drop the connection */
    const char *replayed;  /* value of the replay header ("true"/"false"), or NULL for none */
    enum outcome outcome;
    bool running; /* pipeline_run() was called: the answer comes through its callback */
};

/* Everything request-scoped. The front end owns it: it fills <in>, sends
 * <out>, and frees it with req_free() only after the answer was delivered (or
 * the request was abandoned before pipeline_run()). The rest is the
 * pipeline's own: the front end never touches it. */
struct req {
    struct req_intake in;
    struct req_answer out;

    /* The pipeline's own. */
    struct pipeline *pl;
    struct buf body; /* owned, limited by --max-body */
    bool enforced;   /* the idempotency rules apply (a valid key was given) */
    /* What is forwarded and fingerprinted: the target in origin-form (or "*"),
     * borrowing <in.target_buf> or <fwd_target_buf>, and the Host an
     * absolute-form target names (base NULL: the client's Host). */
    struct span fwd_target;
    char *fwd_target_buf; /* owned: "/" + path, for an absolute-form target without one */
    struct span fwd_host;
    struct fingerprint fp;
    uint8_t digest[FINGERPRINT_LEN];
    char *store_key; /* owned: <prefix><scope>:<key> */
    struct store_token tok;
    struct lease *lease;            /* reference while the lock is held */
    struct upstream_request up_req; /* what is forwarded: borrows from this request */
    uint64_t ttl_ms;                /* how long a completed answer is kept */
    uint64_t acquire_sent_ms;
    uint64_t start_us;         /* metrics_now_us() when the headers were in */
    uint64_t store_sent_us;    /* the acquire in progress */
    uint64_t upstream_sent_us; /* when it was forwarded */
    uint64_t upstream_us;      /* what the upstream took, once <forwarded> */
    bool forwarded;
    bool accounted;             /* counted in the metrics and the access log */
    struct waitlist_entry wait; /* --wait: a duplicate held until the first request ends */
    req_done_fn *done;
    void *done_ctx;
};

/* Where the pipeline forwards a request, with upstream_submit()'s contract:
 * the program passes the upstream client of <loop> (the one the request came
 * in on), a test a fake. */
struct pipeline_forwarder {
    int (*submit)(void *ctx, struct loop *loop, const struct upstream_request *req,
                  upstream_done_fn *done, void *done_ctx);
    void *ctx;
};

/* Creates the pipeline. Borrows <cfg>, <st> (NULL when enforcement is off),
 * <pool> and <fwd> (copied): they must outlive it. Returns 0 or -ENOMEM. */
int pipeline_new(const struct config *cfg, struct store *st, struct worker_pool *pool,
                 const struct pipeline_forwarder *fwd, struct pipeline **ret);

/* Returns a new request bound to <pl>, or NULL on OOM. */
struct req *req_new(struct pipeline *pl);

/* Adds a header of the request (borrowed spans). Returns 0 or -ENOMEM. */
int req_add_header(struct req *r, struct span name, struct span value);

/* Frees <r> and everything it owns. NULL-safe. Must not be called between
 * pipeline_run() and its callback. */
void req_free(struct req *r);

/* Called once the request line and headers are in. Refuses what is malformed
 * at the HTTP level (bad_request: <r>->in.head_error, the request line, the
 * header fields and their framing), decides passthrough or enforcement, and
 * checks the key and the announced body size. Returns 0 to go on with the
 * body, or 1 when the answer is already decided (a 400, 413 or 501 in
 * <r>->out.answer, already counted and logged: the front end only sends it; a
 * bad_request answer closes the connection). */
int pipeline_begin(struct pipeline *pl, struct req *r);

/* Feeds <n> body bytes: buffered (once) and hashed. Past --max-body the body is
 * dropped and a 413 answer set (counted and logged at once); later bytes are
 * discarded. */
void pipeline_body(struct pipeline *pl, struct req *r, const char *p, size_t n);

/* Runs the request now that the body is complete (unless an answer was
 * already set, in which case <done> is not used and the caller answers at
 * once: check <r>->out.answer first). <done>(<r>, <ctx>) runs exactly once with
 * the answer in <r>, possibly before this returns (see req_done_fn). */
void pipeline_run(struct pipeline *pl, struct req *r, req_done_fn *done, void *ctx);

/* On SIGTERM: duplicates held by --wait get their 409 at once (within
 * 50 ms), and no new one is held, so that draining need not wait for them. */
void pipeline_quiesce(struct pipeline *pl);

/* Stops lock heartbeats and store retries from touching the store; call
 * before the worker pool and the store are freed. */
void pipeline_stop(struct pipeline *pl);

/* Frees <pl>. NULL-safe. */
void pipeline_free(struct pipeline *pl);

#endif
