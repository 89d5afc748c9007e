/*
 * hop_designs.c - what one upstream GET costs in three designs of the
 * proxy's upstream HTTP/1.1 client (bench/hop-designs runs and tabulates it).
 *
 * usage: hop_designs MODE N PORT BODY_LEN
 *
 *   MODE      own | connect-only | multi
 *   N         how many GETs to send, one after the other (0 allowed)
 *   PORT      the upstream, on 127.0.0.1, answering GET /hop with a
 *             BODY_LEN-byte body and keeping the connection alive
 *
 * All N requests go over ONE kept-alive connection, opened before the
 * first. Each one carries the same request line and eight headers (one of
 * them, X-Request-Id, differs per request), and each answer is checked:
 * status 200, a Content-Length equal to BODY_LEN and exactly that many body
 * bytes received. Any failure ends the run with exit status 1.
 *
 *   own           socket()/connect() once; the head built into a reused
 *                 buffer and sent with one writev(); the answer read with
 *                 read() into a reused 16 KiB buffer, waiting in epoll (the
 *                 socket registered once, edge-triggered, never modified),
 *                 framed by http_parser.
 *   connect-only  libcurl as a transport only: CURLOPT_CONNECT_ONLY and
 *                 curl_easy_perform() to connect once, CURLINFO_ACTIVESOCKET
 *                 registered once in epoll as above; the same head sent with
 *                 curl_easy_send(), the answer read with curl_easy_recv()
 *                 into the same buffer and framed by the same parser code.
 *   multi         what the proxy does today: a curl multi handle driven by
 *                 curl_multi_socket_action() from an epoll loop shaped like
 *                 src/loop.c, one easy handle reused for every request
 *                 (options set again, the headers given as a curl_slist
 *                 built per request, added to and removed from the multi),
 *                 the answer collected by header and write callbacks.
 *
 * In every mode the answer's header lines and body are copied into the same
 * reused sink (struct sink), so that collecting them costs the same.
 *
 * On success it prints one line: mode, n, ok, the number of connections
 * made, the seconds taken by the N requests and requests/s.
 */
#define _GNU_SOURCE /* SOCK_NONBLOCK, SOCK_CLOEXEC, EPOLLRDHUP */

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum {
    RECV_BUF = 16 * 1024, /* one read()/curl_easy_recv() at most */
    HEAD_BUF = 1024,      /* the request head, own and connect-only */
    HDR_STORE = 4096,     /* the answer's header lines, all modes */
    NHEADERS = 8,         /* header lines every request carries */
    WAIT_MS = 10000,      /* the longest wait for one event */
};

/* ---- what every mode sends ------------------------------------------ */

static const char request_line[] = "GET /hop HTTP/1.1";

/* The header lines of request <i>, without CRLF: a fixed set, as a proxy
 * would forward from its client, and an X-Request-Id that differs each
 * time. <host> is "Host: 127.0.0.1:PORT", made once at start-up; <id> is
 * a buffer of at least 32 bytes that the X-Request-Id line is written to. */
static void header_lines(const char *lines[NHEADERS], const char *host, char *id, uint64_t i)
{
    static const char hex[] = "0123456789abcdef";
    static const char prefix[] = "X-Request-Id: ";
    char *p = id;

    memcpy(p, prefix, sizeof(prefix) - 1);
    p += sizeof(prefix) - 1;
    for (int shift = 60; shift >= 0; shift -= 4) /* 16 hex digits of <i> */
        *p++ = hex[(i >> shift) & 0xf];
    *p = '\0';

    lines[0] = host;
    lines[1] = "User-Agent: idemproxy/0.1";
    lines[2] = "Accept: */*";
    lines[3] = "Accept-Encoding: identity";
    lines[4] = "X-Forwarded-For: 192.0.2.44";
    lines[5] = "X-Forwarded-Proto: https";
    lines[6] = "X-Forwarded-Host: api.example.test";
    lines[7] = id;
}

/* Writes the whole head of request <i> (request line, header lines, empty
 * line) into <buf> of HEAD_BUF bytes; returns its length. */
