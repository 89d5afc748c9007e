/* SPDX-License-Identifier: MIT */
/* The process's modules, brought up in order and down in reverse: the store
 * threads, one event loop per CPU (each with a front end and an upstream
 * client), the store, the pipeline, the admin listener. main.c drives it:
 * signals, reload, drain. Main thread. */
#ifndef IDEMPROXY_APP_H
#define IDEMPROXY_APP_H

#include "idemproxy/common.h"
#include "idemproxy/config.h"

#define APP_MAX_LOOPS 8 /* event loops: one per CPU, up to this */

struct admin;
struct front;
struct loop;
struct pipeline;
struct route_table;
struct store;
struct tracer;
struct upstream;
struct worker_pool;

struct app {
    struct config cfg;          /* the running configuration (reload swaps in what it may) */
    struct route_table *routes; /* owned reference: the table in use */
    struct worker_pool *pool;
    struct store *st;    /* owned: the store as the pipeline sees it, behind its sealing filter */
    struct store *plain; /* borrowed from <st>: the store behind the filter */
    struct pipeline *pl;
    int exit_status; /* when app_up() fails: 2 for a bad option value found late, else 1 */
    /* One event loop per CPU, each running a front end (all on the listen
     * address) and the upstream client its requests are forwarded with. */
    unsigned nloops;
    struct loop *loops[APP_MAX_LOOPS];
    struct upstream *ups[APP_MAX_LOOPS];
    struct front *fronts[APP_MAX_LOOPS];
    struct admin *admin;
    struct tracer *tracer; /* owned: --otlp-endpoint's exporter, NULL: none */
    size_t capture_bytes;  /* the upstream clients' cap on an answer, set at start */
    uint64_t evictions;    /* the memory store's, at the last warning */
    uint64_t warned_at_ms; /* of that warning; 0: never */
};

/* Brings the modules up for <app>'s configuration and routes (set by the
 * caller). Returns 0, or a negative errno with the reason logged and
 * app->exit_status set (2: an option's value the store cannot use). On any
 * return app_down() takes down what came up. */
int app_up(struct app *app);

/* Logs the start-up lines: the addresses, the upstream, the store. */
void app_say_started(struct app *app);

/* The requests open on every front end, and the late exchanges
 * (doc/guarantees.md, Unknown outcomes). */
unsigned app_requests(const struct app *app);

/* Warns, at most once a minute, when the memory store evicted completed
 * records since the last warning. */
void app_watch_memory_store(struct app *app);

/* Takes the modules down, in reverse: call once no request is open. */
void app_down(struct app *app);

/* What an upstream answer may grow to under the routes <t> (the upstream
 * clients' cap, set at start). */
size_t app_capture_bytes(const struct route_table *t);

#endif
