/* SPDX-License-Identifier: MIT */
/* The HTTP/1.1 client's connections (doc/performance.md): kept alive per
 * loop and registered with it between exchanges (an idle one that becomes
 * readable was closed by the upstream, or says something unasked: it is
 * closed), at most --max-connections of them, the most recently used taken
 * first, closed after H1_IDLE_MS unused (4 s). The upstream's host name is looked
 * up on a thread of its own, never on the loop, and again once its answer
 * is older than H1_ADDRS_MS (the exchanges meanwhile use the addresses
 * found before). */
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <curl/curl.h>

#include "upstream_h1_impl.h"

/* Under the keep-alive timeouts of the servers APIs run on (Node's and
 * Apache's 5 s, nginx's 75 s): the proxy closes an idle connection before
 * the upstream can, so that a request never meets a close on its way. */
#define H1_IDLE_MS 4000
#define H1_ADDRS_MS 60000       /* as libcurl's DNS cache */
#define H1_LOOKUP_AGAIN_MS 1000 /* after a lookup that found nothing: requests fail at once */

/* A lookup of the host name, on its thread. */
struct h1_lookup {
    pthread_mutex_t lock;  /* guards <cl> */
    struct h1_client *cl;  /* NULL once the client has let it go */
    struct loop *loop;     /* borrowed: outlives the client */
    struct loop_task task; /* hands the result to the loop */
    char *host, *port;     /* owned copies */
    int gai;               /* getaddrinfo()'s result */
    struct resolve_addr addrs[H1_MAX_ADDRS];
    unsigned n;
};

static void lookup_free(struct h1_lookup *lk)
{
    pthread_mutex_destroy(&lk->lock);
    free(lk->host);
    free(lk->port);
    free(lk);
}

/* The lookup's result, on the loop thread: kept when it found addresses. */
static void on_lookup_done(void *ctx)
{
    struct h1_lookup *lk = ctx;
    struct h1_client *cl;

    pthread_mutex_lock(&lk->lock);
    cl = lk->cl;
    pthread_mutex_unlock(&lk->lock);
    if (cl) {
        cl->lookup = NULL;
        if (lk->n > 0) {
            memcpy(cl->addrs, lk->addrs, sizeof(cl->addrs));
            cl->naddrs = lk->n;
            cl->addrs_until_ms = now_ms() + H1_ADDRS_MS;
            cl->lookup_failed = NULL;
        } else {
            snprintf(cl->lookup_why, sizeof(cl->lookup_why), "could not resolve host %.100s: %s",
                     cl->host, lk->gai ? gai_strerror(lk->gai) : "no IPv4 or IPv6 address");
            cl->lookup_failed = cl->lookup_why;
            cl->lookup_again_ms = now_ms() + H1_LOOKUP_AGAIN_MS;
        }
        h1_pool_serve(cl);
    }
    lookup_free(lk);
}

static void *lookup_run(void *arg)
{
    struct h1_lookup *lk = arg;
    bool handed;

    lk->n = resolve_host(lk->host, lk->port, 0, lk->addrs, H1_MAX_ADDRS, &lk->gai);
    pthread_mutex_lock(&lk->lock);
    handed = lk->cl && loop_post(lk->loop, &lk->task) == 0;
    pthread_mutex_unlock(&lk->lock);
    if (!handed)
        lookup_free(lk); /* the client let it go, or its loop has stopped */
    return NULL;
}

/* Starts a lookup of the host name unless one runs. */
static void look_up(struct h1_client *cl)
{
    struct h1_lookup *lk;
    pthread_attr_t attr;
    pthread_t t;
    int r;

    if (cl->lookup)
        return;
    lk = calloc(1, sizeof(*lk));
    if (!lk)
        return;
    pthread_mutex_init(&lk->lock, NULL);
    lk->cl = cl;
    lk->loop = cl->loop;
    lk->task = (struct loop_task){ .fn = on_lookup_done, .ctx = lk };
    lk->host = strdup(cl->host);
    lk->port = strdup(cl->port);
    if (!lk->host || !lk->port || pthread_attr_init(&attr) != 0) {
        lookup_free(lk);
        return;
    }
    (void)pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    (void)pthread_attr_setstacksize(&attr, 256 << 10);
    r = pthread_create(&t, &attr, lookup_run, lk);
    pthread_attr_destroy(&attr);
    if (r != 0) {
        lookup_free(lk);
        return;
    }
    cl->lookup = lk;
}

static void on_conn_events(void *ctx, uint32_t events);

int h1_conn_want(struct h1_conn *c, uint32_t events)
{
    struct loop *l = c->cl->loop;
    int r = 0;

    if (events == c->events)
        return 0;
    if (events == 0)
        loop_watch_del(l, &c->watch);
    else if (c->events == 0)
        r = loop_watch_add(l, &c->watch, events);
    else
        r = loop_watch_mod(l, &c->watch, events);
    c->events = r < 0 ? 0 : events;
    return r;
}