static size_t build_head(char *buf, const char *host, uint64_t i)
{
    const char *lines[NHEADERS];
    char id[32];
    size_t len = 0;

    header_lines(lines, host, id, i);
    memcpy(buf, request_line, sizeof(request_line) - 1);
    len += sizeof(request_line) - 1;
    buf[len++] = '\r';
    buf[len++] = '\n';
    for (int k = 0; k < NHEADERS; k++) {
        size_t n = strlen(lines[k]);

        if (len + n + 4 > HEAD_BUF) /* the lines are short: cannot happen */
            abort();
        memcpy(buf + len, lines[k], n);
        len += n;
        buf[len++] = '\r';
        buf[len++] = '\n';
    }
    buf[len++] = '\r';
    buf[len++] = '\n';
    return len;
}

/* ---- where every mode puts the answer -------------------------------- */

struct sink {
    int status;             /* the status code, 0 before the head */
    long long content_len;  /* the Content-Length header, -1 if none */
    char hdrs[HDR_STORE];   /* the header lines, "name: value\n" each */
    size_t hdrs_len;
    char *body;             /* the body, grown when needed, kept */
    size_t body_len, body_cap;
    bool complete;          /* the whole answer is in */
    bool keep_alive;        /* the connection may carry the next request */
    /* http_parser only: a name or a value may come in pieces when the head
     * is split across reads, so where the current line starts is kept. */
    bool in_value;          /* a value's bytes came last */
    bool cl_field;          /* the current header is Content-Length */
    size_t name_off;        /* where the current header's name starts in hdrs */
    size_t value_off;       /* where its value starts */
};

static void sink_reset(struct sink *s)
{
    s->status = 0;
    s->content_len = -1;
    s->hdrs_len = s->body_len = s->name_off = s->value_off = 0;
    s->complete = s->keep_alive = s->cl_field = s->in_value = false;
}

static int sink_header_bytes(struct sink *s, const char *at, size_t n)
{
    if (n > sizeof(s->hdrs) - s->hdrs_len)
        return -1; /* a head this big is not what this bench expects */
    memcpy(s->hdrs + s->hdrs_len, at, n);
    s->hdrs_len += n;
    return 0;
}

static int sink_body_bytes(struct sink *s, const char *at, size_t n)
{
    if (n > s->body_cap - s->body_len) {
        size_t cap = s->body_cap ? s->body_cap : 4096;
        char *p;

        while (cap - s->body_len < n)
            cap *= 2;
        p = realloc(s->body, cap);
        if (!p)
            return -1;
        s->body = p;
        s->body_cap = cap;
    }
    memcpy(s->body + s->body_len, at, n);
    s->body_len += n;
    return 0;
}

/* Whether the answer in <s> is the one expected: 200, and the whole body. */
static bool sink_ok(const struct sink *s, size_t body_len)
{
    return s->complete && s->status == 200 && s->content_len == (long long)body_len &&
           s->body_len == body_len;
}

/* ---- http_parser framing (own and connect-only) --------------------- */

/* Ends the header line in progress, if any: notes a Content-Length. */
static int end_header_line(struct sink *s)
{
    if (!s->in_value)
        return 0;
    s->in_value = false;
    if (s->cl_field) {
        char v[24];
        size_t n = s->hdrs_len - s->value_off;

        if (n >= sizeof(v))
            return -1;
        memcpy(v, s->hdrs + s->value_off, n);
        v[n] = '\0';
        s->content_len = strtoll(v, NULL, 10);
    }
    return sink_header_bytes(s, "\n", 1);
}

static int on_header_field(http_parser *p, const char *at, size_t n)
{
    struct sink *s = p->data;

    if (s->in_value) { /* a new header line starts */
        if (end_header_line(s) < 0)
            return -1;
        s->name_off = s->hdrs_len;
    }
    return sink_header_bytes(s, at, n);
}

static int on_header_value(http_parser *p, const char *at, size_t n)
{
    struct sink *s = p->data;

    if (!s->in_value) { /* the name is whole now */
        s->in_value = true;
        s->cl_field = s->hdrs_len - s->name_off == 14 &&
                      strncasecmp(s->hdrs + s->name_off, "Content-Length", 14) == 0;
        if (sink_header_bytes(s, ": ", 2) < 0)
            return -1;
        s->value_off = s->hdrs_len;
    }
    return sink_header_bytes(s, at, n);
}

