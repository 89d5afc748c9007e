/* SPDX-License-Identifier: MIT */
/* Master discovery through sentinels (redis_sentinel.h). Two connections at
 * most, both to sentinels: one that asks (opened per question, closed once
 * answered), one subscribed to +switch-master (kept, made again after a
 * backoff). Everything but redis_sentinel_ask() and _resolve() runs on the
 * loop thread. */
#include "idemproxy/redis_sentinel.h"

#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/common.h"
#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "idemproxy/resolve.h"

#define RETRY_FIRST_MS 100
#define RETRY_MAX_MS 2000
#define POLL_MS 1000 /* no subscription: a +switch-master could go unheard, so ask this often */

struct sentinel_addr {
    struct sockaddr_storage addr;
    socklen_t addrlen; /* 0: the name does not resolve (yet) */
};

struct redis_sentinel {
    struct loop *loop;
    struct redis_sentinel_opts o;
    struct loop_timer timer; /* the next question, or a new subscription */
    struct loop_task task;   /* redis_sentinel_ask() from another thread */
    atomic_bool task_posted;
    atomic_ullong tickets;                           /* the last ticket redis_sentinel_ask() gave */
    pthread_mutex_t mu;                              /* guards <addrs> */
    struct sentinel_addr addrs[REDIS_URL_MAX_HOSTS]; /* by index in o.url->hosts */
    unsigned order[REDIS_URL_MAX_HOSTS]; /* the sentinels, the last that answered first */
    unsigned n;
    /* the question under way */
    struct redis_conn *ask;
    unsigned tried;     /* sentinels asked in this round */
    bool again;         /* asked for again while a question was under way */
    uint64_t fresh;     /* the question under way was sent after tickets up to this */
    uint64_t ask_at_ms; /* UINT64_MAX: no question due */
    uint64_t retry_ms;
    /* the subscription */
    struct redis_conn *sub;
    unsigned sub_next;  /* tried after a failure: the next sentinel of <order> */
    uint64_t sub_at_ms; /* UINT64_MAX: none due */
    uint64_t sub_retry_ms;
    bool sub_up;           /* <sub> is subscribed: +switch-master messages reach us */
    char last_master[300]; /* host:port last reported, for the log */
};

static void resolve_one(const struct redis_addr *h, struct sentinel_addr *out)
{
    struct resolve_addr a;
    char port[8];

    snprintf(port, sizeof(port), "%u", h->port);
    out->addrlen = 0;
    if (resolve_host(h->host, port, 0, &a, 1, NULL) == 1 && a.len <= sizeof(out->addr)) {
        memcpy(&out->addr, &a.sa, a.len);
        out->addrlen = a.len;
    }
}

void redis_sentinel_resolve(struct redis_sentinel *s)
{
    struct sentinel_addr a[REDIS_URL_MAX_HOSTS];

    for (unsigned i = 0; i < s->n; i++)
        resolve_one(&s->o.url->hosts[i], &a[i]);
    pthread_mutex_lock(&s->mu);
    for (unsigned i = 0; i < s->n; i++) {
        if (a[i].addrlen) /* a failed lookup keeps the last address */
            s->addrs[i] = a[i];
    }
    pthread_mutex_unlock(&s->mu);
}

static void timer_update(struct redis_sentinel *s)
{
    s->timer.due_ms = s->ask_at_ms < s->sub_at_ms ? s->ask_at_ms : s->sub_at_ms;
}

/* Opens a connection to the sentinel <idx> (of the URL's list). */
static int open_sentinel(struct redis_sentinel *s, unsigned idx,
                         const struct redis_conn_handlers *h, struct redis_conn **ret)
{
    const struct redis_addr *host = &s->o.url->hosts[idx];
    struct redis_conn_opts o = {
        .tls = s->o.tls,
        .tls_name = host->host,
        .user = s->o.url->sentinel_password ? s->o.url->sentinel_user : NULL,
        .password = s->o.url->sentinel_password,
        .timeout_ms = s->o.timeout_ms,
    };
    char name[300];

    redis_addr_format(host, name, sizeof(name));
    o.name = name;
    pthread_mutex_lock(&s->mu);
    o.addr = s->addrs[idx].addr;
    o.addrlen = s->addrs[idx].addrlen;
    pthread_mutex_unlock(&s->mu);
    if (!o.addrlen)
        return -ENXIO;
    return redis_conn_open(s->loop, &o, h, ret);
}

/* ---- asking: SENTINEL get-master-addr-by-name, each sentinel in turn ---- */

static void ask_next(struct redis_sentinel *s);

