/* SPDX-License-Identifier: MIT */
/* The client-facing server: libmicrohttpd in epoll mode, driven from the
 * event loop it shares with the upstream (its epoll set is one descriptor in
 * the loop's). A request is created when its request line arrives (with the
 * raw target), fed to the pipeline, suspended while it runs, and answered
 * when resumed. */
#include "idemproxy/front.h"

#include <microhttpd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idemproxy/config.h"
#include "idemproxy/flow.h"
#include "idemproxy/front_tls.h"
#include "idemproxy/http.h"
#include "idemproxy/list.h"
#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "idemproxy/metrics.h"
#include "idemproxy/pipeline.h"
#include "idemproxy/record.h"
#include "idemproxy/request.h"

/* Each client connection's memory pool: its request line and header section,
 * parsed in place, and its answer's header block. MHD clears the whole pool
 * after every request, so each connection that has been answered holds all
 * of it, and 1000 slow clients hold 1000: 13 KiB takes a header section of
 * 8 KiB with an answer head of UPSTREAM_HEAD_MAX (4 KiB) beside it, or a
 * header section of about 12 KiB alone; a larger one is answered 431. */
#define FRONT_CONNECTION_MEMORY (13u << 10)

/* A client connection while its header section is due. libmicrohttpd's
 * connection timeout counts idle time only: a client sending one byte a
 * second would hold its connection for ever. --client-timeout bounds the
 * whole header section instead, from the connection's start or the end of
 * its previous request. */
struct fconn {
    struct list_node node;  /* in front.heads, oldest first, while its header section is due */
    struct list_node sniff; /* in front.sniffs until its first bytes came (HTTPS) */
    uint64_t since_ms;
    uint64_t started_ms;
    MHD_socket fd;
};

/* A request as the front end knows it: the request it hands the pipeline,
 * and what only the front end needs. Loop thread, but for the answer,
 * which on_answer() may set from another thread before it resumes the
 * connection. */
struct freq {
    struct front *f;
    struct request *rq;            /* owned until pipeline_begin() takes it */
    struct pipeline_req *pr;       /* the pipeline's, from pipeline_begin() on */
    const char *head_uri;          /* where libmicrohttpd parsed the target, in its buffer */
    struct MHD_Connection *conn;   /* from its head on */
    bool waiting;                  /* the body is in: it waits, suspended, for the answer */
    bool body_paused;              /* suspended: the upstream has no room for its body yet */
    struct pipeline_answer answer; /* its record is a reference of ours */
    bool answered;                 /* <answer> is set */
    bool begun;                    /* its header section went to the pipeline */
    bool sent;                     /* the answer is queued */
    bool http10;                   /* an HTTP/1.0 request: a body of unknown length ends with the
                                      connection */
};

struct front {
    const struct config *cfg;
    struct pipeline *pl;
    struct MHD_Daemon *d;
    struct loop *loop;       /* borrowed */
    struct loop_watch watch; /* MHD's epoll set */
    struct loop_timer timer; /* when MHD must run even without events */
    bool watched;
    /* MHD has no wake-up of its own when driven from outside: a resumed
     * connection needs MHD to run. From another thread that is this task. */
    struct loop_task kick;
    atomic_bool kick_posted;
    bool rerun;      /* a connection was resumed on the loop thread: MHD must run again */
    int quiesced_fd; /* the listening socket after front_quiesce(), -1 before */
    atomic_uint requests;
    struct list heads;  /* struct fconn whose header section is due, oldest first */
    bool reserved;      /* on_accept() took a slot that its connection has not started in yet */
    bool tls;           /* HTTPS: new connections' first bytes are looked at (front_tls.h) */
    struct list sniffs; /* struct fconn whose first bytes have not come yet, oldest first */
};

/* TLS 1.2 and 1.3 only, GnuTLS's default choices within them. */
#define FRONT_TLS_PRIORITIES "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2"
#define FRONT_SNIFF_MS 1000u

/* Open client sockets of every front end of the process (one per loop, on
 * one port): --max-connections bounds them together. */
static atomic_uint connections;