static int on_headers_complete(http_parser *p)
{
    struct sink *s = p->data;

    s->status = (int)p->status_code;
    return end_header_line(s);
}

static int on_body(http_parser *p, const char *at, size_t n)
{
    return sink_body_bytes(p->data, at, n);
}

static int on_message_complete(http_parser *p)
{
    struct sink *s = p->data;

    s->complete = true;
    s->keep_alive = http_should_keep_alive(p) != 0;
    return 0;
}

static http_parser_settings parser_settings = {
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* Readies <p> for the next answer, into <s>. */
static void parser_start(http_parser *p, struct sink *s)
{
    http_parser_init(p, HTTP_RESPONSE);
    p->data = s;
    sink_reset(s);
}

/* Feeds <n> received bytes to <p>; -1 on a framing error. Bytes past the
 * end of the answer would be a second, unasked answer: an error too. */
static int parser_feed(http_parser *p, const char *buf, size_t n)
{
    size_t used = http_parser_execute(p, &parser_settings, buf, n);

    if (HTTP_PARSER_ERRNO(p) != HPE_OK || used != n) {
        fprintf(stderr, "parse error: %s\n", http_errno_name(HTTP_PARSER_ERRNO(p)));
        return -1;
    }
    return 0;
}

/* ---- epoll ------------------------------------------------------------ */

/* Waits until the one socket registered in <ep> reports one of <want> (or an
 * error, which the next read or write will tell). Registered edge-triggered,
 * so it is called only after a read or write would block, or after a request
 * was sent in full and its answer is awaited: either way, what is waited for
 * comes after the wait starts. */
static int wait_for(int ep, uint32_t want)
{
    struct epoll_event ev[4];

    for (;;) {
        int n = epoll_wait(ep, ev, 4, WAIT_MS);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "epoll_wait: %s\n", n == 0 ? "timed out" : strerror(errno));
            return -1;
        }
        for (int i = 0; i < n; i++)
            if (ev[i].events & (want | EPOLLERR | EPOLLHUP))
                return 0;
    }
}

/* Registers <fd> in <ep> once and for all, for both directions. */
static int watch_once(int ep, int fd)
{
    struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                              .data.fd = fd };

    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
        perror("epoll_ctl");
        return -1;
    }
    return 0;
}

/* ---- common run state ------------------------------------------------- */

struct run {
    unsigned port;
    size_t body_len;
    uint64_t n;
    char host[64];        /* "Host: 127.0.0.1:PORT" */
    char url[64];         /* "http://127.0.0.1:PORT/hop" */
    struct sink sink;
    uint64_t connects;    /* connections made, for the report */
    struct timespec t0;   /* when the first request started */
};

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;

    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

static uint64_t now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Checks the answer to request <i> in the sink; reports the first bad one. */
static int check_answer(const struct run *r, uint64_t i, bool must_keep_alive)
{
    if (!sink_ok(&r->sink, r->body_len) || (must_keep_alive && !r->sink.keep_alive)) {
        fprintf(stderr,
                "request %llu: bad answer: complete=%d status=%d content-length=%lld "
                "body=%zu keep-alive=%d\n",
                (unsigned long long)i, r->sink.complete, r->sink.status, r->sink.content_len,
                r->sink.body_len, r->sink.keep_alive);
        return -1;
    }
    return 0;
}

/* ---- mode own ---------------------------------------------------------- */

