/* SPDX-License-Identifier: MIT */
/* The admin listener on its own MHD thread: health, readiness and metrics.
 * Health answers come from constant buffers; readiness reads the store's
 * cached state; /metrics is formatted afresh for each scrape. */
#include "idemproxy/admin.h"

#include <microhttpd.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <strings.h>

#include <openssl/crypto.h>

#include "idemproxy/admin_keys.h"
#include "idemproxy/buf.h"
#include "idemproxy/config.h"
#include "idemproxy/metrics.h"
#include "idemproxy/store.h"

struct admin {
    struct store *st;
    const char *key_prefix;  /* borrowed from the configuration */
    uint64_t ttl_ms;         /* --ttl: what an operator's answer is kept, if its key does not say */
    size_t max_body;         /* the largest body a PUT /keys may send */
    const char *token;       /* borrowed: --admin-token-file's secret, NULL: none */
    bool loopback;           /* the admin address is a loopback one */
    atomic_bool passthrough; /* --on-store-error passthrough: serves with the store down */
    atomic_bool draining;    /* SIGTERM came: not ready any more */
    struct MHD_Daemon *d;
};

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *body)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        strlen(body), (void *)(uintptr_t)body, MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret;

    if (!resp)
        return MHD_NO;
    (void)MHD_add_response_header(resp, "Content-Type", "text/plain; charset=utf-8");
    (void)MHD_add_response_header(resp, "Cache-Control", "no-store");
    ret = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static void free_cb(void *p) { free(p); }

/* The Prometheus exposition, built fresh on each scrape: a few kB, up to
 * about 1.6 MB with METRICS_ROUTES_MAX routes. */
static enum MHD_Result serve_metrics(struct MHD_Connection *conn, struct store *st)
{
    struct buf out = BUF_INIT(METRICS_TEXT_MAX);
    struct MHD_Response *resp;
    enum MHD_Result ret;

    if (metrics_format(&out, st) < 0) {
        buf_done(&out);
        return admin_keys_problem(conn, PROBLEM_ADMIN_INTERNAL, "out of memory", NULL);
    }
    resp = MHD_create_response_from_buffer_with_free_callback(out.len, out.data, free_cb);
    if (!resp) {
        buf_done(&out);
        return MHD_NO;
    }
    (void)MHD_add_response_header(resp, "Content-Type", METRICS_CONTENT_TYPE);
    (void)MHD_add_response_header(resp, "Cache-Control", "no-store");
    ret = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* /readyz: 503 once draining; else 200 while requests are served as
 * configured, which with --on-store-error passthrough they are even with
 * the store down ("degraded": unprotected, doc/operations.md). */
static enum MHD_Result serve_ready(struct MHD_Connection *conn, struct admin *a)
{
    if (atomic_load_explicit(&a->draining, memory_order_relaxed))
        return reply(conn, 503, "draining\n");
    if (!a->st || store_is_ready(a->st))
        return reply(conn, 200, "ready\n");
    if (atomic_load_explicit(&a->passthrough, memory_order_relaxed))
        return reply(conn, 200, "degraded\n");
    return reply(conn, 503, "store unavailable\n");
}

enum admin_access admin_keys_access(const char *token, bool loopback, const char *authorization)
{
    size_t len;

    if (!token)
        return loopback ? ADMIN_ACCESS_ALLOWED : ADMIN_ACCESS_FORBIDDEN;
    len = strlen(token);
    /* Compared in constant time: the time taken says nothing of the token. */
    if (authorization && strncasecmp(authorization, "Bearer ", 7) == 0 &&
        strlen(authorization + 7) == len && CRYPTO_memcmp(authorization + 7, token, len) == 0)
        return ADMIN_ACCESS_ALLOWED;
    return ADMIN_ACCESS_UNAUTHORIZED;
}

/* One admin request: its raw target, and the body of a PUT /keys. */
struct admin_req {
    char *target;    /* owned */
    struct buf body; /* limited to the admin's max_body */
    bool started;    /* the headers were seen: the body, if any, follows */
    bool too_large;
};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct admin *a = cls;
    struct admin_req *q = *con_cls;
    bool is_keys = strncmp(url, ADMIN_KEYS_PATH, strlen(ADMIN_KEYS_PATH)) == 0 ||
                   strcmp(url, ADMIN_KEYS_LIST_PATH) == 0;

