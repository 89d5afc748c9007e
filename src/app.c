/* SPDX-License-Identifier: MIT */
/* The modules up in order and down in reverse. Main thread. */
#include "idemproxy/app.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idemproxy/admin.h"
#include "idemproxy/front.h"
#include "idemproxy/front_tls.h"
#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "idemproxy/pipeline.h"
#include "idemproxy/route.h"
#include "idemproxy/seal.h"
#include "idemproxy/store.h"
#include "idemproxy/store_memory.h"
#include "idemproxy/store_registry.h"
#include "idemproxy/store_seal.h"
#include "idemproxy/tracer.h"
#include "idemproxy/upstream.h"
#include "idemproxy/worker.h"
#include "idemproxy_version.h"

#define STORE_THREADS 8
#define MIN_CAPTURE_BYTES (64u << 20)

unsigned app_requests(const struct app *app)
{
    unsigned n = 0;

    for (unsigned i = 0; i < app->nloops; i++)
        n += app->fronts[i] ? front_requests(app->fronts[i]) : 0;
    return n + pipeline_late(app->pl); /* late exchanges (doc/guarantees.md, Unknown outcomes) */
}

/* An eviction shortens a record's life below --ttl: a retry of that key runs
 * again. The operator hears of it, at most once a minute. */
void app_watch_memory_store(struct app *app)
{
    struct store_memory_stats s;
    uint64_t now = now_ms();

    if (!app->plain || !store_is_memory(app->plain) ||
        (app->warned_at_ms && now - app->warned_at_ms < 60000))
        return;
    store_memory_stats(app->plain, &s);
    if (s.evictions == app->evictions)
        return;
    log_warn("memory store full: %llu completed records evicted before their --ttl ran out "
             "(%llu since start); a retry of an evicted key runs again. Raise "
             "--memory-max-bytes (now %zu MiB) or lower --ttl",
             (unsigned long long)(s.evictions - app->evictions), (unsigned long long)s.evictions,
             s.max_bytes >> 20);
    app->evictions = s.evictions;
    app->warned_at_ms = now;
}

void app_down(struct app *app)
{
    admin_stop(app->admin);
    for (unsigned i = 0; i < app->nloops; i++)
        loop_stop(app->loops[i]); /* no request is open: nothing is left for them to do */
    if (app->pl)
        pipeline_stop(app->pl);
    for (unsigned i = 0; i < app->nloops; i++)
        upstream_free(app->ups[i]);
    worker_pool_free(app->pool); /* runs what is still queued: heartbeats see the stop */
    store_free(app->st);         /* with the loops stopped: finishes on this thread */
    /* Last: a pool thread that answered the last request may still be in the
     * front end's callback until the pool is joined. */
    for (unsigned i = 0; i < app->nloops; i++)
        front_stop(app->fronts[i]);
    /* After everything that may still end a request (the pool, the store's
     * last callbacks, the front ends' completions): what they made goes out,
     * bounded. */
    tracer_stop(app->tracer);
    front_tls_stop();
    pipeline_free(app->pl);
    for (unsigned i = 0; i < app->nloops; i++)
        loop_free(app->loops[i]);
}

/* The pipeline's forwarder: a request goes out through the upstream client
 * of the loop it came in on. */
static int forward_on_loop(void *ctx, struct loop *loop, const struct upstream_request *req,
                           upstream_done_fn *done, void *done_ctx)
{
    struct app *app = ctx;

    for (unsigned i = 0; i < app->nloops; i++) {
        if (app->loops[i] == loop)
            return app->ups[i] ? upstream_submit(app->ups[i], req, done, done_ctx) : -ECANCELED;
    }
    return -ECANCELED;
}

/* What an upstream answer may grow to before it is cut: well past the
 * largest max-response of any route, so that a too-large answer is still
 * relayed whole. */
size_t app_capture_bytes(const struct route_table *t)
{
    size_t most = route_table_max_response(t);

    return most > MIN_CAPTURE_BYTES / 4 ? most * 4 : MIN_CAPTURE_BYTES;
}

/* The store options of <cfg>, into <ret> (strings borrowed from <cfg>). */
static void store_opts(const struct config *cfg, struct store_registry_opts *ret)
{
    *ret = (struct store_registry_opts){
        .url = config_store_url(cfg),
        .password = config_store_password(cfg),
        .timeout_ms = cfg->store_timeout_ms,
        .memory_max_bytes = cfg->memory_max_bytes,
        .redis_tls = { .ca_file = cfg->redis_tls_ca_file,
                       .cert_file = cfg->redis_tls_cert_file,
                       .key_file = cfg->redis_tls_key_file,
                       .insecure = cfg->redis_tls_insecure },
        .redis_tls_server_name = cfg->redis_tls_server_name,
        .redis_wait_replicas = cfg->redis_wait_replicas,
        .redis_wait_timeout_ms = cfg->redis_wait_timeout_ms,
    };
}