static int run_own(struct run *r)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)r->port) };
    static char head[HEAD_BUF], rbuf[RECV_BUF];
    http_parser parser;
    int one = 1, err = 0, ep, fd;
    socklen_t elen = sizeof(err);

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ep = epoll_create1(EPOLL_CLOEXEC);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ep < 0 || fd < 0) {
        perror("epoll_create1/socket");
        return -1;
    }
    /* As curl does by default: no Nagle delay. One writev per head makes it
     * moot here, but it keeps the two sockets alike. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (watch_once(ep, fd) < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
        perror("connect");
        return -1;
    }
    if (wait_for(ep, EPOLLOUT) < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0 ||
        err != 0) {
        fprintf(stderr, "connect: %s\n", strerror(err));
        return -1;
    }
    r->connects = 1;

    clock_gettime(CLOCK_MONOTONIC, &r->t0);
    for (uint64_t i = 0; i < r->n; i++) {
        struct iovec iov[2];
        bool must_wait = true;

        /* One writev: the head, and the body, empty for a GET. */
        iov[0].iov_base = head;
        iov[0].iov_len = build_head(head, r->host, i);
        iov[1].iov_base = NULL;
        iov[1].iov_len = 0;
        while (iov[0].iov_len > 0) {
            ssize_t w = writev(fd, iov, 2);

            if (w >= 0) {
                iov[0].iov_base = (char *)iov[0].iov_base + w;
                iov[0].iov_len -= (size_t)w;
            } else if (errno == EAGAIN) {
                if (wait_for(ep, EPOLLOUT) < 0)
                    return -1;
            } else if (errno != EINTR) {
                perror("writev");
                return -1;
            }
        }

        /* The answer: nothing can be there before it is asked for, so wait
         * first, then read until the parser says the answer is complete. */
        parser_start(&parser, &r->sink);
        while (!r->sink.complete) {
            ssize_t n;

            if (must_wait && wait_for(ep, EPOLLIN) < 0)
                return -1;
            n = read(fd, rbuf, sizeof(rbuf));
            if (n > 0) {
                if (parser_feed(&parser, rbuf, (size_t)n) < 0)
                    return -1;
                must_wait = false; /* more may be there already */
            } else if (n == 0) {
                fprintf(stderr, "request %llu: upstream closed\n", (unsigned long long)i);
                return -1;
            } else if (errno == EAGAIN) {
                must_wait = true;
            } else if (errno != EINTR) {
                perror("read");
                return -1;
            }
        }
        if (check_answer(r, i, i + 1 < r->n) < 0)
            return -1;
    }
    close(fd);
    close(ep);
    return 0;
}

/* ---- mode connect-only ---------------------------------------------- */

static int run_connect_only(struct run *r)
{
    static char head[HEAD_BUF], rbuf[RECV_BUF];
    http_parser parser;
    curl_socket_t fd = CURL_SOCKET_BAD;
    CURL *e = curl_easy_init();
    CURLcode cc;
    int ep = epoll_create1(EPOLL_CLOEXEC);

    if (!e || ep < 0)
        return -1;
    /* Connect once, blocking in curl_easy_perform(): start-up, not counted. */
    curl_easy_setopt(e, CURLOPT_URL, r->url);
    curl_easy_setopt(e, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    cc = curl_easy_perform(e);
    if (cc == CURLE_OK)
        cc = curl_easy_getinfo(e, CURLINFO_ACTIVESOCKET, &fd);
    if (cc != CURLE_OK || fd == CURL_SOCKET_BAD) {
        fprintf(stderr, "connect: %s\n", curl_easy_strerror(cc));
        return -1;
    }
    if (watch_once(ep, fd) < 0)
        return -1;
    r->connects = 1;

    clock_gettime(CLOCK_MONOTONIC, &r->t0);
    for (uint64_t i = 0; i < r->n; i++) {
        size_t len = build_head(head, r->host, i), off = 0;
        bool must_wait = true;

        while (off < len) {
            size_t sent = 0;

            cc = curl_easy_send(e, head + off, len - off, &sent);
            if (cc == CURLE_OK) {
                off += sent;
            } else if (cc == CURLE_AGAIN) {
                if (wait_for(ep, EPOLLOUT) < 0)
                    return -1;
            } else {
                fprintf(stderr, "curl_easy_send: %s\n", curl_easy_strerror(cc));
                return -1;
            }
        }

        parser_start(&parser, &r->sink);
        while (!r->sink.complete) {
            size_t n = 0;

            if (must_wait && wait_for(ep, EPOLLIN) < 0)
                return -1;
            cc = curl_easy_recv(e, rbuf, sizeof(rbuf), &n);
            if (cc == CURLE_OK && n > 0) {
                if (parser_feed(&parser, rbuf, n) < 0)
                    return -1;
                must_wait = false;
            } else if (cc == CURLE_OK) {
                fprintf(stderr, "request %llu: upstream closed\n", (unsigned long long)i);
                return -1;
            } else if (cc == CURLE_AGAIN) {
                must_wait = true;
            } else {
                fprintf(stderr, "curl_easy_recv: %s\n", curl_easy_strerror(cc));
                return -1;
            }
        }
        if (check_answer(r, i, i + 1 < r->n) < 0)
            return -1;
    }
    curl_easy_cleanup(e);
    close(ep);
    return 0;
}

/* ---- mode multi -------------------------------------------------------- */

struct multi_loop {
    CURLM *multi;
    int ep;
    uint64_t due_ms; /* when curl wants CURL_SOCKET_TIMEOUT; UINT64_MAX: never */
};

static int registered; /* its address marks a socket as in the epoll set */

/* CURLMOPT_SOCKETFUNCTION: keeps the epoll set (level-triggered, as curl
 * expects) in step with what curl wants watched, like src/upstream_curl.c. */
static int on_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    struct multi_loop *m = userp;
    struct epoll_event ev = { .data.fd = fd };

    (void)easy;
    if (what == CURL_POLL_REMOVE) {
        if (socketp) {
            (void)epoll_ctl(m->ep, EPOLL_CTL_DEL, fd, NULL); /* may be closed already */
            (void)curl_multi_assign(m->multi, fd, NULL);
        }
        return 0;
    }
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);
    if (epoll_ctl(m->ep, socketp ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) < 0)
        return -1;
    if (!socketp)
        (void)curl_multi_assign(m->multi, fd, &registered);
    return 0;
}

