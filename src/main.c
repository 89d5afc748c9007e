/* SPDX-License-Identifier: MIT */
/* The process: the configuration, the modules up (app.h), then signals:
 * SIGHUP reloads, SIGTERM/SIGINT drains and takes the modules down. The main
 * thread only waits for signals; every other thread is started by a module. */
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idemproxy/admin.h"
#include "idemproxy/app.h"
#include "idemproxy/config.h"
#include "idemproxy/config_file.h"
#include "idemproxy/front.h"
#include "idemproxy/front_tls.h"
#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "idemproxy/metrics.h"
#include "idemproxy/pipeline.h"
#include "idemproxy/route.h"
#include "idemproxy/scope.h"
#include "idemproxy/upstream.h"
#include "idemproxy_version.h"

extern char **environ;

/* Waits up to <ms> for a signal of <set>. Returns the signal, or 0. */
static int wait_signal(const sigset_t *set, uint64_t ms)
{
    struct timespec ts = { .tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000 };
    int sig = sigtimedwait(set, NULL, &ts);

    return sig > 0 ? sig : 0;
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

/* Writes each line of <text> to the log at <level>, after <prefix>, or to
 * stderr after "idemproxy: " when <level> is negative (before the log is set up). */
static void print_lines(int level, const char *prefix, const char *text)
{
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");

        if (level < 0)
            fprintf(stderr, "idemproxy: %.*s\n", (int)n, p);
        else
            LOG((enum log_level)level, "%s%.*s", prefix, (int)n, p);
        p += n + (p[n] == '\n');
    }
}

/* A setting that differs after a reload: one that needs a restart is said. */
static void on_reload_change(void *ctx, const char *name, unsigned traits)
{
    size_t *restart = ctx;

    if (!(traits & CONFIG_RESTART))
        return;
    log_warn("reload: %s changed: it needs a restart, and keeps its value until then", name);
    (*restart)++;
}

/* SIGHUP: the listener's certificate and key are read again, and the
 * upstream's TLS files; a pair that does not load leaves the old one in use. */
static void reload_tls(struct app *app)
{
    char why[1024];
    int r = front_tls_reload(&app->cfg, why, sizeof(why));

    if (r > 0)
        log_info("reload: --tls-cert-file %s and --tls-key-file %s read again: new connections "
                 "use them, open ones go on",
                 app->cfg.tls_cert_file, app->cfg.tls_key_file);
    else if (r < 0)
        log_error("reload: %s; the listener keeps the certificate it had", why);
    r = 0;
    for (unsigned i = 0; i < app->nloops && r >= 0; i++)
        r = upstream_reload_tls(app->ups[i]);
    if (r > 0)
        log_info("reload: the upstream's TLS files read again (--upstream-tls-ca-file, "
                 "--upstream-tls-cert-file, --upstream-tls-key-file): new connections use them");
    else if (r < 0)
        log_error("reload: the upstream's TLS files: %s; new connections to the upstream use "
                  "what was read before",
                  strerror(-r));
}

/* SIGHUP: reads the configuration again (the same flags and environment,
 * the file as it is now), then diff, warn, swap. A valid one gives the
 * requests that begin from now on its routes and settings, and its log level
 * and format; what needs a restart keeps its value, and is said. An invalid
 * one changes nothing. */
static void reload(struct app *app, int argc, char **argv)
{
    struct config next = { 0 };
    struct route_table *t = NULL;
    char err[8192] = "", why[4096];
    size_t restart = 0;

    if (config_file_load(&next, &t, argc, argv, environ, err, sizeof(err)) < 0) {
        print_lines(LOG_LEVEL_ERROR, "reload: ", err);
        log_error("reload: the configuration has problems; nothing was changed");
        metrics_config_reload(false);
        config_done(&next);
        return;
    }
    (void)config_diff(&app->cfg, &next, on_reload_change, &restart);
    if (app_capture_bytes(t) > app->capture_bytes) {
        log_warn("reload: a max-response this large needs a restart: until then an answer over "
                 "%zu bytes is cut and answered 502",
                 app->capture_bytes);
        restart++;
    }
    if (pipeline_set_routes(app->pl, t, why, sizeof(why)) > 0)
        print_lines(LOG_LEVEL_WARN, "reload: ", why);
    config_swap_reloadable(&app->cfg, &next);
    admin_follow(app->admin, &app->cfg);
    reload_tls(app);
    route_table_unref(app->routes); /* the pipeline holds its own reference */
    app->routes = t;
    config_done(&next);
    metrics_config_reload(true);
    log_info("reload: %s applied: %zu routes%s",
             app->cfg.config_file ? app->cfg.config_file : "the configuration", t->nroutes,
             restart ? "; see above for what needs a restart" : "");
    log_setup(app->cfg.log_level,
              app->cfg.log_format); /* after the line above: it may silence it */
}

/* --drain-delay: /readyz is 503 already; the listener goes on accepting
 * for the delay, so that what a load balancer still sends is served. A
 * second signal ends it. Returns true when it ran its course. */
