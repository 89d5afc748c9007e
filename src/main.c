/* SPDX-License-Identifier: MIT */
/* Lifecycle: configuration, then the modules up in order, signals, drain on
 * SIGTERM/SIGINT, and the modules down in reverse. The main thread only waits
 * for signals; every other thread is started by a module. */
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "idemproxy/admin.h"
#include "idemproxy/config.h"
#include "idemproxy/front.h"
#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "idemproxy/metrics.h"
#include "idemproxy/pipeline.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/route.h"
#include "idemproxy/store_memory.h"
#include "idemproxy/store_redis.h"
#include "idemproxy/upstream.h"
#include "idemproxy/worker.h"
#include "idemproxy_version.h"

#define STORE_THREADS 8
#define MAX_LOOPS 8 /* event loops: one per CPU, up to this */
#define MIN_CAPTURE_BYTES (64u << 20)
#define REAP_INTERVAL_MS 1000 /* the memory store reclaims expired records this often */

extern char **environ;

struct app {
    struct config cfg;
    struct worker_pool *pool;
    struct store *st;
    struct pipeline *pl;
    int exit_status; /* when app_up() fails: 2 for a bad option value found late, else 1 */
    /* One event loop per CPU, each running a front end (all on the listen
     * address) and the upstream client its requests are forwarded with. */
    unsigned nloops;
    struct loop *loops[MAX_LOOPS];
    struct upstream *ups[MAX_LOOPS];
    struct front *fronts[MAX_LOOPS];
    struct admin *admin;
    size_t capture_bytes; /* the upstream clients' cap on an answer, set at start */
};

/* Waits up to <ms> for a signal of <set>. Returns the signal, or 0. */
static int wait_signal(const sigset_t *set, uint64_t ms)
{
    struct timespec ts = { .tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000 };
    int sig = sigtimedwait(set, NULL, &ts);

    return sig > 0 ? sig : 0;
}

/* True when another socket listens on <a>. The front ends set SO_REUSEPORT
 * (each loop gets its share of the connections), so a second proxy started
 * on the same address would silently share its traffic, each with its own
 * memory store: a probe without SO_REUSEPORT finds it first. */
static bool listen_address_taken(const struct config_addr *a)
{
    int one = 1, fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool taken;

    if (fd < 0)
        return false; /* MHD reports what is wrong */
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)); /* TIME_WAIT is fine */
    taken = bind(fd, (const struct sockaddr *)&a->sa, a->sa_len) < 0 && errno == EADDRINUSE;
    close(fd);
    return taken;
}

static unsigned app_requests(const struct app *app)
{
    unsigned n = 0;

    for (unsigned i = 0; i < app->nloops; i++)
        n += app->fronts[i] ? front_requests(app->fronts[i]) : 0;
    return n + pipeline_late(app->pl); /* late exchanges (SPEC §9) */
}

/* Waits until no request is open, up to <deadline_ms>. A second signal ends
 * the wait: the operator asked to stop at once. Returns true when drained. */
static bool drain(struct app *app, const sigset_t *set, uint64_t deadline_ms, bool *ret_forced)
{
    while (app_requests(app) > 0) {
        if (now_ms() >= deadline_ms)
            return false;
        int sig = wait_signal(set, 50);

        if (sig && sig != SIGHUP) {
            *ret_forced = true;
            return false;
        }
    }
    return true;
}

/* Each client connection and each upstream connection is a descriptor: raise
 * the soft limit as far as allowed, and say so when --max-connections cannot fit. */
static void raise_fd_limit(const struct config *cfg)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return;
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 2 * (rlim_t)cfg->max_connections + 64)
        log_warn("--max-connections %u: only %llu file descriptors are allowed (ulimit -n); "
                 "connections past that fail to be accepted",
                 cfg->max_connections, (unsigned long long)rl.rlim_cur);
}

