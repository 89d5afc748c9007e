/* SPDX-License-Identifier: MIT */
/* The admin listener on its own MHD thread: health, readiness and metrics.
 * Health answers come from constant buffers; readiness reads the store's
 * cached state; /metrics is formatted afresh for each scrape. */
#include "idemproxy/admin.h"

#include <microhttpd.h>
#include <stdlib.h>

#include "idemproxy/admin_keys.h"
#include "idemproxy/buf.h"
#include "idemproxy/config.h"
#include "idemproxy/metrics.h"
#include "idemproxy/store.h"

struct admin {
    struct store *st;
    const char *key_prefix; /* borrowed from the configuration */
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

/* The Prometheus exposition, built fresh on each scrape (a few kB). */
static enum MHD_Result serve_metrics(struct MHD_Connection *conn, struct store *st)
{
    struct buf out = BUF_INIT(1u << 20);
    struct MHD_Response *resp;
    enum MHD_Result ret;

    if (metrics_format(&out, st) < 0) {
        buf_done(&out);
        return reply(conn, 500, "out of memory\n");
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

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct admin *a = cls;

    (void)version;
    (void)upload_data;
    (void)con_cls;
    if (*upload_data_size) {
        *upload_data_size = 0; /* no admin path takes a body */
        return MHD_YES;
    }
    if (strncmp(url, ADMIN_KEYS_PATH, strlen(ADMIN_KEYS_PATH)) == 0)
        return admin_keys_serve(conn, a->st, a->key_prefix, url, method);
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return reply(conn, 405, "method not allowed\n");
    if (strcmp(url, "/healthz") == 0)
        return reply(conn, 200, "ok\n");
    if (strcmp(url, "/readyz") == 0) {
        if (!a->st || store_is_ready(a->st))
            return reply(conn, 200, "ready\n");
        return reply(conn, 503, "store unavailable\n");
    }
    if (strcmp(url, "/metrics") == 0)
        return serve_metrics(conn, a->st);
    return reply(conn, 404, "not found: try /healthz, /readyz or /metrics\n");
}

int admin_start(const struct config *cfg, struct store *st, struct admin **ret)
{
    struct admin *a = calloc(1, sizeof(*a));
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL;

    if (!a)
        return -ENOMEM;
    a->st = st;
    a->key_prefix = cfg->key_prefix;
    if (cfg->admin_listen.sa.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    a->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, a, MHD_OPTION_SOCK_ADDR,
                            &cfg->admin_listen.sa, MHD_OPTION_CONNECTION_LIMIT, 64u,
                            MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_LISTENING_ADDRESS_REUSE,
                            1u, MHD_OPTION_END);
    if (!a->d) {
        free(a);
        return -EADDRINUSE;
    }
    *ret = a;
    return 0;
}

void admin_stop(struct admin *a)
{
    if (!a)
        return;
    MHD_stop_daemon(a->d);
    free(a);
}