/* Ends the question with the sentinel at order[0] having answered, or none. */
static void ask_done(struct redis_sentinel *s, bool answered)
{
    redis_conn_free(s->ask);
    s->ask = NULL;
    s->tried = 0;
    if (answered) {
        s->retry_ms = 0;
        s->ask_at_ms = s->again ? 0 : s->sub_up ? UINT64_MAX : now_ms() + POLL_MS;
    } else {
        s->retry_ms = s->retry_ms ? s->retry_ms * 2 : RETRY_FIRST_MS;
        if (s->retry_ms > (s->sub_up ? RETRY_MAX_MS : POLL_MS))
            s->retry_ms = s->sub_up ? RETRY_MAX_MS : POLL_MS;
        s->ask_at_ms = now_ms() + s->retry_ms;
        log_warn("redis sentinels: none of the %u knows the master '%s'; asking again in %llu ms",
                 s->n, s->o.url->master, (unsigned long long)s->retry_ms);
    }
    s->again = false;
    timer_update(s);
}

/* The sentinel at order[0] was asked; on to the next. */
static void ask_failed(struct redis_sentinel *s, const char *why)
{
    unsigned first = s->order[0];
    char name[300];

    redis_addr_format(&s->o.url->hosts[first], name, sizeof(name));
    log_debug("redis sentinel %s: %s", name, why);
    redis_conn_free(s->ask);
    s->ask = NULL;
    /* the one that failed goes last */
    memmove(s->order, s->order + 1, (s->n - 1) * sizeof(s->order[0]));
    s->order[s->n - 1] = first;
    if (++s->tried >= s->n)
        ask_done(s, false);
    else
        ask_next(s);
}

static bool reply_str(const redisReply *r, char *out, size_t len)
{
    if (!r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS) || r->len >= len)
        return false;
    memcpy(out, r->str, r->len);
    out[r->len] = '\0';
    return true;
}

static void on_master_addr(void *ctx, int err, const redisReply *r)
{
    struct redis_sentinel *s = ctx;
    char host[REDIS_URL_HOST_MAX], port[16], where[300];
    unsigned long p;
    char *end;

    if (err < 0) {
        ask_failed(s, "no answer");
        return;
    }
    if (r->type == REDIS_REPLY_NIL || (r->type == REDIS_REPLY_ARRAY && r->elements == 0)) {
        ask_failed(s, "does not know the master");
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        !reply_str(r->element[0], host, sizeof(host)) ||
        !reply_str(r->element[1], port, sizeof(port))) {
        ask_failed(s, r->type == REDIS_REPLY_ERROR ? "refused the question" : "a strange answer");
        return;
    }
    p = strtoul(port, &end, 10);
    if (*end || p == 0 || p > 65535) {
        ask_failed(s, "a strange port");
        return;
    }
    snprintf(where, sizeof(where), strchr(host, ':') ? "[%s]:%lu" : "%s:%lu", host, p);
    if (strcmp(where, s->last_master) != 0) {
        log_info("redis sentinels: master '%s' is %s", s->o.url->master, where);
        snprintf(s->last_master, sizeof(s->last_master), "%s", where);
    }
    ask_done(s, true);
    s->o.master(s->o.ctx, host, (unsigned)p, s->fresh);
}

static void on_ask_down(void *ctx, int err, const char *why)
{
    struct redis_sentinel *s = ctx;

    (void)err; /* its question got the error first: on_master_addr() moved on */
    (void)why;
    (void)s;
}

static void ask_next(struct redis_sentinel *s)
{
    const struct redis_conn_handlers h = { .down = on_ask_down, .ctx = s };
    const char *argv[] = { "SENTINEL", "get-master-addr-by-name", s->o.url->master };
    size_t lens[] = { 8, 23, strlen(s->o.url->master) };

    if (open_sentinel(s, s->order[0], &h, &s->ask) < 0) {
        s->ask = NULL;
        ask_failed(s, "cannot connect (its name does not resolve?)");
        return;
    }
    if (redis_conn_command(s->ask, 3, argv, lens, on_master_addr, s) < 0)
        ask_failed(s, "cannot send");
}

static void ask_start(struct redis_sentinel *s)
{
    if (s->ask) {
        s->again = true; /* asked again once this one is answered */
        return;
    }
    s->tried = 0;
    s->ask_at_ms = UINT64_MAX;
    /* Sent after every ticket given so far; one given later needs another. */
    s->fresh = atomic_load(&s->tickets);
    ask_next(s);
}

/* ---- the subscription: +switch-master ---- */

/* No subscription any more: until one is back, the master is asked for
 * every POLL_MS. */
static void sub_lost(struct redis_sentinel *s)
{
    uint64_t poll_at = now_ms() + POLL_MS;

    s->sub_up = false;
    if (!s->ask && s->ask_at_ms > poll_at)
        s->ask_at_ms = poll_at; /* one under way schedules the next when it ends */
}

static void sub_retry(struct redis_sentinel *s)
{
    s->sub_retry_ms = s->sub_retry_ms ? s->sub_retry_ms * 2 : RETRY_FIRST_MS;
    if (s->sub_retry_ms > RETRY_MAX_MS)
        s->sub_retry_ms = RETRY_MAX_MS;
    s->sub_at_ms = now_ms() + s->sub_retry_ms;
    timer_update(s);
}