/* <n> bytes in MiB or KiB (rounded down), for log lines. */
static const char *size_text(size_t n, char *out, size_t outlen)
{
    if (n >= (1u << 20))
        snprintf(out, outlen, "%zu MiB", n >> 20);
    else
        snprintf(out, outlen, "%zu KiB", n >> 10);
    return out;
}

/* The store in use, for the start-up line. The Redis URL is shown without
 * its password. */
static const char *store_desc(const struct config *cfg, char *out, size_t outlen)
{

    if (!cfg->enabled)
        return "none (IDEMPOTENCY_ENABLED=false: every request is passthrough)";
    if (!cfg->redis_url) {
        char budget[32];

        snprintf(out, outlen,
                 "memory (%s budget; a restart forgets every key, so a retry after it runs "
                 "again: use --redis for keys that must outlive the process, or to share one "
                 "store between instances)",
                 size_text(cfg->memory_max_bytes, budget, sizeof(budget)));
        return out;
    }
    memcpy(out, "redis ", 6);
    redis_url_redact(cfg->redis_url, out + 6, outlen - 6);
    return out;
}

struct memory_watch {
    uint64_t evictions;    /* at the last warning */
    uint64_t warned_at_ms; /* 0: never */
};

/* An eviction shortens a record's life below --ttl: a retry of that key runs
 * again. The operator hears of it, at most once a minute. */
static void watch_memory_store(struct app *app, struct memory_watch *w)
{
    struct store_memory_stats s;
    uint64_t now = now_ms();
    char budget[32];

    if (!store_is_memory(app->st) || (w->warned_at_ms && now - w->warned_at_ms < 60000))
        return;
    store_memory_stats(app->st, &s);
    if (s.evictions == w->evictions)
        return;
    log_warn("memory store full: %llu completed records evicted before their --ttl ran out "
             "(%llu since start); a retry of an evicted key runs again. Raise "
             "--memory-max-bytes (now %s) or lower --ttl",
             (unsigned long long)(s.evictions - w->evictions), (unsigned long long)s.evictions,
             size_text(s.max_bytes, budget, sizeof(budget)));
    w->evictions = s.evictions;
    w->warned_at_ms = now;
}

static void app_down(struct app *app)
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
static size_t capture_bytes(const struct config *cfg)
{
    const struct route_table *t = cfg->routes;
    size_t most = cfg->max_response_bytes;

    for (size_t i = 0; i <= t->nroutes; i++) {
        if (t->routes[i].cfg.max_response_bytes > most)
            most = t->routes[i].cfg.max_response_bytes;
    }
    return most > MIN_CAPTURE_BYTES / 4 ? most * 4 : MIN_CAPTURE_BYTES;
}

