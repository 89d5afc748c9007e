/* SPDX-License-Identifier: MIT */
/* A Redis connection of our own (redis_conn.h). It lives through these
 * states: CONNECTING (a non-blocking connect), HANDSHAKE (TLS only),
 * OPEN (bytes flow; the set-up's replies may still be due: <setup_left>),
 * and DEAD (failed: every command got its error, the owner was told). The
 * socket is watched level-triggered; TLS records already read into OpenSSL
 * are drained on every read, so none is left waiting for an event that
 * will not come. */
#include "idemproxy/redis_conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "idemproxy/buf.h"
#include "idemproxy/common.h"
#include "idemproxy/loop.h"
#include "idemproxy/tls_files.h"

#define READ_CHUNK 16384

struct redis_tls {
    SSL_CTX *ctx;
    bool insecure;
};

enum conn_state { CONNECTING, HANDSHAKE, OPEN, DEAD };

/* A command waiting for its reply. */
struct pending {
    redis_reply_fn *fn; /* NULL: the reply is not wanted */
    void *ctx;
    uint64_t sent_ms;
    bool setup; /* one of the set-up's: AUTH, SELECT, PING */
};

struct redis_conn {
    struct loop *loop;
    struct redis_conn_handlers h;
    struct loop_watch watch;
    struct loop_timer timer;
    enum conn_state state;
    int fd;
    SSL *ssl;
    bool tls_verify;
    bool tls_want_write; /* SSL_read or SSL_write needs the socket writable */
    redisReader *reader;
    struct buf out;
    size_t out_sent;   /* bytes of <out> written */
    uint32_t events;   /* asked of epoll */
    struct pending *q; /* a ring of the commands waiting for a reply, oldest first */
    size_t q_cap, q_head, q_len;
    unsigned setup_left; /* set-up replies due before ready */
    bool subscribed;
    bool announced; /* ready() was called */
    uint64_t opened_ms, timeout_ms;
    unsigned busy; /* inside a callback of ours: free later */
    bool freed;    /* redis_conn_free() was called while busy */
    char name[280];
    char tls_name[256];
};

/* ---- TLS context ---- */

/* The first OpenSSL error queued, in words, for the log; the queue is emptied. */
static void tls_error(char *out, size_t len)
{
    unsigned long e = ERR_get_error();
    char err[200];

    if (e)
        ERR_error_string_n(e, err, sizeof(err));
    else
        snprintf(err, sizeof(err), "unknown error");
    snprintf(out, len, "TLS: %s", err);
    ERR_clear_error();
}

int redis_tls_new(const struct redis_tls_opts *o, struct redis_tls **ret, char *why, size_t why_len)
{
    struct redis_tls *t = calloc(1, sizeof(*t));
    const struct tls_files files = { .ca_file = o->ca_file,
                                     .cert_file = o->cert_file,
                                     .key_file = o->key_file,
                                     .system_cas = true,
                                     .ca_opt = "--redis-tls-ca-file",
                                     .cert_opt = "--redis-tls-cert-file",
                                     .key_opt = "--redis-tls-key-file" };

    if (!t)
        return -ENOMEM;
    t->insecure = o->insecure;
    t->ctx = SSL_CTX_new(TLS_client_method());
    if (!t->ctx) {
        free(t);
        return -ENOMEM;
    }
    SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_verify(t->ctx, o->insecure ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
    if (tls_files_load(t->ctx, &files, why, why_len) < 0)
        goto fail;
    *ret = t;
    return 0;

fail:
    redis_tls_free(t);
    return -EINVAL;
}

void redis_tls_free(struct redis_tls *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->ctx);
    free(t);
}

/* ---- the command queue ---- */