static void on_sub_down(void *ctx, int err, const char *why)
{
    struct redis_sentinel *s = ctx;

    (void)err, (void)why;
    redis_conn_free(s->sub);
    s->sub = NULL;
    s->sub_next++; /* that sentinel may be gone: the next one */
    sub_lost(s);
    sub_retry(s);
}

/* "+switch-master <name> <old-ip> <old-port> <new-ip> <new-port>" */
static void on_switch(void *ctx, const redisReply *m)
{
    struct redis_sentinel *s = ctx;
    const redisReply *payload = m->element[2];
    char text[600], name[256], oldh[REDIS_URL_HOST_MAX], newh[REDIS_URL_HOST_MAX];
    unsigned oldp, newp;

    if (payload->type != REDIS_REPLY_STRING || payload->len >= sizeof(text))
        return;
    memcpy(text, payload->str, payload->len);
    text[payload->len] = '\0';
    if (sscanf(text, "%255s %255s %u %255s %u", name, oldh, &oldp, newh, &newp) != 5 ||
        strcmp(name, s->o.url->master) != 0 || newp == 0 || newp > 65535)
        return;
    log_info("redis sentinels: +switch-master '%s' from %s:%u to %s:%u", name, oldh, oldp, newh,
             newp);
    snprintf(s->last_master, sizeof(s->last_master), strchr(newh, ':') ? "[%s]:%u" : "%s:%u", newh,
             newp);
    s->o.master(s->o.ctx, newh, newp, 0);
}

static void on_subscribed(void *ctx, int err, const redisReply *r)
{
    struct redis_sentinel *s = ctx;

    if (err < 0 || r->type != REDIS_REPLY_ARRAY)
        return; /* a failed connection: its down() sees to it */
    s->sub_retry_ms = 0;
    s->sub_up = true;
    /* A +switch-master published while there was no subscription is lost:
     * the master is asked once more now. */
    ask_start(s);
    timer_update(s);
}

static void sub_start(struct redis_sentinel *s)
{
    const struct redis_conn_handlers h = { .down = on_sub_down, .message = on_switch, .ctx = s };

    s->sub_at_ms = UINT64_MAX;
    if (s->sub)
        return;
    if (open_sentinel(s, s->order[s->sub_next % s->n], &h, &s->sub) < 0) {
        s->sub = NULL;
        s->sub_next++;
        sub_lost(s);
        sub_retry(s);
        return;
    }
    if (redis_conn_subscribe(s->sub, "+switch-master", on_subscribed, s) < 0) {
        redis_conn_free(s->sub);
        s->sub = NULL;
        sub_lost(s);
        sub_retry(s);
    }
}

/* ---- driving it ---- */

static void on_timer(void *ctx)
{
    struct redis_sentinel *s = ctx;
    uint64_t now = now_ms();

    if (s->ask_at_ms <= now)
        ask_start(s);
    if (s->sub_at_ms <= now)
        sub_start(s);
    timer_update(s);
}

static void on_task(void *ctx)
{
    struct redis_sentinel *s = ctx;

    atomic_store(&s->task_posted, false);
    ask_start(s);
    timer_update(s);
}

uint64_t redis_sentinel_ask(struct redis_sentinel *s)
{
    uint64_t ticket = atomic_fetch_add(&s->tickets, 1) + 1;

    if (loop_on_thread(s->loop)) {
        ask_start(s);
        timer_update(s);
        return ticket;
    }
    if (!atomic_exchange(&s->task_posted, true) && loop_post(s->loop, &s->task) < 0)
        atomic_store(&s->task_posted, false); /* stopped */
    return ticket;
}

static void start(void *ctx)
{
    struct redis_sentinel *s = ctx;

    (void)loop_timer_add(s->loop, &s->timer);
}

int redis_sentinel_new(struct loop *loop, const struct redis_sentinel_opts *o,
                       struct redis_sentinel **ret)
{
    struct redis_sentinel *s;

    if (!o->url || o->url->kind != REDIS_URL_SENTINEL || !o->url->master || !o->master)
        return -EINVAL;
    s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->loop = loop;
    s->o = *o;
    s->n = o->url->nhosts;
    for (unsigned i = 0; i < s->n; i++)
        s->order[i] = i;
    pthread_mutex_init(&s->mu, NULL);
    atomic_init(&s->task_posted, false);
    atomic_init(&s->tickets, 0);
    s->task = (struct loop_task){ .fn = on_task, .ctx = s };
    s->ask_at_ms = 0; /* the first question at once, and the subscription */
    s->sub_at_ms = 0;
    s->timer = (struct loop_timer){ .fn = on_timer, .ctx = s, .due_ms = 0 };
    redis_sentinel_resolve(s);
    loop_call(loop, start, s);
    *ret = s;
    return 0;
}

static void finish(void *ctx)
{
    struct redis_sentinel *s = ctx;

    redis_conn_free(s->ask);
    s->ask = NULL;
    redis_conn_free(s->sub);
    s->sub = NULL;
    loop_timer_del(s->loop, &s->timer);
}

void redis_sentinel_free(struct redis_sentinel *s)
{
    if (!s)
        return;
    loop_call(s->loop, finish, s);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