/* Beyond --max-connections a new connection is closed at once: MHD itself
 * would leave it waiting in the listen backlog (it stops accepting at its
 * limit when suspend/resume is on), which a client sees as a hang. The slot
 * is taken here, in one atomic step: the loops accept at the same time, and
 * a look then an add let two of them take the last slot. MHD starts the
 * connection (on_connection) right after, on this thread; when it could not,
 * the next accept gives the slot back. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    struct front *f = cls;

    (void)addr;
    (void)addrlen;
    if (f->reserved) /* the last one accepted never started */
        atomic_fetch_sub_explicit(&connections, 1, memory_order_relaxed);
    f->reserved = false;
    if (atomic_fetch_add_explicit(&connections, 1, memory_order_relaxed) <
        f->cfg->max_connections) {
        f->reserved = true;
        return MHD_YES;
    }
    atomic_fetch_sub_explicit(&connections, 1, memory_order_relaxed);
    metrics_connection_refused();
    log_debug("refused a connection: --max-connections (%u) reached", f->cfg->max_connections);
    return MHD_NO;
}

/* Loop thread (or the thread stopping the daemon), like every MHD callback. */
static void heads_unlink(struct fconn *c)
{
    if (c)
        list_remove(&c->node);
}

/* A header section is due from now. */
static void heads_append(struct front *f, struct fconn *c)
{
    if (!c)
        return;
    list_remove(&c->node);
    c->since_ms = now_ms();
    list_append(&f->heads, &c->node);
}

static struct fconn *conn_fconn(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

    return ci ? ci->socket_context : NULL;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct front *f = cls;
    struct fconn *c;

    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);

        if (f->reserved)
            f->reserved = false; /* its slot was taken in on_accept() */
        else
            atomic_fetch_add_explicit(&connections, 1, memory_order_relaxed);
        c = ci ? calloc(1, sizeof(*c)) : NULL; /* without it: only the idle timeout */
        if (c) {
            c->fd = ci->connect_fd;
            c->started_ms = now_ms();
            heads_append(f, c);
            /* before MHD reads a byte of it: its first bytes may be in already */
            if (f->tls && !front_tls_sniff(c->fd))
                list_append(&f->sniffs, &c->sniff);
        }
        *socket_context = c;
        return;
    }
    atomic_fetch_sub_explicit(&connections, 1, memory_order_relaxed);
    c = *socket_context;
    if (c)
        list_remove(&c->sniff);
    heads_unlink(c);
    free(c);
    *socket_context = NULL;
}

/* Cuts off the connections whose header section is overdue: shutdown() makes
 * libmicrohttpd read the end of the stream and close the connection itself.
 * Returns when the next one is due. */
static uint64_t heads_expire(struct front *f)
{
    uint64_t now = now_ms(), limit = f->cfg->client_timeout_ms;
    struct list_node *n;

    while ((n = list_first(&f->heads))) {
        struct fconn *c = list_entry(n, struct fconn, node);

        if (now - c->since_ms < limit)
            return c->since_ms + limit;
        heads_unlink(c);
        log_debug("closed a connection: no complete header section within --client-timeout");
        (void)shutdown(c->fd, SHUT_RDWR);
    }
    return UINT64_MAX;
}

/* Runs first for every request, with the target exactly as received (the
 * access handler only gets it percent-decoded and split). */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    struct front *f = cls;
    struct freq *q = calloc(1, sizeof(*q));

    (void)conn;
    if (!q)
        return NULL;
    q->rq = request_new(uri);
    if (!q->rq) {
        free(q);
        return NULL;
    }
    q->f = f;
    q->head_uri = uri; /* front_head_hidden() checks its place in the header section */
    q->rq->loop = f->loop;
    atomic_fetch_add_explicit(&f->requests, 1, memory_order_relaxed);
    return q;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct front *f = cls;
    struct freq *q = *con_cls;

    (void)toe;
    heads_append(f, conn_fconn(conn)); /* the next request's header section is due */
    if (!q)
        return;
    *con_cls = NULL;
    request_free(q->rq);
    pipeline_req_free(q->pr);
    record_unref(q->answer.rec);
    free(q);
    atomic_fetch_sub_explicit(&f->requests, 1, memory_order_release);
}

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      size_t key_size, const char *value, size_t value_size)
{
    struct request *rq = cls;

    (void)kind;
    /* RFC 9110 section 5.5: the whitespace around a value is not part of it;
     * libmicrohttpd strips only what comes before. */
    while (value_size > 0 && (value[value_size - 1] == ' ' || value[value_size - 1] == '\t'))
        value_size--;
    if (request_add_header(rq, (struct span){ key, key_size }, (struct span){ value, value_size }) <
        0)
        return MHD_NO;
    return MHD_YES;
}