/* CURLMOPT_TIMERFUNCTION: when curl next wants to be called for its timers. */
static int on_timer(CURLM *multi, long timeout_ms, void *userp)
{
    struct multi_loop *m = userp;

    (void)multi;
    m->due_ms = timeout_ms < 0 ? UINT64_MAX : now_ms() + (uint64_t)timeout_ms;
    return 0;
}

static size_t on_curl_header(char *at, size_t size, size_t n, void *userp)
{
    struct sink *s = userp;

    /* The status line and the empty line come here too; like the parser
     * modes, keep only "name: value" lines (curl's end in CRLF). */
    if (n > 2 && memchr(at, ':', n) && strncmp(at, "HTTP/", 5) != 0)
        if (sink_header_bytes(s, at, n) < 0)
            return 0;
    return size * n;
}

static size_t on_curl_body(char *at, size_t size, size_t n, void *userp)
{
    return sink_body_bytes(userp, at, n) < 0 ? 0 : size * n;
}

/* Runs the loop of src/loop.c, curl's part only, until <e> is done. */
static int multi_drive(struct multi_loop *m, CURL *e, CURLcode *result)
{
    struct epoll_event evs[8];
    uint64_t give_up = now_ms() + WAIT_MS;

    for (;;) {
        uint64_t now = now_ms(), due = m->due_ms < now + WAIT_MS ? m->due_ms : now + WAIT_MS;
        int n, still;
        CURLMsg *msg;
        int left;

        if (now > give_up) {
            fprintf(stderr, "multi: timed out\n");
            return -1;
        }
        n = epoll_wait(m->ep, evs, 8, due <= now ? 0 : (int)(due - now));
        for (int i = 0; i < n; i++) {
            int flags = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                        (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                        (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);

            (void)curl_multi_socket_action(m->multi, evs[i].data.fd, flags, &still);
        }
        if (m->due_ms <= now_ms()) {
            m->due_ms = UINT64_MAX;
            (void)curl_multi_socket_action(m->multi, CURL_SOCKET_TIMEOUT, 0, &still);
        }
        while ((msg = curl_multi_info_read(m->multi, &left))) {
            if (msg->msg == CURLMSG_DONE && msg->easy_handle == e) {
                *result = msg->data.result;
                return 0;
            }
        }
    }
}

static int run_multi(struct run *r)
{
    struct multi_loop m = { .multi = curl_multi_init(), .ep = epoll_create1(EPOLL_CLOEXEC),
                            .due_ms = UINT64_MAX };
    CURL *e = curl_easy_init();

    if (!m.multi || m.ep < 0 || !e)
        return -1;
    curl_multi_setopt(m.multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(m.multi, CURLMOPT_SOCKETDATA, &m);
    curl_multi_setopt(m.multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(m.multi, CURLMOPT_TIMERDATA, &m);

    /* The connection is made by the first request, inside the timed loop:
     * bench/hop-designs takes the difference of two runs to remove it. */
    clock_gettime(CLOCK_MONOTONIC, &r->t0);
    for (uint64_t i = 0; i < r->n; i++) {
        const char *lines[NHEADERS];
        char id[32];
        struct curl_slist *hdrs = NULL;
        CURLcode cc = CURLE_OK;
        long status = 0, connects = 0;
        curl_off_t cl = -1;

        /* The same header set, as the proxy gives it: a list per request. */
        header_lines(lines, r->host, id, i);
        for (int k = 0; k < NHEADERS; k++) {
            struct curl_slist *l = curl_slist_append(hdrs, lines[k]);

            if (!l)
                return -1;
            hdrs = l;
        }
        sink_reset(&r->sink);
        curl_easy_setopt(e, CURLOPT_URL, r->url);
        /* Besides URL, headers and callbacks, the few options of the
         * proxy's (src/upstream_curl.c) that change what curl does per
         * request: no signals, HTTP/1.1, and no proxy (without it curl looks
         * at http_proxy and friends in the environment every time). */
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_PROXY, "");
        curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_curl_header);
        curl_easy_setopt(e, CURLOPT_HEADERDATA, &r->sink);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_curl_body);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &r->sink);
        if (curl_multi_add_handle(m.multi, e) != CURLM_OK || multi_drive(&m, e, &cc) < 0)
            return -1;
        (void)curl_multi_remove_handle(m.multi, e);
        curl_slist_free_all(hdrs);
        if (cc != CURLE_OK) {
            fprintf(stderr, "request %llu: %s\n", (unsigned long long)i, curl_easy_strerror(cc));
            return -1;
        }
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
        curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &connects);
        r->sink.status = (int)status;
        r->sink.content_len = cl;
        r->sink.complete = true;
        r->sink.keep_alive = true; /* checked instead by counting connects */
        r->connects += (uint64_t)connects;
        if (check_answer(r, i, false) < 0)
            return -1;
    }
    curl_easy_cleanup(e);
    curl_multi_cleanup(m.multi);
    close(m.ep);
    return 0;
}