static int app_up(struct app *app)
{
    const struct config *cfg = &app->cfg;
    size_t capture = app->capture_bytes = capture_bytes(cfg);
    struct upstream_options uo = {
        .base_url = cfg->upstream,
        .timeout_ms = cfg->upstream_timeout_ms,
        .late_ms = cfg->upstream_late_timeout_ms,
        .max_capture_bytes = capture,
        .max_connections = cfg->max_connections,
    };
    long ncpu;
    int err;

    err = worker_pool_new(STORE_THREADS, &app->pool);
    if (err < 0) {
        log_error("cannot start the store threads: %s", strerror(-err));
        return err;
    }
    /* The loops first (not started): the Redis store puts a connection on each. */
    ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    app->nloops = ncpu < 1 ? 1 : ncpu > MAX_LOOPS ? MAX_LOOPS : (unsigned)ncpu;
    for (unsigned i = 0; i < app->nloops; i++) {
        err = loop_new(&app->loops[i]);
        if (err < 0) {
            log_error("cannot create an event loop: %s", strerror(-err));
            return err;
        }
    }
    if (cfg->enabled && cfg->redis_url) {
        struct store_redis_opts ro = {
            .url = cfg->redis_url,
            .password = cfg->redis_password,
            .tls = { .ca_file = cfg->redis_tls_ca_file,
                     .cert_file = cfg->redis_tls_cert_file,
                     .key_file = cfg->redis_tls_key_file,
                     .insecure = cfg->redis_tls_insecure },
            .tls_server_name = cfg->redis_tls_server_name,
            .timeout_ms = cfg->store_timeout_ms,
            .wait_replicas = cfg->redis_wait_replicas,
            .wait_timeout_ms = cfg->redis_wait_timeout_ms,
        };
        char why[512];

        err = store_redis_new(&ro, app->pool, app->loops, app->nloops, &app->st, why, sizeof(why));
        if (err < 0) {
            char redacted[512];

            redis_url_redact(cfg->redis_url, redacted, sizeof(redacted));
            if (err == -EINVAL && why[0]) {
                /* a TLS file that cannot be used: a bad option value */
                log_error("--redis %s: %s", redacted, why);
                app->exit_status = 2;
            } else {
                log_error("--redis %s: cannot use this URL: %s", redacted, strerror(-err));
            }
            return err;
        }
        if (cfg->redis_tls_insecure)
            log_warn("--redis-tls-insecure: Redis's certificate is not verified; anyone on the "
                     "path can read and change what the store holds");
    } else if (cfg->enabled) {
        err = store_memory_new(cfg->memory_max_bytes, REAP_INTERVAL_MS, app->pool, &app->st);
        if (err < 0) {
            log_error("cannot create the memory store: %s", strerror(-err));
            return err;
        }
    }
    err = pipeline_new(cfg, app->st, app->pool,
                       &(struct pipeline_forwarder){ .submit = forward_on_loop, .ctx = app },
                       &app->pl);
    if (err < 0)
        return err;
    if (listen_address_taken(&cfg->listen)) {
        log_error("--listen %s: cannot listen there: another process listens on it",
                  cfg->listen.text);
        return -EADDRINUSE;
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
            log_error("--listen %s: cannot listen there (address in use, or not this host's?)",
                      cfg->listen.text);
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
    err = admin_start(cfg, app->st, &app->admin);
    if (err < 0) {
        log_error("--admin-listen %s: cannot listen there (address in use, or not this host's?)",
                  cfg->admin_listen.text);
        return err;
    }
    return 0;
}

/* Writes each line of <problems> to stderr, after "idemproxy: ". */
static void print_problems(const char *problems)
{
    for (const char *p = problems; *p;) {
        size_t n = strcspn(p, "\n");

        fprintf(stderr, "idemproxy: %.*s\n", (int)n, p);
        p += n + (p[n] == '\n');
    }
}

/* The settings SIGHUP cannot change (SPEC §6), and those the modules took
 * at start: <name> when <a> and <b> differ in it, else NULL. */
static const char *restart_setting(const struct config *a, const struct config *b, size_t i)
{
#define SAME_STR(x, y) ((!(x) && !(y)) || ((x) && (y) && strcmp((x), (y)) == 0))
    switch (i) {
    case 0:
        return strcmp(a->listen.text, b->listen.text) ? "listen" : NULL;
    case 1:
        return strcmp(a->admin_listen.text, b->admin_listen.text) ? "admin-listen" : NULL;
    case 2:
        return SAME_STR(a->upstream, b->upstream) ? NULL : "upstream";
    case 3:
        return SAME_STR(a->redis_url, b->redis_url) ? NULL : "redis";
    case 4:
        return a->memory_max_bytes != b->memory_max_bytes ? "memory-max-bytes" : NULL;
    case 5:
        return a->max_connections != b->max_connections ? "max-connections" : NULL;
    case 6:
        return a->enabled != b->enabled ? "IDEMPOTENCY_ENABLED" : NULL;
    case 7:
        return SAME_STR(a->key_prefix, b->key_prefix) ? NULL : "key-prefix";
    case 8:
        return a->store_timeout_ms != b->store_timeout_ms ? "store-timeout" : NULL;
    case 9:
        return a->upstream_timeout_ms != b->upstream_timeout_ms ? "upstream-timeout" : NULL;
    case 10:
        return a->client_timeout_ms != b->client_timeout_ms ? "client-timeout" : NULL;
    case 11:
        return SAME_STR(a->admin_token_file, b->admin_token_file) ? NULL : "admin-token-file";
    case 12:
        return (a->redis_wait_replicas != b->redis_wait_replicas ||
                a->redis_wait_timeout_ms != b->redis_wait_timeout_ms)
                   ? "redis-wait-replicas/redis-wait-timeout"
                   : NULL;
    case 13:
        return (!SAME_STR(a->redis_password_file, b->redis_password_file) ||
                !SAME_STR(a->redis_tls_ca_file, b->redis_tls_ca_file) ||
                !SAME_STR(a->redis_tls_cert_file, b->redis_tls_cert_file) ||
                !SAME_STR(a->redis_tls_key_file, b->redis_tls_key_file) ||
                !SAME_STR(a->redis_tls_server_name, b->redis_tls_server_name) ||
                a->redis_tls_insecure != b->redis_tls_insecure)
                   ? "redis-password-file/redis-tls-*"
                   : NULL;
    case 14:
        return a->upstream_late_timeout_ms != b->upstream_late_timeout_ms ? "upstream-late-timeout"
                                                                          : NULL;
    default:
        return NULL;
    }
#undef SAME_STR
}

#define RESTART_SETTINGS 15

/* Logs each line of <text> at <level>, after "reload: ". */
static void log_lines(enum log_level level, const char *text)
{
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");

        LOG(level, "reload: %.*s", (int)n, p);
        p += n + (p[n] == '\n');
    }
}