/* Opens the store (none when enforcement is off). A store that cannot use
 * an option's value is a bad option value: exit status 2. */
static int open_store(struct app *app)
{
    struct store_registry_opts o;
    char why[512], redacted[512];
    int err;

    if (!app->cfg.enabled)
        return 0;
    store_opts(&app->cfg, &o);
    err = store_registry_open(&o, app->pool, app->loops, app->nloops, &app->st, why, sizeof(why));
    if (err < 0) {
        store_registry_redact_url(config_store_url(&app->cfg) ? config_store_url(&app->cfg)
                                                              : "memory",
                                  redacted, sizeof(redacted));
        log_error("%s %s: %s", app->cfg.store_url ? "--store" : "--redis", redacted,
                  why[0] ? why : strerror(-err));
        app->exit_status = err == -EINVAL && why[0] ? 2 : 1;
        return err;
    }
    if (app->cfg.redis_tls_insecure)
        log_warn("--redis-tls-insecure: Redis's certificate is not verified; anyone on the "
                 "path can read and change what the store holds");
    return 0;
}

/* The loops (not started), a front end and an upstream client on each. */
static int start_serving(struct app *app)
{
    const struct config *cfg = &app->cfg;
    char why[1024];
    struct upstream_options uo = {
        .base_url = cfg->upstream,
        .client = cfg->upstream_client == CONFIG_UPSTREAM_CLIENT_CURL ? UPSTREAM_CLIENT_CURL
                                                                      : UPSTREAM_CLIENT_OWN,
        .timeout_ms = cfg->upstream_timeout_ms,
        .late_ms = cfg->upstream_late_timeout_ms,
        .max_capture_bytes = app->capture_bytes,
        .max_connections = cfg->max_connections,
        .tls_ca_file = cfg->upstream_tls_ca_file,
        .tls_cert_file = cfg->upstream_tls_cert_file,
        .tls_key_file = cfg->upstream_tls_key_file,
        .tls_server_name = cfg->upstream_tls_server_name,
        .tls_insecure = cfg->upstream_tls_insecure,
    };
    int err;

    if (cfg->upstream_tls_insecure)
        log_warn("--upstream-tls-insecure: the upstream's certificate is not verified; anyone "
                 "on the path can read and change what is forwarded");
    if (front_address_taken(&cfg->listen)) {
        log_error("--listen %s: cannot listen there: another process listens on it",
                  cfg->listen.text);
        return -EADDRINUSE;
    }
    if ((err = front_tls_start(cfg, why, sizeof(why))) < 0) {
        log_error("%s", why);
        return err;
    }
    for (unsigned i = 0; i < app->nloops; i++) {
        err = upstream_new(&uo, app->loops[i], &app->ups[i]);
        if (err < 0) {
            log_error("--upstream %s: cannot start the upstream client: %s", cfg->upstream,
                      strerror(-err));
            return err;
        }
        err = front_start(cfg, app->pl, app->loops[i], &app->fronts[i]);
        if (err < 0) {
            log_error("--listen %s: cannot listen there (address in use, or not this host's?%s)",
                      cfg->listen.text,
                      cfg->tls_cert_file ? " or GnuTLS refused --tls-cert-file or --tls-key-file"
                                         : "");
            return err;
        }
    }
    for (unsigned i = 0; i < app->nloops; i++) {
        err = loop_start(app->loops[i]);
        if (err < 0) {
            log_error("cannot start an event loop thread: %s", strerror(-err));
            return err;
        }
    }
    return 0;
}

/* Puts the store behind a sealing filter with <keys> (taken over). */
static int wrap_store(struct app *app, struct seal_keys *keys)
{
    int err = store_seal_new(app->st, keys, &app->st);

    if (err < 0) {
        log_error("cannot set up the store: %s", strerror(-err));
        app->st = app->plain = NULL; /* the filter freed it */
    }
    return err;
}

/* The store behind its sealing filter, with the keys of
 * --store-encryption-key-file, read once (a restart reads them again); with
 * none, the filter still refuses a sealed answer it cannot open. A file
 * others may read is said, not refused: systemd's credentials are the
 * owner's only. */