static int q_push(struct redis_conn *c, redis_reply_fn *fn, void *ctx, uint64_t now, bool setup)
{
    if (c->q_len == c->q_cap) {
        size_t cap = c->q_cap ? c->q_cap * 2 : 64;
        struct pending *q = malloc(cap * sizeof(*q));

        if (!q)
            return -ENOMEM;
        for (size_t i = 0; i < c->q_len; i++)
            q[i] = c->q[(c->q_head + i) % c->q_cap];
        free(c->q);
        c->q = q;
        c->q_cap = cap;
        c->q_head = 0;
    }
    c->q[(c->q_head + c->q_len) % c->q_cap] = (struct pending){ fn, ctx, now, setup };
    c->q_len++;
    return 0;
}

static struct pending q_pop(struct redis_conn *c)
{
    struct pending p = c->q[c->q_head];

    c->q_head = (c->q_head + 1) % c->q_cap;
    c->q_len--;
    return p;
}

/* ---- dying ---- */

static void conn_release(struct redis_conn *c)
{
    if (c->watch.fd >= 0 && c->events)
        loop_watch_del(c->loop, &c->watch);
    c->events = 0;
    loop_timer_del(c->loop, &c->timer);
    if (c->ssl)
        SSL_free(c->ssl);
    c->ssl = NULL;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = c->watch.fd = -1;
}

static void conn_destroy(struct redis_conn *c)
{
    if (c->reader)
        redisReaderFree(c->reader);
    buf_done(&c->out);
    free(c->q);
    free(c);
}

/* Fails every command held with <err>, oldest first. */
static void fail_all(struct redis_conn *c, int err)
{
    while (c->q_len) {
        struct pending p = q_pop(c);

        if (p.fn)
            p.fn(p.ctx, err, NULL);
    }
}

/* The connection failed: everything it holds gets <err>, then the owner is
 * told. Inside our own callbacks, <busy> keeps <c> alive until they return. */
static void conn_fail(struct redis_conn *c, int err, const char *why)
{
    if (c->state == DEAD)
        return;
    c->state = DEAD;
    conn_release(c);
    c->busy++;
    fail_all(c, err);
    if (!c->freed && c->h.down)
        c->h.down(c->h.ctx, err, why);
    c->busy--;
}

/* ---- I/O ---- */

/* Why an SSL_read or SSL_write that returned <r> with SSL_get_error() <e>
 * (neither WANT_READ nor WANT_WRITE) failed. */
static void tls_io_error(int e, const char *what, char *why, size_t why_len)
{
    if (e == SSL_ERROR_ZERO_RETURN ||
        (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == 0))
        snprintf(why, why_len, "the server closed the connection");
    else if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)
        snprintf(why, why_len, "%s: %s", what, strerror(errno));
    else
        tls_error(why, why_len);
    ERR_clear_error();
}

static void watch_update(struct redis_conn *c)
{
    uint32_t ev = EPOLLIN;

    if (c->state == DEAD)
        return;
    if (c->state == CONNECTING || c->tls_want_write ||
        (c->state == OPEN && c->out_sent < c->out.len))
        ev |= EPOLLOUT;
    if (c->state == HANDSHAKE && !c->tls_want_write)
        ev = EPOLLIN;
    if (ev != c->events && loop_watch_mod(c->loop, &c->watch, ev) == 0)
        c->events = ev;
}

/* The next deadline: the set-up's while the connection is not ready, else
 * the oldest command's. */
static void timer_update(struct redis_conn *c)
{
    uint64_t due = UINT64_MAX;

    if (c->state != DEAD && (c->state != OPEN || c->setup_left))
        due = c->opened_ms + c->timeout_ms;
    else if (c->state == OPEN && c->q_len)
        due = c->q[c->q_head].sent_ms + c->timeout_ms;
    c->timer.due_ms = due;
}