static void client_ip(struct MHD_Connection *conn, char *out, size_t len)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

    http_address_text(ci ? ci->client_addr : NULL, out, len);
}

#define HEAD_HIDDEN                                                                                \
    "a header section whose bytes the HTTP layer could not pass on whole (a NUL byte in the "      \
    "request line or a field value, or a folded field line)"

/* Whether <p> (<len> bytes) lies inside <head>; its offset in <ret_at>. The
 * pointers come from libmicrohttpd and may point elsewhere (a folded line is
 * moved): they are compared as integers, and only read once inside. */
static bool head_offset(struct span head, const char *p, size_t len, size_t *ret_at)
{
    uintptr_t a = (uintptr_t)head.base, x = (uintptr_t)p;

    if (!p || x < a || x - a > head.len || len > head.len - (x - a))
        return false;
    *ret_at = (size_t)(x - a);
    return true;
}

/* Skips from <at> between <min> and <max> NUL bytes (the parser's line ends). */
static bool head_line_end(struct span head, size_t *at, size_t min, size_t max)
{
    size_t n = 0;

    while (*at < head.len && n < max && head.base[*at] == '\0') {
        (*at)++;
        n++;
    }
    return n >= min;
}

static size_t head_skip_ows(struct span head, size_t at)
{
    while (at < head.len && (head.base[at] == ' ' || head.base[at] == '\t'))
        at++;
    return at;
}

const char *front_head_hidden(struct span head, struct span method, struct span uri,
                              struct span version, const struct http_header *h, size_t n)
{
    size_t at, start;

    /* The request line: method, its SP (now a NUL), maybe more spaces, the
     * target, its SP (now a NUL), the version. */
    if (method.base != head.base || method.len >= head.len || head.base[method.len] != '\0')
        return HEAD_HIDDEN;
    at = method.len + 1;
    while (at < head.len && head.base[at] == ' ')
        at++;
    if (!head_offset(head, uri.base, uri.len, &start) || start != at)
        return HEAD_HIDDEN;
    at += uri.len;
    if (at >= head.len || head.base[at] != '\0')
        return HEAD_HIDDEN;
    at++;
    if (!head_offset(head, version.base, version.len, &start) || start != at)
        return HEAD_HIDDEN;
    at += version.len;
    for (size_t i = 0; i < n; i++) {
        /* a line end (CRLF or LF), the name, its colon (now a NUL), OWS, the value */
        if (!head_line_end(head, &at, 1, 2) ||
            !head_offset(head, h[i].name.base, h[i].name.len, &start) || start != at)
            return HEAD_HIDDEN;
        at += h[i].name.len;
        if (at >= head.len || head.base[at] != '\0')
            return HEAD_HIDDEN;
        at = head_skip_ows(head, at + 1);
        if (!head_offset(head, h[i].value.base, h[i].value.len, &start) || start != at)
            return HEAD_HIDDEN;
        at = head_skip_ows(head, at + h[i].value.len); /* trailing whitespace, cut from the value */
    }
    /* the last line's end and the blank line */
    if (!head_line_end(head, &at, 2, 4) || at != head.len)
        return HEAD_HIDDEN;
    return NULL;
}

static void record_unref_cb(void *cls) { record_unref(cls); }

/* Ends the connection of <q> with a reset (Linux: a TCP socket "connected"
 * to AF_UNSPEC drops its connection with an RST, and the descriptor stays
 * libmicrohttpd's to close): the close that follows cannot read as the end
 * of a body delimited by the connection's close. */
static void reset_connection(struct freq *q)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(q->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct sockaddr sa = { .sa_family = AF_UNSPEC };

    if (ci)
        (void)connect(ci->connect_fd, &sa, sizeof(sa));
}

/* A streamed answer's body, read from its flow as libmicrohttpd asks for it
 * (doc/guarantees.md, "Streaming"): none there yet suspends the connection
 * until the flow has some (on_readable()); a body cut upstream closes the
 * connection without its end (no last chunk, short of Content-Length, or,
 * delimited by the close, a reset). */
