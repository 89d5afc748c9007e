/* SPDX-License-Identifier: MIT */
/* The client-facing server on libmicrohttpd's internal epoll thread. A request
 * is created when its request line arrives (with the raw target), fed to the
 * pipeline, suspended while it runs, and answered when resumed. */
#include "idemproxy/front.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "idemproxy/config.h"
#include "idemproxy/log.h"
#include "idemproxy/pipeline.h"
#include "idemproxy/record.h"

/* Each client connection's memory pool: its request line and header section,
 * parsed in place, and its answer's header block. MHD clears the pool for
 * every request, and 1000 slow clients hold 1000 of them: 24 KiB takes a
 * header section of about 20 KiB (nginx's default is 8 KiB a line) and
 * answers a larger one with 431. */
#define FRONT_CONNECTION_MEMORY (24u << 10)

struct front {
    const struct config *cfg;
    struct pipeline *pl;
    struct MHD_Daemon *d;
    int quiesced_fd; /* the listening socket after front_quiesce(), -1 before */
    atomic_uint requests;
    atomic_uint connections; /* open client sockets, for --max-connections */
};

/* Beyond --max-connections a new connection is closed at once: MHD itself
 * would leave it waiting in the listen backlog (it stops accepting at its
 * limit when suspend/resume is on), which a client sees as a hang. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    struct front *f = cls;

    (void)addr;
    (void)addrlen;
    if (atomic_load_explicit(&f->connections, memory_order_relaxed) < f->cfg->max_connections)
        return MHD_YES;
    log_debug("refused a connection: --max-connections (%u) reached", f->cfg->max_connections);
    return MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct front *f = cls;

    (void)conn;
    (void)socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED)
        atomic_fetch_add_explicit(&f->connections, 1, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&f->connections, 1, memory_order_relaxed);
}

/* Runs first for every request, with the target exactly as received (the
 * access handler only gets it percent-decoded and split). */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    struct front *f = cls;
    struct req *r = req_new(f->pl);

    (void)conn;
    if (!r)
        return NULL;
    r->target_buf = strdup(uri);
    if (!r->target_buf) {
        req_free(r);
        return NULL;
    }
    r->target = span_from_cstr(r->target_buf);
    atomic_fetch_add_explicit(&f->requests, 1, memory_order_relaxed);
    return r;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct front *f = cls;
    struct req *r = *con_cls;

    (void)conn;
    (void)toe;
    if (!r)
        return;
    *con_cls = NULL;
    req_free(r);
    atomic_fetch_sub_explicit(&f->requests, 1, memory_order_release);
}

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      size_t key_size, const char *value, size_t value_size)
{
    struct req *r = cls;

    (void)kind;
    if (req_add_header(r, (struct span){ key, key_size }, (struct span){ value, value_size }) < 0)
        return MHD_NO;
    return MHD_YES;
}

static void client_ip(struct MHD_Connection *conn, char *out, size_t len)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;

    out[0] = '\0';
    if (sa && sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out,
                  (socklen_t)len);
    else if (sa && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, out,
                  (socklen_t)len);
}

static void record_unref_cb(void *cls) { record_unref(cls); }

/* Queues the answer of <r>. The response borrows the record's body (no copy)
 * and holds a reference on it until MHD is done with it. */
static enum MHD_Result send_answer(struct front *f, struct MHD_Connection *conn, struct req *r)
{
    struct record *rec = r->answer;
    struct MHD_Response *resp;
    enum MHD_Result ret;

    r->answered = true;
    if (!r->running)
        pipeline_account(f->pl, r); /* refused before running: the pipeline did not count it */
    if (!rec)
        return MHD_NO; /* out of memory: drop the connection */
    resp = MHD_create_response_from_buffer_with_free_callback_cls(rec->body.len, rec->body.data,
                                                                  record_unref_cb, record_ref(rec));
    if (!resp) {
        record_unref(rec);
        return MHD_NO;
    }
    for (size_t i = 0; i < rec->nheaders; i++) {
        if (MHD_add_response_header(resp, rec->headers[i].name, rec->headers[i].value) == MHD_NO)
            log_debug("dropped response header %s: refused by the HTTP layer",
                      rec->headers[i].name);
    }
    if (r->replayed)
        (void)MHD_add_response_header(resp, f->cfg->replay_header, r->replayed);
    ret = MHD_queue_response(conn, rec->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* The pipeline's callback, on a store or upstream thread: the answer is in. */
static void on_done(struct req *r, void *ctx)
{
    (void)r;
    MHD_resume_connection(ctx);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct front *f = cls;
    struct req *r = *con_cls;

    (void)url;
    (void)version;
    if (!r)
        return MHD_NO;
    if (r->answered) {
        *upload_data_size = 0; /* answered before the body: discard it */
        return MHD_YES;
    }
    if (!r->method.base) {
        r->method = span_from_cstr(method);
        /* MHD counts the header whose copy failed too: a request is never
         * forwarded with some of its headers missing. */
        if (MHD_get_connection_values_n(conn, MHD_HEADER_KIND, collect_header, r) !=
            (int)r->nheaders)
            return MHD_NO;
        client_ip(conn, r->client_ip, sizeof(r->client_ip));
        if (pipeline_begin(f->pl, r))
            return send_answer(f, conn, r);
        return MHD_YES;
    }
    if (*upload_data_size) {
        pipeline_body(f->pl, r, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->answer)
        return send_answer(f, conn, r); /* refused while reading, or resumed with the answer */
    if (r->running)
        return MHD_YES;
    MHD_suspend_connection(conn);
    pipeline_run(f->pl, r, on_done, conn);
    return MHD_YES;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];

    (void)cls;
    if (!log_enabled(CONFIG_LOG_DEBUG))
        return;
    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    log_write(CONFIG_LOG_DEBUG, "http: %s", line);
}

int front_start(const struct config *cfg, struct pipeline *pl, struct front **ret)
{
    struct front *f = calloc(1, sizeof(*f));
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    unsigned timeout_s = (unsigned)((cfg->client_timeout_ms + 999) / 1000);

    if (!f)
        return -ENOMEM;
    f->cfg = cfg;
    f->pl = pl;
    f->quiesced_fd = -1;
    if (cfg->listen.sa.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    f->d = MHD_start_daemon(
        flags, 0, on_accept, f, on_request, f, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, &cfg->listen.sa, MHD_OPTION_URI_LOG_CALLBACK, on_uri, f,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, f, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        f,
        /* one above ours, so on_accept() refuses before MHD stops accepting */
        MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections + 1, MHD_OPTION_CONNECTION_TIMEOUT,
        timeout_s, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)FRONT_CONNECTION_MEMORY, MHD_OPTION_END);
    if (!f->d) {
        free(f);
        return -EADDRINUSE;
    }
    *ret = f;
    return 0;
}

void front_quiesce(struct front *f)
{
    MHD_socket s = MHD_quiesce_daemon(f->d);

    /* MHD's thread may still hold the socket in its epoll set, so it is closed
     * only after MHD_stop_daemon(); shutdown() makes the kernel refuse new
     * connections now. */
    if (s == MHD_INVALID_SOCKET)
        return;
    (void)shutdown(s, SHUT_RDWR);
    f->quiesced_fd = s;
}

unsigned front_requests(const struct front *f) { return atomic_load(&f->requests); }

void front_stop(struct front *f)
{
    if (!f)
        return;
    MHD_stop_daemon(f->d);
    if (f->quiesced_fd >= 0)
        close(f->quiesced_fd);
    free(f);
}