static void conn_close(struct h1_client *cl, struct h1_conn *c)
{
    (void)h1_conn_want(c, 0);
    close(c->watch.fd);
    list_remove(&c->node);
    cl->nconns--;
    free(c);
}

/* What a failed connect says, by its errno. */
static const char *connect_cause(int err)
{
    return err == ECONNREFUSED                         ? "the upstream refused the connection"
           : err == ENETUNREACH || err == EHOSTUNREACH ? "the upstream's address is unreachable"
                                                       : "could not connect to the upstream";
}

/* Starts connecting <c> to its address. Returns 0 (connected, or on its
 * way: EPOLLOUT says), or the errno of a connect that failed at once. */
static int conn_dial(struct h1_client *cl, struct h1_conn *c)
{
    const struct sockaddr *sa = (const struct sockaddr *)&cl->addrs[c->addr].sa;
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;

    if (fd < 0)
        return errno;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->watch.fd = fd;
    if (connect(fd, sa, cl->addrs[c->addr].len) < 0 && errno != EINPROGRESS) {
        int err = errno;

        close(fd);
        c->watch.fd = -1;
        return err;
    }
    return 0;
}

/* Opens a connection for <x>, trying each address in turn from <from>.
 * Returns 0, or ends <x> (at the next turn) when none could be started. */
static void conn_open(struct h1_client *cl, struct h1_ex *x, struct h1_conn *c, unsigned from)
{
    int err = ENOMEM;

    if (!c) {
        c = calloc(1, sizeof(*c));
        if (!c) {
            h1_ex_end_later(x, -ENOMEM, NULL);
            return;
        }
        c->cl = cl;
        c->watch = (struct loop_watch){ .fn = on_conn_events, .ctx = c, .fd = -1 };
        cl->nconns++;
    }
    c->state = H1_CONNECTING;
    c->ex = x;
    x->conn = c;
    for (c->addr = from; c->addr < cl->naddrs; c->addr++) {
        err = conn_dial(cl, c);
        if (err == 0 && h1_conn_want(c, EPOLLOUT) == 0)
            return;
        if (err == 0) {
            err = ENOMEM;
            close(c->watch.fd);
        }
    }
    x->conn = NULL;
    cl->nconns--;
    free(c);
    h1_ex_end_later(x, -ECONNREFUSED, connect_cause(err));
}

/* A connecting <c> is writable: connected, or failed (then the next
 * address is tried). */