static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct freq *q = cls;
    ssize_t n = flow_read(q->answer.body, buf, max);

    (void)pos;
    if (n > 0)
        return n;
    if (n == FLOW_END)
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (n == FLOW_CUT) {
        if (q->http10 && q->answer.body->length == FLOW_LENGTH_UNKNOWN)
            reset_connection(q);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    MHD_suspend_connection(q->conn);
    return 0;
}

/* The flow of a suspended connection has bytes, its end or its cut. */
static void on_readable(void *ctx)
{
    struct freq *q = ctx;

    MHD_resume_connection(q->conn);
    q->f->rerun = true;
    q->f->timer.due_ms = 0;
}

/* The answer of <q> as a response: a streamed one reads its flow, any other
 * borrows the record's body (no copy) and holds a reference on it until MHD
 * is done with it. */
static struct MHD_Response *answer_response(struct freq *q)
{
    struct record *rec = q->answer.rec;
    struct MHD_Response *resp;

    if (q->answer.body) {
        uint64_t len = q->answer.body->length;

        flow_set_reader(q->answer.body, on_readable, q);
        /* the block size is the reader's buffer for a known length; a chunked
         * body is read straight into the connection's write buffer */
        return MHD_create_response_from_callback(
            len == FLOW_LENGTH_UNKNOWN ? MHD_SIZE_UNKNOWN : len, 16u << 10, read_body, q, NULL);
    }
    resp = MHD_create_response_from_buffer_with_free_callback_cls(rec->body.len, rec->body.data,
                                                                  record_unref_cb, record_ref(rec));
    if (!resp)
        record_unref(rec);
    return resp;
}

/* Queues the answer of <q>. */
static enum MHD_Result send_answer(struct MHD_Connection *conn, struct freq *q)
{
    struct record *rec = q->answer.rec;
    struct MHD_Response *resp;
    enum MHD_Result ret;