/* SIGHUP: reads the configuration again (the same flags and environment,
 * the file as it is now). A valid one gives the requests that begin from
 * now on its routes and settings, and its log level and format; what needs a
 * restart keeps its value, and is said. An invalid one changes nothing. */
static void reload(struct app *app, int argc, char **argv)
{
    struct config next = { 0 };
    struct route_table *t, *old;
    char err[8192] = "", why[4096];
    size_t restart = 0;

    if (config_load(&next, argc, argv, environ, err, sizeof(err)) < 0) {
        log_lines(LOG_LEVEL_ERROR, err);
        log_error("reload: the configuration has problems; nothing was changed");
        metrics_config_reload(false);
        config_done(&next);
        return;
    }
    for (size_t i = 0; i < RESTART_SETTINGS; i++) {
        const char *name = restart_setting(&app->cfg, &next, i);

        if (name) {
            log_warn("reload: %s changed: it needs a restart, and keeps its value until then",
                     name);
            restart++;
        }
    }
    /* The routes run under the settings that need a restart as they are. */
    t = next.routes;
    for (size_t i = 0; i <= t->nroutes; i++) {
        struct config *rc = &t->routes[i].cfg;
        char *prefix = strdup(app->cfg.key_prefix);

        if (prefix) {
            free(rc->key_prefix);
            rc->key_prefix = prefix;
        }
        rc->enabled = app->cfg.enabled;
    }
    if (capture_bytes(&next) > app->capture_bytes) {
        log_warn("reload: a max-response this large needs a restart: until then an answer over "
                 "%zu bytes is cut and answered 502",
                 app->capture_bytes);
        restart++;
    }
    if (pipeline_set_routes(app->pl, t, why, sizeof(why)) > 0)
        log_lines(LOG_LEVEL_WARN, why);
    old = app->cfg.routes; /* the running configuration holds the table in use */
    app->cfg.routes = t;
    next.routes = NULL;
    route_table_unref(old);
    metrics_config_reload(true);
    log_info("reload: %s applied: %zu routes%s",
             app->cfg.config_file ? app->cfg.config_file : "the configuration", t->nroutes,
             restart ? "; see above for what needs a restart" : "");
    log_setup(next.log_level, next.log_format); /* after the line above, which it may silence */
    config_done(&next);
}