/* Writes what the output holds. Returns 0, or a negative errno with <why> set. */
static int flush(struct redis_conn *c, char *why, size_t why_len)
{
    c->tls_want_write = false;
    while (c->out_sent < c->out.len) {
        const char *p = c->out.data + c->out_sent;
        size_t n = c->out.len - c->out_sent;
        ssize_t w;

        if (c->ssl) {
            int r;

            errno = 0;
            r = SSL_write(c->ssl, p, n > INT32_MAX ? INT32_MAX : (int)n);

            if (r <= 0) {
                int e = SSL_get_error(c->ssl, r);

                if (e == SSL_ERROR_WANT_WRITE) {
                    c->tls_want_write = true;
                    break;
                }
                if (e == SSL_ERROR_WANT_READ)
                    break; /* the next read lets it on */
                tls_io_error(e, "write", why, why_len);
                return -ECONNRESET;
            }
            w = r;
        } else {
            w = send(c->fd, p, n, MSG_NOSIGNAL);
            if (w < 0 && (errno == EAGAIN || errno == EINTR))
                break;
            if (w < 0) {
                snprintf(why, why_len, "write: %s", strerror(errno));
                return -ECONNRESET;
            }
        }
        c->out_sent += (size_t)w;
    }
    if (c->out_sent == c->out.len) {
        c->out.len = c->out_sent = 0;
        if (c->out.cap > (1u << 20)) /* let a large body's buffer go */
            buf_done(&c->out);
    }
    return 0;
}

/* One reply from the reader, in order. */
static void dispatch(struct redis_conn *c, redisReply *r)
{
    struct pending p;

    if (c->subscribed && r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
        r->element[0]->type == REDIS_REPLY_STRING && r->element[0]->len == 7 &&
        memcmp(r->element[0]->str, "message", 7) == 0) {
        if (c->h.message)
            c->h.message(c->h.ctx, r);
        return;
    }
    if (!c->q_len) {
        conn_fail(c, -EPROTO, "a reply no command asked for");
        return;
    }
    p = q_pop(c);
    if (p.setup) {
        if (r->type == REDIS_REPLY_ERROR) {
            char why[300];

            snprintf(why, sizeof(why), "the set-up was refused: %.*s",
                     (int)(r->len > 200 ? 200 : r->len), r->str);
            conn_fail(c,
                      redis_reply_is_error(r, "WRONGPASS") || redis_reply_is_error(r, "NOAUTH") ||
                              redis_reply_is_error(r, "NOPERM")
                          ? -EACCES
                          : -EPROTO,
                      why);
            return;
        }
        c->setup_left--; /* on_events() says ready once the last is in */
        return;
    }
    if (p.fn)
        p.fn(p.ctx, 0, r);
}

/* Reads what the socket (and OpenSSL) holds and dispatches every complete
 * reply. Returns 0, or a negative errno with <why> set. */
static int drain(struct redis_conn *c, char *why, size_t why_len)
{
    char chunk[READ_CHUNK];

    for (;;) {
        ssize_t n;

        if (c->ssl) {
            int r;

            errno = 0;
            r = SSL_read(c->ssl, chunk, sizeof(chunk));

            if (r <= 0) {
                int e = SSL_get_error(c->ssl, r);

                if (e == SSL_ERROR_WANT_READ)
                    break;
                if (e == SSL_ERROR_WANT_WRITE) {
                    c->tls_want_write = true;
                    break;
                }
                tls_io_error(e, "read", why, why_len);
                return -ECONNRESET;
            }
            n = r;
        } else {
            n = recv(c->fd, chunk, sizeof(chunk), 0);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                break;
            if (n < 0) {
                snprintf(why, why_len, "read: %s", strerror(errno));
                return -ECONNRESET;
            }
            if (n == 0) {
                snprintf(why, why_len, "the server closed the connection");
                return -ECONNRESET;
            }
        }
        if (redisReaderFeed(c->reader, chunk, (size_t)n) != REDIS_OK) {
            snprintf(why, why_len, "a reply that is not RESP");
            return -EPROTO;
        }
        for (;;) {
            void *reply = NULL;

            if (redisReaderGetReply(c->reader, &reply) != REDIS_OK) {
                snprintf(why, why_len, "a reply that is not RESP: %s", c->reader->errstr);
                return -EPROTO; /* the reader's error is sticky */
            }
            if (!reply)
                break; /* more bytes needed */
            dispatch(c, reply);
            freeReplyObject(reply);
            if (c->state == DEAD || c->freed)
                return 0;
        }
        if ((size_t)n < sizeof(chunk) && !c->ssl)
            break; /* a short read: the socket is empty */
    }
    return 0;
}

