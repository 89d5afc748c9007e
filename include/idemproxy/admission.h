/* SPDX-License-Identifier: MIT */
/* What a request is, decided from its head and its body before anything
 * runs (README.md, What it does with each request; doc/configuration.md,
 * Configuration file; doc/guarantees.md, Threat model): its route, the
 * HTTP-level checks and what is forwarded, whether the idempotency rules
 * apply, its key, store key and fingerprint, and its body (within the route's
 * max-body). A request it refuses gets a problem and an outcome, which the
 * pipeline answers. Pure; one thread at a time. */
#ifndef IDEMPROXY_ADMISSION_H
#define IDEMPROXY_ADMISSION_H

#include "idemproxy/buf.h"
#include "idemproxy/common.h"
#include "idemproxy/fingerprint.h"
#include "idemproxy/keysource.h"
#include "idemproxy/outcome.h"
#include "idemproxy/problem.h"

struct request;
struct route;
struct route_table;

/* Why a request is refused: the problem to answer and its outcome. */
struct admission_refusal {
    enum problem problem;
    enum outcome outcome;
    char detail[512]; /* the problem's detail; "": its own */
    const char *why;  /* a malformed request (bad_request): what is wrong, for the log */
    unsigned status;  /* and its status: 400, or 501 (a method not supported) */
};

/* What is decided of a request. All zero before admission_head(). */
struct admission {
    struct route_table *routes; /* reference: the table <route> belongs to */
    const struct route *route;  /* its route, and the settings it runs under */
    const char *key_prefix;     /* borrowed: --key-prefix */
    bool enforced;              /* the idempotency rules apply (a key was given, or may be) */
    bool key_deferred;          /* the key comes from the body: decided by admission_end() */
    /* Passthrough decided from the head, with a body of unknown length or
     * over ADMISSION_STREAM_MIN: once past ADMISSION_STREAM_MIN the body
     * streams to the upstream as it comes (doc/guarantees.md, "Streaming"),
     * within the route's max-passthrough-body, and is never held whole. */
    bool streams;
    uint64_t body_length;     /* its Content-Length, or UINT64_MAX: none (chunked) */
    struct keysource_key key; /* its key, once read (owns what it derived) */
    int scope_failure;        /* an enum scope_failure + 1 when its principal was refused; 0 */
    /* Its token names a kid the keys-url's set lacks: its key is made once
     * the refetch that asks for is done (admission_rescope()), once. */
    bool scope_wait, scope_waited;
    bool principal;  /* its route's scope (jwt or trusted) found a principal in the request */
    char *store_key; /* owned: <prefix><scope>:<key> */
    uint64_t ttl_ms; /* how long a completed answer is kept */
    /* What is forwarded and fingerprinted: the target in origin-form (or
     * "*"), borrowing the request's target or <fwd_target_buf>, and the
     * Host an absolute-form target names (base NULL: the client's Host). */
    struct span fwd_target;
    char *fwd_target_buf; /* owned: "/" + path, for an absolute-form target without one */
    struct span fwd_host;
    struct buf body; /* owned, limited by the route's max-body */
    struct fingerprint fp;
    uint8_t digest[FINGERPRINT_LEN]; /* once admission_end() made it */
};

/* A passthrough body is read whole before it goes when it is at most this
 * long: it comes in a few reads anyway, is forwarded in one piece, and a
 * malformed or cut one never reaches the upstream. A longer one streams
 * from there on. */
#define ADMISSION_STREAM_MIN (64u << 10)

/* The 413's detail for a passthrough body over max-passthrough-body. */
#define ADMISSION_PASSTHROUGH_TOO_LARGE                                                            \
    "The request body is larger than this proxy passes on (--max-passthrough-body)."

/* The head of <rq> is in: matches its route in <t> (a reference it takes over),
 * checks it (doc/guarantees.md, Threat model), decides passthrough or enforcement (<enabled> false:
 * every request is passthrough), reads its key (store keys start with
 * <key_prefix>, borrowed) and checks the announced body size against the
 * route's max-body (keyed) or max-passthrough-body (passthrough, which sets
 * <a>->streams for a large body or one of unknown length). Returns 0 to
 * read the body, or 1 with the refusal in <ret> (a->route set even then: its
 * dialect and its metrics). */
int admission_head(struct admission *a, struct route_table *t, const struct request *rq,
                   const char *key_prefix, bool enabled, struct admission_refusal *ret);

/* <n> more body bytes: buffered (once) and hashed. Returns 0, or 1 with the
 * refusal in <ret> (413 past max-body, 503 out of memory); the body is then
 * dropped. */
int admission_body(struct admission *a, const char *p, size_t n, struct admission_refusal *ret);

/* The body is complete: the fingerprint is made, and a key that comes from
 * the body (a JSON source, the fingerprint fallback) read. Returns 0 (with
 * a->enforced false: passthrough), or 1 with the refusal in <ret>. */
int admission_end(struct admission *a, const struct request *rq, struct admission_refusal *ret);

/* The keys <a>->scope_wait waited for are fetched again (or could not be):
 * the principal is evaluated again and the store key made. Returns 0 (with
 * a->enforced false: passed through unprotected, on-unverified), or 1 with
 * the refusal in <ret>. */
int admission_rescope(struct admission *a, const struct request *rq, struct admission_refusal *ret);

/* Frees what <a> owns. */
void admission_done(struct admission *a);

#endif