int main(int argc, char **argv)
{
    struct app app = { 0 };
    char err[8192] = "";
    sigset_t set;
    bool forced = false;
    char storedesc[320];
    struct memory_watch watch = { 0 };
    int sig;

    if (config_load(&app.cfg, argc, argv, environ, err, sizeof(err)) < 0) {
        print_problems(err);
        config_done(&app.cfg);
        return 2;
    }
    if (app.cfg.show_help || app.cfg.show_version) {
        if (app.cfg.show_help)
            config_print_help(stdout);
        else
            printf("idemproxy %s\n", IDEMPROXY_VERSION);
        config_done(&app.cfg);
        return 0;
    }
    if (app.cfg.check_config) {
        printf("idemproxy: the configuration is valid (%s%s%zu routes)\n",
               app.cfg.config_file ? app.cfg.config_file : "no file",
               app.cfg.config_file ? ": " : ", ", app.cfg.routes->nroutes);
        config_done(&app.cfg);
        return 0;
    }
    log_setup(app.cfg.log_level, app.cfg.log_format);

    /* Signals are taken by the main thread alone: block them before any thread starts. */
    raise_fd_limit(&app.cfg);
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    if (app_up(&app) < 0) {
        app_down(&app);
        config_done(&app.cfg);
        curl_global_cleanup();
        return app.exit_status ? app.exit_status : 1;
    }
    log_info("idemproxy %s listening on %s, admin on %s, upstream %s, store %s", IDEMPROXY_VERSION,
             app.cfg.listen.text, app.cfg.admin_listen.text, app.cfg.upstream,
             store_desc(&app.cfg, storedesc, sizeof(storedesc)));
    if (app.cfg.admin_token)
        log_info("admin /keys requires the bearer token of --admin-token-file %s",
                 app.cfg.admin_token_file);
    else if (!admin_is_loopback(&app.cfg))
        log_warn("admin on %s, not a loopback address, and no --admin-token-file: /keys answers "
                 "403 (health, readiness and metrics stay open)",
                 app.cfg.admin_listen.text);

    do {
        sig = wait_signal(&set, 1000);
        if (sig == SIGHUP) {
            reload(&app, argc, argv);
            sig = 0;
        }
        watch_memory_store(&app, &watch);
    } while (!sig);
    log_info("%s: no longer accepting; finishing %u open requests (up to %.1f s)", strsignal(sig),
             app_requests(&app), app.cfg.shutdown_timeout_ms / 1000.0);
    for (unsigned i = 0; i < app.nloops; i++)
        front_quiesce(app.fronts[i]);
    pipeline_quiesce(app.pl);
    if (!drain(&app, &set, now_ms() + app.cfg.shutdown_timeout_ms, &forced) && !forced) {
        /* Cut the upstream calls still running: their locks are released (or,
         * when the request may have reached the upstream, their keys made
         * unknown) and their clients answered, which the store needs a
         * moment for. */
        log_warn("--shutdown-timeout reached with %u requests open: cancelling them",
                 app_requests(&app));
        for (unsigned i = 0; i < app.nloops; i++)
            upstream_cancel(app.ups[i]); /* a forward from now on gets -ECANCELED: 502 */
        (void)drain(&app, &set, now_ms() + 2 * app.cfg.store_timeout_ms + 1000, &forced);
    }
    if (forced || app_requests(&app) > 0) {
        log_warn("exiting with %u requests open; their locks' leases run out within --lock-ttl",
                 app_requests(&app));
        _exit(0);
    }
    app_down(&app);
    config_done(&app.cfg);
    curl_global_cleanup();
    log_info("stopped");
    return 0;
}