/* The TLS handshake, as far as the socket lets it go. */
static int handshake(struct redis_conn *c, char *why, size_t why_len)
{
    int r = SSL_connect(c->ssl), e;

    c->tls_want_write = false;
    if (r == 1) {
        c->state = OPEN;
        return 0;
    }
    e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ)
        return 0;
    if (e == SSL_ERROR_WANT_WRITE) {
        c->tls_want_write = true;
        return 0;
    }
    if (c->tls_verify && SSL_get_verify_result(c->ssl) != X509_V_OK) {
        snprintf(why, why_len, "TLS: the server's certificate failed verification: %s",
                 X509_verify_cert_error_string(SSL_get_verify_result(c->ssl)));
        ERR_clear_error();
        return -EPROTO;
    }
    if (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
        snprintf(why, why_len,
                 "TLS: the server closed the connection during the handshake (is it a "
                 "TLS port? does it want a client certificate?)");
        return -ECONNRESET;
    }
    {
        char err[250];

        tls_error(err, sizeof(err));
        snprintf(why, why_len, "%s (in the handshake)", err);
    }
    return -EPROTO;
}

/* Where a non-blocking connect ended. */
static int connected(struct redis_conn *c, char *why, size_t why_len)
{
    int soerr = 0;
    socklen_t len = sizeof(soerr);

    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
        soerr = errno;
    if (soerr == EINPROGRESS || soerr == EALREADY)
        return 0;
    if (soerr) {
        snprintf(why, why_len, "connect: %s", strerror(soerr));
        return soerr == ECONNREFUSED ? -ECONNREFUSED
               : soerr == ETIMEDOUT  ? -ETIMEDOUT
                                     : -ECONNREFUSED;
    }
    c->state = c->ssl ? HANDSHAKE : OPEN;
    return 0;
}