    q->sent = true;
    if (!rec)
        return MHD_NO; /* out of memory: drop the connection */
    resp = answer_response(q);
    if (!resp)
        return MHD_NO;
    for (size_t i = 0; i < rec->nheaders; i++) {
        if (q->answer.id_header && strcasecmp(rec->headers[i].name, q->answer.id_header) == 0)
            continue; /* a replay's is the first request's: this request's goes below */
        if (MHD_add_response_header(resp, rec->headers[i].name, rec->headers[i].value) == MHD_NO)
            log_debug("dropped response header %s: refused by the HTTP layer",
                      rec->headers[i].name);
    }
    if (q->answer.replayed)
        (void)MHD_add_response_header(resp, q->answer.replay_header, q->answer.replayed);
    if (q->answer.id_header)
        (void)MHD_add_response_header(resp, q->answer.id_header, q->answer.id);
    ret = MHD_queue_response(conn, rec->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static void on_kick(void *ctx)
{
    struct front *f = ctx;

    /* An exchange, not a store: it reads what the last poster wrote, so the
     * resumes made before those posts are seen by the MHD_run() this asks for. */
    (void)atomic_exchange(&f->kick_posted, false);
    f->timer.due_ms = 0;
}

/* The pipeline's one call: the answer is in. Inside pipeline_begin() or
 * pipeline_body() (a refusal) the connection is not suspended, and
 * on_request() sends the answer itself. Otherwise the connection waits,
 * suspended, and this runs on this loop's thread (perhaps inside
 * pipeline_end()) or another one (a worker, or the loop that carried a Redis
 * call made off-loop): MHD runs in the loop's next turn and sends it. */
static void on_answer(void *ctx, const struct pipeline_answer *a)
{
    struct freq *q = ctx;
    struct front *f = q->f;

    q->answer = *a;
    q->answered = true;
    if (!q->waiting)
        return; /* its body is still coming: the last of it sends the answer */
    MHD_resume_connection(q->conn);
    if (loop_on_thread(f->loop)) {
        f->rerun = true;
        f->timer.due_ms = 0;
    } else if (!atomic_exchange(&f->kick_posted, true) && loop_post(f->loop, &f->kick) < 0)
        atomic_store(&f->kick_posted, false); /* stopped: no connection is left to serve */
}

/* The upstream has room for more of a streamed body, or wants no more of
 * it: the connection suspended for it reads on. Loop thread. */
static void on_body_room(void *ctx)
{
    struct freq *q = ctx;

    if (!q->body_paused)
        return;
    q->body_paused = false;
    MHD_resume_connection(q->conn);
    q->f->rerun = true;
    q->f->timer.due_ms = 0;
}

/* The head is in: the request goes to the pipeline. */
static enum MHD_Result begin(struct front *f, struct MHD_Connection *conn, struct freq *q,
                             const char *method, const char *version)
{
    struct request *rq = q->rq;
    const union MHD_ConnectionInfo *size;

    heads_unlink(conn_fconn(conn)); /* the header section is in */
    q->begun = true;
    q->conn = conn;
    rq->method = span_from_cstr(method);
    /* MHD counts the header whose copy failed too: a request is never
     * forwarded with some of its headers missing. */
    if (MHD_get_connection_values_n(conn, MHD_HEADER_KIND, collect_header, rq) != (int)rq->nheaders)
        return MHD_NO;
    client_ip(conn, rq->client_ip, sizeof(rq->client_ip));
    rq->http11 = strcmp(version, MHD_HTTP_VERSION_1_0) != 0;
    q->http10 = !rq->http11;
    size = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    rq->head_error =
        front_head_hidden((struct span){ .base = method, .len = size ? size->header_size : 0 },
                          rq->method, (struct span){ .base = q->head_uri, .len = rq->target.len },
                          span_from_cstr(version), rq->headers, rq->nheaders);
    q->rq = NULL; /* the pipeline's from here */
    q->pr = pipeline_begin(f->pl, rq, on_answer, q);
    if (!q->pr)
        return MHD_NO;
    pipeline_set_body_wake(q->pr, on_body_room, q);
    if (q->answered)
        return send_answer(conn, q); /* refused: the body is not read */
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct front *f = cls;
    struct freq *q = *con_cls;

    (void)url;
    if (!q)
        return MHD_NO;
    if (q->sent) {
        *upload_data_size = 0; /* answered before the body: discard it */
        return MHD_YES;
    }
    if (!q->begun)
        return begin(f, conn, q, method, version);
    if (*upload_data_size) {
        *upload_data_size -= pipeline_body(q->pr, upload_data, *upload_data_size);
        if (*upload_data_size > 0) {
            /* A streamed body the upstream has no room for yet: libmicrohttpd
             * keeps the rest and hands it again once resumed. */
            q->body_paused = true;
            MHD_suspend_connection(conn);
        }
        return MHD_YES;
    }
    /* The body is complete: an answer decided while it was read, or the one
     * a resumed connection comes back with, goes out now (a streamed body is
     * told its end first: its upstream may still be reading it). */
    if (q->answered) {
        if (!q->waiting)
            pipeline_end(q->pr);
        return send_answer(conn, q);
    }
    if (q->waiting)
        return MHD_YES; /* still waiting */
    q->waiting = true;
    MHD_suspend_connection(conn);
    pipeline_end(q->pr);
    return MHD_YES;
}

/* <fmt> is a printf format from MHD: said so for clang's -Wformat=2. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];

    (void)cls;
    if (!log_enabled(LOG_LEVEL_DEBUG))
        return;
    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    log_write(LOG_LEVEL_DEBUG, "http: %s", line);
}

/* Lets MHD do what is ready, then arms the timer for when it must run next
 * (connection timeouts, or at once while it has work left over). Loop thread. */
/* The HTTPS connections whose first bytes had not come: looked at before
 * MHD runs, so before GnuTLS reads them. A client sends its first bytes
 * (a TLS hello or an HTTP request line) as soon as it connects: one silent
 * for FRONT_SNIFF_MS is given up on, so that the list, and the recv() calls
 * each run makes, stay as short as the connections made in that time. */
static void sniffs_run(struct front *f)
{
    uint64_t now = now_ms();
    struct list_node *n, *next;

    for (n = list_first(&f->sniffs); n; n = next) {
        struct fconn *c = list_entry(n, struct fconn, sniff);

        next = list_next(&f->sniffs, n);
        if (front_tls_sniff(c->fd) || now - c->started_ms >= FRONT_SNIFF_MS)
            list_remove(&c->sniff);
    }
}

static void front_run(struct front *f)
{
    MHD_UNSIGNED_LONG_LONG ms;
    uint64_t heads_due;

    f->rerun = false;
    sniffs_run(f);
    (void)MHD_run(f->d);
    heads_due = heads_expire(f);
    if (f->rerun) /* resumed from inside MHD_run(): an answer found at once */
        f->timer.due_ms = 0;
    else
        f->timer.due_ms = MHD_get_timeout(f->d, &ms) == MHD_YES ? now_ms() + ms : UINT64_MAX;
    if (heads_due < f->timer.due_ms)
        f->timer.due_ms = heads_due;
}

static void on_events(void *ctx, uint32_t events)
{
    (void)events;
    front_run(ctx);
}

static void on_timer(void *ctx) { front_run(ctx); }

bool front_address_taken(const struct config_addr *a)
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

void front_raise_fd_limit(const struct config *cfg)
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

int front_start(const struct config *cfg, struct pipeline *pl, struct loop *loop,
                struct front **ret)
{
    struct MHD_OptionItem tls[4] = { { MHD_OPTION_END, 0, NULL } };
    struct front *f = calloc(1, sizeof(*f));
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    unsigned timeout_s = (unsigned)((cfg->client_timeout_ms + 999) / 1000);
    const union MHD_DaemonInfo *info;
    int err = -EADDRINUSE;

    if (!f)
        return -ENOMEM;
    f->cfg = cfg;
    f->pl = pl;
    f->loop = loop;
    f->quiesced_fd = -1;
    list_init(&f->heads);
    if (cfg->listen.sa.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    list_init(&f->sniffs);
    if (front_tls_on()) {
        /* the pair comes from front_tls.c at each handshake: SIGHUP replaces it */
        f->tls = true;
        flags |= MHD_USE_TLS;
        tls[0] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_CERT_CALLBACK, 0, front_tls_callback() };
        tls[1] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_PRIORITIES, 0,
                                          (void *)(uintptr_t)FRONT_TLS_PRIORITIES };
        tls[2] = (struct MHD_OptionItem){ MHD_OPTION_END, 0, NULL };
    }
    f->d = MHD_start_daemon(
        flags, 0, on_accept, f, on_request, f, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, &cfg->listen.sa, MHD_OPTION_URI_LOG_CALLBACK, on_uri, f,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, f, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        f,
        /* one above ours, so on_accept() refuses before MHD stops accepting */
        MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections + 1, MHD_OPTION_CONNECTION_TIMEOUT,
        timeout_s, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)FRONT_CONNECTION_MEMORY, MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
    if (!f->d)
        goto fail;
    info = MHD_get_daemon_info(f->d, MHD_DAEMON_INFO_EPOLL_FD);
    err = -EINVAL;
    if (!info)
        goto fail;
    f->watch = (struct loop_watch){ .fn = on_events, .ctx = f, .fd = info->epoll_fd };
    f->timer = (struct loop_timer){ .fn = on_timer, .ctx = f, .due_ms = 0 };
    f->kick = (struct loop_task){ .fn = on_kick, .ctx = f };
    err = loop_timer_add(loop, &f->timer);
    if (err < 0)
        goto fail;
    err = loop_watch_add(loop, &f->watch, EPOLLIN);
    if (err < 0) {
        loop_timer_del(loop, &f->timer);
        goto fail;
    }
    f->watched = true;
    *ret = f;
    return 0;

fail:
    if (f->d)
        MHD_stop_daemon(f->d);
    free(f);
    return err;
}

static void quiesce(void *ctx)
{
    struct front *f = ctx;
    MHD_socket s = MHD_quiesce_daemon(f->d);

    /* MHD may still hold the socket in its epoll set, so it is closed only
     * after MHD_stop_daemon(); shutdown() makes the kernel refuse new
     * connections now. */
    if (s == MHD_INVALID_SOCKET)
        return;
    (void)shutdown(s, SHUT_RDWR);
    f->quiesced_fd = s;
}

void front_quiesce(struct front *f) { loop_call(f->loop, quiesce, f); }

unsigned front_requests(const struct front *f) { return atomic_load(&f->requests); }

void front_stop(struct front *f)
{
    if (!f)
        return;
    if (f->watched) {
        loop_watch_del(f->loop, &f->watch);
        loop_timer_del(f->loop, &f->timer);
    }
    MHD_stop_daemon(f->d);
    if (f->quiesced_fd >= 0)
        close(f->quiesced_fd);
    free(f);
}