static void on_connect(struct h1_client *cl, struct h1_conn *c)
{
    int err = 0;
    socklen_t len = sizeof(err);
    struct h1_ex *x = c->ex;

    if (getsockopt(c->watch.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno;
    if (err == 0) {
        c->state = H1_BUSY;
        h1_ex_connected(x);
        return;
    }
    (void)h1_conn_want(c, 0);
    close(c->watch.fd);
    c->watch.fd = -1;
    if (c->addr + 1 < cl->naddrs) {
        conn_open(cl, x, c, c->addr + 1);
        return;
    }
    x->conn = NULL;
    cl->nconns--;
    free(c);
    h1_ex_end_later(x, -ECONNREFUSED, connect_cause(err));
}

static void on_conn_events(void *ctx, uint32_t events)
{
    struct h1_conn *c = ctx;
    struct h1_client *cl = c->cl;

    switch (c->state) {
    case H1_CONNECTING:
        on_connect(cl, c);
        break;
    case H1_BUSY:
        h1_ex_on_events(c, events);
        break;
    case H1_IDLE:
        conn_close(cl, c); /* closed by the upstream, or bytes nobody asked for */
        h1_pool_serve(cl);
        break;
    }
}

/* Whether the addresses are usable; starts a lookup when they are stale
 * (not again within H1_LOOKUP_AGAIN_MS of one that found nothing). */
static bool addrs_ready(struct h1_client *cl)
{
    if (cl->numeric)
        return true;
    uint64_t now = now_ms();

    if ((cl->naddrs == 0 || now >= cl->addrs_until_ms) &&
        (!cl->lookup_failed || now >= cl->lookup_again_ms))
        look_up(cl);
    return cl->naddrs > 0;
}

/* Gives <x> a kept connection, or a new one if there may be one more;
 * returns false when it must wait. */
static bool try_acquire(struct h1_client *cl, struct h1_ex *x)
{
    struct list_node *n = list_first(&cl->idle);

    if (n && !x->retried) {
        struct h1_conn *c = list_entry(n, struct h1_conn, node);

        list_remove(n);
        c->state = H1_BUSY;
        c->reused = true;
        c->ex = x;
        x->conn = c;
        h1_ex_connected(x);
        return true;
    }
    if (cl->nconns >= cl->max_conns) {
        /* A retry wants a new connection: an idle one makes room for it. */
        if (!x->retried || !(n = list_last(&cl->idle)))
            return false;
        conn_close(cl, list_entry(n, struct h1_conn, node));
    }
    if (!addrs_ready(cl)) {
        if (cl->lookup_failed && !cl->lookup) {
            h1_ex_end_later(x, -ECONNREFUSED, "the upstream's host name does not resolve");
            x->more = cl->lookup_failed;
            return true;
        }
        return false;
    }
    conn_open(cl, x, NULL, 0);
    return true;
}

int h1_pool_acquire(struct h1_client *cl, struct h1_ex *x)
{
    list_append(&cl->running, &x->node);
    if (list_is_empty(&cl->waiting) && try_acquire(cl, x))
        return 0;
    list_remove(&x->node);
    list_append(&cl->waiting, &x->node);
    return 0;
}

void h1_pool_serve(struct h1_client *cl)
{
    struct list_node *n;

    if (cl->pub.stopping)
        return; /* every exchange ends */
    while ((n = list_first(&cl->waiting))) {
        struct h1_ex *x = list_entry(n, struct h1_ex, node);

        list_remove(n);
        list_append(&cl->running, &x->node);
        if (!try_acquire(cl, x)) {
            list_remove(&x->node);
            list_prepend(&cl->waiting, &x->node);
            return;
        }
    }
}

void h1_pool_release(struct h1_client *cl, struct h1_conn *c, bool keep)
{
    c->ex = NULL;
    if (!keep || h1_conn_want(c, EPOLLIN) < 0) {
        conn_close(cl, c);
        return;
    }
    c->state = H1_IDLE;
    c->idle_since_ms = now_ms();
    list_prepend(&cl->idle, &c->node);
    if (cl->idle_timer.due_ms == UINT64_MAX)
        cl->idle_timer.due_ms = c->idle_since_ms + H1_IDLE_MS;
}

void h1_pool_on_idle_timer(void *ctx)
{
    struct h1_client *cl = ctx;
    uint64_t now = now_ms();
    struct list_node *n;

    cl->idle_timer.due_ms = UINT64_MAX;
    while ((n = list_last(&cl->idle))) {
        struct h1_conn *c = list_entry(n, struct h1_conn, node);

        if (c->idle_since_ms + H1_IDLE_MS > now) {
            cl->idle_timer.due_ms = c->idle_since_ms + H1_IDLE_MS;
            break;
        }
        conn_close(cl, c);
    }
    h1_pool_serve(cl);
}

void h1_pool_stop(struct h1_client *cl)
{
    struct list_node *n;

    while ((n = list_first(&cl->idle)))
        conn_close(cl, list_entry(n, struct h1_conn, node));
    if (cl->lookup) {
        pthread_mutex_lock(&cl->lookup->lock);
        cl->lookup->cl = NULL; /* its thread or its task frees it */
        pthread_mutex_unlock(&cl->lookup->lock);
        cl->lookup = NULL;
    }
}

/* Whether <host> is "localhost" or a name under it (RFC 6761: always the
 * loopback, whatever a resolver says). */
static bool is_localhost(const char *host)
{
    size_t n = strlen(host);

    return strcasecmp(host, "localhost") == 0 ||
           (n > 10 && strcasecmp(host + n - 10, ".localhost") == 0);
}

/* The origin's host and port (from the URL libcurl's URL API checked), and
 * the addresses when the host is one. */
int h1_pool_init(struct h1_client *cl)
{
    CURLU *u = curl_url();
    char *host = NULL, *port = NULL;
    size_t len;
    int r = -ENOMEM;

    if (!u)
        return -ENOMEM;
    if (curl_url_set(u, CURLUPART_URL, cl->base.origin, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK)
        goto out;
    len = strlen(host);
    if (len >= 2 && host[0] == '[')
        cl->host = strndup(host + 1, len - 2);
    else
        cl->host = strdup(host);
    cl->port = strdup(port);
    /* "http://" and the '/' after the authority are not the Host. */
    len = strlen(cl->base.origin);
    cl->authority = len > 8 ? strndup(cl->base.origin + 7, len - 8) : NULL;
    if (!cl->host || !cl->port || !cl->authority)
        goto out;
    if (is_localhost(cl->host)) /* as libcurl does (RFC 6761): never looked up */
        cl->naddrs = resolve_host("127.0.0.1", cl->port, RESOLVE_NUMERIC, cl->addrs, 1, NULL) +
                     resolve_host("::1", cl->port, RESOLVE_NUMERIC, cl->addrs + 1, 1, NULL);
    else
        cl->naddrs =
            resolve_host(cl->host, cl->port, RESOLVE_NUMERIC, cl->addrs, H1_MAX_ADDRS, NULL);
    cl->numeric = cl->naddrs > 0;
    r = 0;
out:
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return r;
}
