/* SPDX-License-Identifier: MIT */
/* What the HTTP/1.1 client's two files share: upstream_h1.c carries the
 * exchanges (the request written, the answer read and streamed),
 * upstream_h1_pool.c the connections they go over (kept alive per loop,
 * connected to the addresses a resolver thread found). Loop thread only. */
#ifndef IDEMPROXY_UPSTREAM_H1_IMPL_H
#define IDEMPROXY_UPSTREAM_H1_IMPL_H

#include <sys/socket.h>

#include "idemproxy/answer_reader.h"
#include "idemproxy/resolve.h"
#include "upstream_impl.h"

#define H1_MAX_ADDRS 8

struct h1_client;
struct h1_ex;
struct h1_lookup;

enum h1_conn_state {
    H1_CONNECTING, /* to <addr> */
    H1_BUSY,       /* carrying <ex> */
    H1_IDLE,       /* in the pool */
};

/* One connection to the upstream. */
struct h1_conn {
    struct loop_watch watch; /* registered while <events> is not 0 */
    struct h1_client *cl;
    enum h1_conn_state state;
    uint32_t events;
    unsigned addr; /* the address it connects to (an index into cl->addrs) */
    bool reused;   /* it carried an exchange before this one */
    uint64_t idle_since_ms;
    struct h1_ex *ex;      /* the exchange it carries, or connects for */
    struct list_node node; /* in cl->idle while idle */
};

/* One exchange. */
struct h1_ex {
    struct h1_client *cl;
    const struct upstream_request *req; /* borrowed: outlives the exchange */
    upstream_done_fn *done;
    void *ctx;
    struct h1_conn *conn;    /* the connection it goes over, once it has one */
    struct answer_reader rd; /* the answer */
    struct upstream_watched watch;
    struct list_node node;      /* in cl->running, cl->waiting or cl->ended */
    struct list_node wake_node; /* in cl->wakes: a flow woke it */
    struct buf out; /* request bytes not written yet (beyond the body's), from <out_off> */
    size_t out_off;
    size_t body_off; /* bytes of req->body written */
    enum upstream_framing framing;
    uint64_t wrote;     /* bytes of the request written to the current connection */
    int end_err;        /* in cl->ended: what it ends with */
    const char *cause;  /* why it failed, in words (static) */
    const char *more;   /* ... and for the log only (static), or NULL */
    bool may_resend;    /* a safe method: sent again on a fresh connection if a kept one was dead */
    bool retried;       /* ... which it was */
    bool pulled;        /* bytes were taken from the body flow: it cannot be sent again */
    bool head_built;    /* its head was written, or copied into <out> */
    bool body_ended;    /* the body flow's end was taken (its last bytes may wait in <out>) */
    bool body_sent;     /* the whole request was written */
    bool wrote_before;  /* bytes of it went out on a connection it was retried from */
    bool streaming;     /* its head went to req->head: the body goes to req->flow */
    bool paused;        /* the flow had no room: reading stopped */
    bool upload_paused; /* the body flow had no bytes: writing stopped */
    bool waking;        /* in cl->wakes */
};

struct h1_client {
    struct upstream pub; /* first: upstream.c's part */
    struct loop *loop;   /* borrowed */
    struct upstream_base base;
    char *host;      /* owned: the origin's host, without brackets */
    char *port;      /* owned: its port, as text */
    char *authority; /* owned: host[:port] as in the URL: the Host of a client that sent none */
    size_t max_capture_bytes;
    unsigned max_conns;
    unsigned nconns;
    struct list running;          /* exchanges on a connection */
    struct list waiting;          /* exchanges waiting for a connection or for the addresses */
    struct list ended;            /* exchanges that end at the next turn, outside their caller */
    struct list idle;             /* struct h1_conn, most recently used first */
    struct list wakes;            /* exchanges whose flow woke them */
    struct loop_timer turn_timer; /* runs <ended>, <wakes> and <waiting> outside their callers */
    struct loop_timer idle_timer; /* closes connections idle too long */
    struct upstream_watchdog watchdog;
    /* The upstream's addresses: fixed when the host is one, else looked up
     * off the loop (<lookup>) when stale. */
    struct resolve_addr addrs[H1_MAX_ADDRS];
    unsigned naddrs;
    bool numeric;
    uint64_t addrs_until_ms;
    const char *lookup_failed; /* the last lookup's words when it found nothing, or NULL */
    uint64_t lookup_again_ms;  /* ... and when another may start */
    char lookup_why[200];
    struct h1_lookup *lookup;        /* running, or NULL */
    struct upstream_scratch scratch; /* reused */
    struct buf head;                 /* reused: the request head being built */
    char rbuf[16384];                /* reused: each read */
};

/* ---- upstream_h1_pool.c ---- */

/* Finds <x> a connection: a kept one, a new one, or a place in
 * cl->waiting. Once it has one, h1_ex_connected() runs (maybe at once). */
int h1_pool_acquire(struct h1_client *cl, struct h1_ex *x);

/* Gives up <c>: kept for the next exchange when <keep>, else closed. */
void h1_pool_release(struct h1_client *cl, struct h1_conn *c, bool keep);

/* Registers <c> for <events> (0: none, taken off the loop). */
int h1_conn_want(struct h1_conn *c, uint32_t events);

/* Starts the exchanges waiting for a connection, as far as there are. */
void h1_pool_serve(struct h1_client *cl);

/* Closes every connection and forgets the lookup running. */
void h1_pool_stop(struct h1_client *cl);

/* Sets the client's addresses up from its URL. Returns 0 or -ENOMEM. */
int h1_pool_init(struct h1_client *cl);

/* Closes the idle connections past their time (the idle timer). */
void h1_pool_on_idle_timer(void *ctx);

/* ---- upstream_h1.c, for the pool ---- */

/* <x> has its connection (x->conn, busy): it sends. */
void h1_ex_connected(struct h1_ex *x);

/* <x> got no connection: it ends with <err> (-ECONNREFUSED) for <cause>,
 * at the next turn. */
void h1_ex_end_later(struct h1_ex *x, int err, const char *cause);

/* Bytes or a close came on <c>, busy with its exchange: it reads or
 * writes, by <events>. */
void h1_ex_on_events(struct h1_conn *c, uint32_t events);

#endif