/* ---- main ----------------------------------------------------------------- */

int main(int argc, char **argv)
{
    struct run r = { 0 };
    double secs;
    int rc;

    if (argc != 5) {
        fprintf(stderr, "usage: %s own|connect-only|multi N PORT BODY_LEN\n", argv[0]);
        return 2;
    }
    r.n = strtoull(argv[2], NULL, 10);
    r.port = (unsigned)strtoul(argv[3], NULL, 10);
    r.body_len = strtoul(argv[4], NULL, 10);
    if (r.port == 0 || r.port > 65535) {
        fprintf(stderr, "bad port\n");
        return 2;
    }
    snprintf(r.host, sizeof(r.host), "Host: 127.0.0.1:%u", r.port);
    snprintf(r.url, sizeof(r.url), "http://127.0.0.1:%u/hop", r.port);
    sink_reset(&r.sink);
    signal(SIGPIPE, SIG_IGN); /* a closed upstream is an error, not a signal */
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return 1;

    if (strcmp(argv[1], "own") == 0) {
        rc = run_own(&r);
    } else if (strcmp(argv[1], "connect-only") == 0) {
        rc = run_connect_only(&r);
    } else if (strcmp(argv[1], "multi") == 0) {
        rc = run_multi(&r);
    } else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    if (rc < 0)
        return 1;
    if (r.n > 0 && r.connects != 1) {
        fprintf(stderr, "%llu connections made, not one\n", (unsigned long long)r.connects);
        return 1;
    }
    secs = r.n > 0 ? seconds_since(&r.t0) : 0.0;
    printf("mode=%s n=%llu ok=%llu connects=%llu seconds=%.3f rps=%.0f\n", argv[1],
           (unsigned long long)r.n, (unsigned long long)r.n, (unsigned long long)r.connects,
           secs, secs > 0 ? (double)r.n / secs : 0.0);
    free(r.sink.body);
    curl_global_cleanup();
    return 0;
}