static int seal_store(struct app *app)
{
    const char *path = app->cfg.store_encryption_key_file;
    struct seal_keys *keys = NULL;
    char why[512];
    struct stat sb;
    int err;

    if (app->st && !path) {
        app->plain = app->st;
        return wrap_store(app, NULL);
    }
    if (!path)
        return 0;
    err = seal_keys_load(path, &keys, why, sizeof(why));
    if (err < 0) {
        log_error("--store-encryption-key-file: %s", err == -ENOMEM ? "out of memory" : why);
        app->exit_status = 2;
        return err;
    }
    if (stat(path, &sb) == 0 && (sb.st_mode & 077))
        log_warn("--store-encryption-key-file %s may be read by others (mode %04o): keep it the "
                 "owner's only (chmod 600), or hand it over as a systemd credential",
                 path, (unsigned)(sb.st_mode & 07777));
    log_info("stored answers are sealed with AES-256-GCM under key '%s' (%zu key%s in %s)",
             keys->keys[0].id, keys->n, keys->n == 1 ? "" : "s", path);
    if (!app->st) { /* enforcement off: the file was checked all the same */
        seal_keys_free(keys);
        return 0;
    }
    app->plain = app->st;
    return wrap_store(app, keys);
}

int app_up(struct app *app)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int err;

    app->capture_bytes = app_capture_bytes(app->routes);
    err = worker_pool_new(STORE_THREADS, &app->pool);
    if (err < 0) {
        log_error("cannot start the store threads: %s", strerror(-err));
        return err;
    }
    /* The loops first (not started): the Redis store puts a connection on each. */
    app->nloops = ncpu < 1 ? 1 : ncpu > APP_MAX_LOOPS ? APP_MAX_LOOPS : (unsigned)ncpu;
    for (unsigned i = 0; i < app->nloops; i++) {
        err = loop_new(&app->loops[i]);
        if (err < 0) {
            log_error("cannot create an event loop: %s", strerror(-err));
            return err;
        }
    }
    err = open_store(app);
    if (err == 0)
        err = seal_store(app);
    if (err == 0)
        err = pipeline_new(&app->cfg, app->routes, app->st, app->pool,
                           &(struct pipeline_forwarder){ .submit = forward_on_loop, .ctx = app },
                           &app->pl);
    if (err == 0 && app->cfg.otlp_endpoint) {
        err = tracer_start(app->cfg.otlp_endpoint, app->cfg.trace_queue, IDEMPROXY_VERSION,
                           &app->tracer);
        if (err < 0)
            log_error("--otlp-endpoint %s: cannot start the exporter: %s", app->cfg.otlp_endpoint,
                      strerror(-err));
        pipeline_set_tracer(app->pl, app->tracer);
    }
    if (err == 0)
        err = start_serving(app);
    if (err < 0)
        return err;
    err = admin_start(&app->cfg, app->st, &app->admin);
    if (err < 0)
        log_error("--admin-listen %s: cannot listen there (address in use, or not this host's?)",
                  app->cfg.admin_listen.text);
    return err;
}

/* What a request that could carry a key, and does not, gets by default:
 * an operator should not have to guess that it goes through unprotected. */
static void say_keyless(const struct config *cfg)
{
    char methods[256];
    size_t n = 0;

    methods[0] = '\0';
    for (size_t i = 0; i < cfg->route.nmethods && n < sizeof(methods); i++)
        n += (size_t)snprintf(methods + n, sizeof(methods) - n, "%s%s", i ? "/" : "",
                              cfg->route.methods[i]);
    if (cfg->route.require_key)
        log_info("a %s without %s is refused with 400 (--require-key; a route may say otherwise)",
                 methods, cfg->key_header);
    else
        log_info("a %s without %s is passed through unprotected (--require-key refuses it with "
                 "400; a route may say otherwise)",
                 methods, cfg->key_header);
}

/* The start-up lines: where it listens, what it forwards to, on which store. */
void app_say_started(struct app *app)
{
    struct store_registry_opts o;
    char store[512];

    store_opts(&app->cfg, &o);
    if (app->cfg.enabled)
        store_registry_describe(&o, store, sizeof(store));
    else
        snprintf(store, sizeof(store),
                 "none (IDEMPOTENCY_ENABLED=false: every request is passthrough)");
    log_info("idemproxy %s listening on %s%s, admin on %s, upstream %s, store %s",
             IDEMPROXY_VERSION, app->cfg.listen.text,
             app->cfg.tls_cert_file ? " (HTTPS: TLS 1.2 and 1.3)" : "", app->cfg.admin_listen.text,
             app->cfg.upstream, store);
    if (app->cfg.enabled)
        say_keyless(&app->cfg);
    if (app->tracer)
        log_info("traces: OTLP/HTTP JSON to %s, %g of new traces sampled (a traceparent's flag "
                 "decides for its own), up to %u spans queued",
                 app->cfg.otlp_endpoint, app->cfg.trace_sample, app->cfg.trace_queue);
    if (app->cfg.admin_token)
        log_info("admin /keys requires the bearer token of --admin-token-file %s",
                 app->cfg.admin_token_file);
    else if (!admin_is_loopback(&app->cfg))
        log_warn("admin on %s, not a loopback address, and no --admin-token-file: /keys answers "
                 "403 (health, readiness and metrics stay open)",
                 app->cfg.admin_listen.text);
}