static void on_events(void *ctx, uint32_t events)
{
    struct redis_conn *c = ctx;
    char why[300] = "";
    int err = 0;

    c->busy++;
    if (c->state == CONNECTING && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
        err = connected(c, why, sizeof(why));
    if (err == 0 && c->state == HANDSHAKE)
        err = handshake(c, why, sizeof(why));
    if (err == 0 && c->state == OPEN && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        err = drain(c, why, sizeof(why));
    if (err == 0 && c->state == OPEN && !c->freed)
        err = flush(c, why, sizeof(why));
    if (err < 0)
        conn_fail(c, err, why);
    if (!c->announced && !c->freed && redis_conn_is_ready(c)) {
        c->announced = true;
        if (c->h.ready)
            c->h.ready(c->h.ctx);
    }
    c->busy--;
    if (c->freed && !c->busy) {
        conn_destroy(c);
        return;
    }
    if (c->state != DEAD) {
        watch_update(c);
        timer_update(c);
    }
}

static void on_timer(void *ctx)
{
    struct redis_conn *c = ctx;
    uint64_t now = now_ms();

    if (c->state == DEAD)
        return;
    timer_update(c);
    if (c->timer.due_ms > now)
        return;
    c->busy++;
    conn_fail(c, -ETIMEDOUT,
              c->state == CONNECTING ? "connect: no answer within the store timeout"
              : c->state == HANDSHAKE
                  ? "TLS: no handshake within the store timeout (is it a TLS port?)"
              : c->setup_left ? "no reply to the set-up within the store timeout (is it Redis? "
                                "a TLS port?)"
                              : "no reply within the store timeout");
    c->busy--;
    if (c->freed && !c->busy)
        conn_destroy(c);
}

/* ---- the interface ---- */

static bool is_ip_literal(const char *s)
{
    struct in6_addr a6;
    struct in_addr a4;

    return inet_pton(AF_INET, s, &a4) == 1 || inet_pton(AF_INET6, s, &a6) == 1;
}

/* Appends one command to the output. */
static int append_command(struct redis_conn *c, int argc, const char **argv, const size_t *lens)
{
    char *cmd = NULL;
    int n = redisFormatCommandArgv(&cmd, argc, argv, lens);
    int err;

    if (n < 0 || !cmd)
        return -ENOMEM;
    err = buf_append(&c->out, cmd, (size_t)n);
    redisFreeCommand(cmd);
    return err;
}

static int setup_command(struct redis_conn *c, int argc, const char **argv, const size_t *lens)
{
    int err = append_command(c, argc, argv, lens);

    if (err == 0)
        err = q_push(c, NULL, NULL, c->opened_ms, true);
    if (err == 0)
        c->setup_left++;
    return err;
}

/* Queues what a new connection sends first: AUTH, SELECT, and a PING. */
static int queue_setup(struct redis_conn *c, const struct redis_conn_opts *o)
{
    int err = 0;

    if (o->password || o->user) {
        /* A user named without a password: AUTH all the same (a nopass user
         * takes any; another says WRONGPASS), never the default user unasked. */
        const char *pw = o->password ? o->password : "";
        const char *argv[] = { "AUTH", o->user ? o->user : pw, pw };
        size_t lens[] = { 4, strlen(argv[1]), strlen(pw) };

        err = setup_command(c, o->user ? 3 : 2, argv, lens);
    }
    if (err == 0 && o->db) {
        char db[16];
        const char *argv[] = { "SELECT", db };
        size_t lens[] = { 6, (size_t)snprintf(db, sizeof(db), "%u", o->db) };

        err = setup_command(c, 2, argv, lens);
    }
    if (err == 0) {
        /* Last, and always: the connection is ready only once the server has
         * answered in RESP (a TCP connect alone proves nothing: a TLS port
         * takes it too). */
        const char *argv[] = { "PING" };
        size_t lens[] = { 4 };

        err = setup_command(c, 1, argv, lens);
    }
    return err;
}

int redis_conn_open(struct loop *loop, const struct redis_conn_opts *o,
                    const struct redis_conn_handlers *h, struct redis_conn **ret)
{
    struct redis_conn *c = calloc(1, sizeof(*c));
    int one = 1, err = 0;

    if (!c)
        return -ENOMEM;
    c->loop = loop;
    c->h = *h;
    c->fd = -1;
    c->out = BUF_INIT(SIZE_MAX);
    c->timeout_ms = o->timeout_ms;
    c->opened_ms = now_ms();
    snprintf(c->name, sizeof(c->name), "%s", o->name ? o->name : "redis");
    c->watch = (struct loop_watch){ .fn = on_events, .ctx = c, .fd = -1 };
    c->timer = (struct loop_timer){ .fn = on_timer, .ctx = c, .due_ms = UINT64_MAX };
    c->reader = redisReaderCreate();
    if (!c->reader) {
        free(c);
        return -ENOMEM;
    }
    err = queue_setup(c, o);
    if (err < 0)
        goto fail;
    c->fd = socket(o->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
    if (c->fd < 0) {
        err = -errno;
        goto fail;
    }
    (void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    (void)setsockopt(c->fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    if (o->tls) {
        c->ssl = SSL_new(o->tls->ctx);
        if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1) {
            err = -ENOMEM;
            goto fail;
        }
        c->tls_verify = !o->tls->insecure;
        snprintf(c->tls_name, sizeof(c->tls_name), "%s", o->tls_name ? o->tls_name : "");
        if (c->tls_name[0] && !is_ip_literal(c->tls_name))
            (void)SSL_set_tlsext_host_name(c->ssl, c->tls_name);
        if (c->tls_verify && c->tls_name[0]) {
            X509_VERIFY_PARAM *param = SSL_get0_param(c->ssl);

            if (is_ip_literal(c->tls_name) ? X509_VERIFY_PARAM_set1_ip_asc(param, c->tls_name) != 1
                                           : SSL_set1_host(c->ssl, c->tls_name) != 1) {
                err = -EINVAL;
                goto fail;
            }
        }
    }
    if (connect(c->fd, (const struct sockaddr *)&o->addr, o->addrlen) < 0 && errno != EINPROGRESS) {
        err = errno == ECONNREFUSED ? -ECONNREFUSED : -errno;
        goto fail;
    }
    c->state = CONNECTING;
    c->watch.fd = c->fd;
    err = loop_watch_add(loop, &c->watch, EPOLLIN | EPOLLOUT);
    if (err < 0)
        goto fail;
    c->events = EPOLLIN | EPOLLOUT;
    err = loop_timer_add(loop, &c->timer);
    if (err < 0)
        goto fail;
    timer_update(c);
    *ret = c;
    return 0;

fail:
    ERR_clear_error();
    conn_release(c);
    conn_destroy(c);
    return err;
}

int redis_conn_command(struct redis_conn *c, int argc, const char **argv, const size_t *lens,
                       redis_reply_fn *fn, void *ctx)
{
    size_t before = c->out.len;
    int err;

    if (c->state == DEAD || c->freed ||
        (c->subscribed && !(lens[0] == 9 && strncasecmp(argv[0], "SUBSCRIBE", 9) == 0)))
        return -ECONNRESET;
    err = append_command(c, argc, argv, lens);
    if (err == 0 && (err = q_push(c, fn, ctx, now_ms(), false)) < 0)
        c->out.len = before;
    if (err < 0)
        return err;
    /* Written when the loop sees the socket writable: commands queued in one
     * turn go out in one write. */
    if (c->state == OPEN && !c->busy) { /* else on_events() sees to both as it returns */
        watch_update(c);
        timer_update(c);
    }
    return 0;
}

int redis_conn_subscribe(struct redis_conn *c, const char *channel, redis_reply_fn *fn, void *ctx)
{
    const char *argv[] = { "SUBSCRIBE", channel };
    size_t lens[] = { 9, strlen(channel) };
    int err = redis_conn_command(c, 2, argv, lens, fn, ctx);

    if (err == 0)
        c->subscribed = true;
    return err;
}

void redis_conn_drive(struct redis_conn *c, unsigned max_wait_ms)
{
    struct pollfd pfd = { .fd = c->fd };
    uint64_t now = now_ms();
    int wait;

    if (c->state == DEAD || c->freed)
        return;
    pfd.events = (short)((c->events & EPOLLIN ? POLLIN : 0) | (c->events & EPOLLOUT ? POLLOUT : 0));
    wait = c->timer.due_ms <= now                ? 0
           : c->timer.due_ms - now < max_wait_ms ? (int)(c->timer.due_ms - now)
                                                 : (int)max_wait_ms;
    if (poll(&pfd, 1, wait) > 0)
        on_events(c, (pfd.revents & POLLIN ? EPOLLIN : 0) | (pfd.revents & POLLOUT ? EPOLLOUT : 0) |
                         (pfd.revents & POLLHUP ? EPOLLHUP : 0) |
                         (pfd.revents & POLLERR ? EPOLLERR : 0));
    else
        on_timer(c);
}

bool redis_conn_is_ready(const struct redis_conn *c)
{
    return c->state == OPEN && c->setup_left == 0;
}

size_t redis_conn_pending(const struct redis_conn *c) { return c->q_len; }

void redis_conn_free(struct redis_conn *c)
{
    if (!c || c->freed)
        return;
    c->freed = true;
    if (c->state != DEAD) {
        c->state = DEAD;
        conn_release(c);
    }
    c->busy++;
    fail_all(c, -ECANCELED);
    c->busy--;
    if (!c->busy)
        conn_destroy(c);
}

bool redis_reply_is_error(const redisReply *r, const char *code)
{
    size_t n = strlen(code);

    return r && r->type == REDIS_REPLY_ERROR && r->len >= n && memcmp(r->str, code, n) == 0 &&
           (r->len == n || r->str[n] == ' ');
}