    (void)version;
    if (*upload_data_size) {
        /* only PUT /keys/<key> takes a body */
        if (q && is_keys && strcmp(method, "PUT") == 0 && !q->too_large &&
            buf_append(&q->body, upload_data, *upload_data_size) < 0) {
            q->too_large = true;
            buf_done(&q->body);
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (is_keys) {
        switch (admin_keys_access(
            a->token, a->loopback,
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization"))) {
        case ADMIN_ACCESS_FORBIDDEN:
            return admin_keys_problem(
                conn, PROBLEM_ADMIN_FORBIDDEN,
                "/keys is served without --admin-token-file only on a loopback "
                "--admin-listen address.",
                NULL);
        case ADMIN_ACCESS_UNAUTHORIZED:
            return admin_keys_problem(conn, PROBLEM_ADMIN_UNAUTHORIZED,
                                      "/keys requires Authorization: Bearer <the token of "
                                      "--admin-token-file>.",
                                      NULL);
        case ADMIN_ACCESS_ALLOWED:
            break;
        }
        if (q && !q->started && strcmp(method, "PUT") == 0) {
            q->started = true; /* the body comes next: answered once it is in */
            return MHD_YES;
        }
        if (!q || !q->target)
            return admin_keys_problem(conn, PROBLEM_ADMIN_INTERNAL, "out of memory", NULL);
        /* the raw target: MHD's decoded <url> would end at a %00 */
        return admin_keys_serve(conn, a->st,
                                &(struct admin_keys_call){ .prefix = a->key_prefix,
                                                           .target = q->target,
                                                           .method = method,
                                                           .body = buf_span(&q->body),
                                                           .body_too_large = q->too_large,
                                                           .ttl_ms = a->ttl_ms });
    }
    if (strcmp(url, "/healthz") != 0 && strcmp(url, "/readyz") != 0 && strcmp(url, "/metrics") != 0)
        return admin_keys_problem(conn, PROBLEM_ADMIN_NOT_FOUND,
                                  "The admin listener serves /healthz, /readyz, /metrics and "
                                  "/keys.",
                                  NULL);
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return admin_keys_problem(conn, PROBLEM_ADMIN_METHOD, "Only GET and HEAD are served here.",
                                  "GET, HEAD");
    if (strcmp(url, "/healthz") == 0)
        return reply(conn, 200, "ok\n");
    if (strcmp(url, "/readyz") == 0)
        return serve_ready(conn, a);
    return serve_metrics(conn, a->st);
}

/* Keeps the raw target of each request: /keys decodes its key itself. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    struct admin *a = cls;
    struct admin_req *q = calloc(1, sizeof(*q));

    (void)conn;
    if (!q)
        return NULL;
    q->target = strdup(uri);
    q->body = BUF_INIT(a->max_body);
    return q;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct admin_req *q = *con_cls;

    (void)cls;
    (void)conn;
    (void)toe;
    if (q) {
        free(q->target);
        buf_done(&q->body);
        free(q);
    }
    *con_cls = NULL;
}

bool admin_is_loopback(const struct config *cfg)
{
    const struct sockaddr_storage *sa = &cfg->admin_listen.sa;

    if (sa->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;

        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;

        return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
               (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127);
    }
    return false;
}

int admin_start(const struct config *cfg, struct store *st, struct admin **ret)
{
    struct admin *a = calloc(1, sizeof(*a));
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL;

    if (!a)
        return -ENOMEM;
    a->st = st;
    a->key_prefix = cfg->key_prefix;
    a->ttl_ms = cfg->route.ttl_ms;
    /* an answer of --max-response in base64, its headers and the JSON around them */
    a->max_body = cfg->route.max_response_bytes / 3 * 4 + (1u << 20);
    a->token = cfg->admin_token;
    a->loopback = admin_is_loopback(cfg);
    admin_follow(a, cfg);
    if (cfg->admin_listen.sa.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    a->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, a, MHD_OPTION_SOCK_ADDR,
                            &cfg->admin_listen.sa, MHD_OPTION_URI_LOG_CALLBACK, on_uri, a,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                            MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
    if (!a->d) {
        free(a);
        return -EADDRINUSE;
    }
    *ret = a;
    return 0;
}

void admin_follow(struct admin *a, const struct config *cfg)
{
    if (a)
        atomic_store_explicit(&a->passthrough,
                              cfg->on_store_error == CONFIG_ON_STORE_ERROR_PASSTHROUGH,
                              memory_order_relaxed);
}

void admin_drain(struct admin *a)
{
    if (a)
        atomic_store_explicit(&a->draining, true, memory_order_relaxed);
}

void admin_stop(struct admin *a)
{
    if (!a)
        return;
    MHD_stop_daemon(a->d);
    free(a);
}