static bool drain_delay(struct app *app, const sigset_t *set, int sig)
{
    uint64_t until = now_ms() + app->cfg.drain_delay_ms;

    if (!app->cfg.drain_delay_ms)
        return true;
    log_info("%s: /readyz answers 503; still accepting for --drain-delay %.1f s", strsignal(sig),
             app->cfg.drain_delay_ms / 1000.0);
    for (uint64_t now = now_ms(); now < until; now = now_ms()) {
        int again = wait_signal(set, until - now);

        if (again && again != SIGHUP)
            return false;
    }
    return true;
}

/* SIGTERM or SIGINT: /readyz turns 503, the listener accepts for
 * --drain-delay more, then no new connection and the open requests finish
 * within --shutdown-timeout (those cut are cancelled). Returns false when
 * requests are still open (a second signal, or cancelled ones that did not
 * report back). */
static bool shut_down(struct app *app, const sigset_t *set, int sig)
{
    bool forced = false;

    admin_drain(app->admin);
    if (!drain_delay(app, set, sig))
        log_warn("a second signal: the drain delay is cut short");
    log_info("%s: no longer accepting; finishing %u open requests (up to %.1f s)", strsignal(sig),
             app_requests(app), app->cfg.shutdown_timeout_ms / 1000.0);
    for (unsigned i = 0; i < app->nloops; i++)
        front_quiesce(app->fronts[i]);
    pipeline_quiesce(app->pl);
    if (!drain(app, set, now_ms() + app->cfg.shutdown_timeout_ms, &forced) && !forced) {
        /* Cut the upstream calls still running: their locks are released (or,
         * when the request may have reached the upstream, their keys made
         * unknown) and their clients answered, which the store needs a
         * moment for. */
        log_warn("--shutdown-timeout reached with %u requests open: cancelling them",
                 app_requests(app));
        for (unsigned i = 0; i < app->nloops; i++)
            upstream_cancel(app->ups[i]); /* a forward from now on gets -ECANCELED: 502 */
        (void)drain(app, set, now_ms() + 2 * app->cfg.store_timeout_ms + 1000, &forced);
    }
    if (!forced && app_requests(app) == 0)
        return true;
    log_warn("exiting with %u requests open; their locks' leases run out within --lock-ttl",
             app_requests(app));
    return false;
}

/* Frees what main() set up, and returns <status>. */
static int app_exit(struct app *app, int status)
{
    app_down(app);
    route_table_unref(app->routes);
    config_done(&app->cfg);
    scope_shutdown(); /* the keys-url fetcher, once no route holds a scope */
    curl_global_cleanup();
    return status;
}

/* An IDEMPROXY_* variable that names no option is ignored: said at start
 * (stderr with --check-config, whose output is not the log). */
static void warn_unknown_env(void *ctx, const char *name, const char *near)
{
    bool checking = *(bool *)ctx;
    char hint[128] = "";

    if (near)
        snprintf(hint, sizeof(hint), " (did you mean %s?)", near);
    if (checking)
        fprintf(stderr, "idemproxy: warning: %s names no option and is ignored%s\n", name, hint);
    else
        log_warn("environment: %s names no option and is ignored%s", name, hint);
}

/* --check-config: an upstream whose name does not resolve now is a warning
 * (DNS may differ where it runs), not an error. */
static void warn_unresolved(const struct config *cfg)
{
    char why[512];

    if (upstream_base_resolve(cfg->upstream, why, sizeof(why)) == -ENOENT)
        fprintf(stderr,
                "idemproxy: warning: --upstream: %s; until it does, requests get 502 "
                "upstream_unavailable\n",
                why);
}

int main(int argc, char **argv)
{
    struct app app = { 0 };
    char err[8192] = "";
    sigset_t set;
    int sig;

    metrics_process_started();
    if (config_file_load(&app.cfg, &app.routes, argc, argv, environ, err, sizeof(err)) < 0) {
        print_lines(-1, "", err);
        return app_exit(&app, 2);
    }
    if (app.cfg.check_config)
        config_each_unknown_env(environ, warn_unknown_env, &app.cfg.check_config);
    if (app.cfg.show_help)
        config_print_help(stdout);
    else if (app.cfg.show_version)
        printf("idemproxy %s\n", IDEMPROXY_VERSION);
    else if (app.cfg.check_config)
        warn_unresolved(&app.cfg);
    if (app.cfg.check_config && !app.cfg.show_help && !app.cfg.show_version)
        printf("idemproxy: the configuration is valid (%s%s%zu routes)\n",
               app.cfg.config_file ? app.cfg.config_file : "no file",
               app.cfg.config_file ? ": " : ", ", app.routes->nroutes);
    if (app.cfg.show_help || app.cfg.show_version || app.cfg.check_config)
        return app_exit(&app, 0);
    log_setup(app.cfg.log_level, app.cfg.log_format);
    config_each_unknown_env(environ, warn_unknown_env, &app.cfg.check_config);

    /* Signals are taken by the main thread alone: block them before any thread starts. */
    front_raise_fd_limit(&app.cfg);
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    if (app_up(&app) < 0)
        return app_exit(&app, app.exit_status ? app.exit_status : 1);
    app_say_started(&app);
    do {
        sig = wait_signal(&set, 1000);
        if (sig == SIGHUP) {
            reload(&app, argc, argv);
            sig = 0;
        }
        app_watch_memory_store(&app);
        log_burst_tick();
    } while (!sig);
    if (!shut_down(&app, &set, sig))
        _exit(0);
    app_exit(&app, 0);
    log_info("stopped");
    return 0;
}
