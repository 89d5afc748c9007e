/* SPDX-License-Identifier: MIT */
/* The Redis connection of our own (redis_conn.h) against the real
 * redis-server whose URL scripts/test exports as IDEMPROXY_TEST_REDIS_URL,
 * and against sockets that refuse, stay silent, or speak no RESP. Each case
 * runs on a loop thread of its own, as the store does. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "idemproxy/loop.h"
#include "idemproxy/redis_conn.h"
#include "idemproxy/redis_url.h"

/* What a case saw, written on the loop thread and read once it is over. */
struct seen {
    struct loop *l;
    struct redis_conn *c;
    atomic_bool over;
    int ready, down_err, downs;
    char why[300];
    atomic_int replies; /* polled by the test thread */
    int errors, in_order, messages;
    long long last_int;
    char last_msg[64];
    bool free_in_callback;
    int get_err; /* a command tried on a subscribed connection */
};

static void on_ready(void *ctx)
{
    struct seen *s = ctx;

    s->ready++;
}

static void on_down(void *ctx, int err, const char *why)
{
    struct seen *s = ctx;

    s->downs++;
    s->down_err = err;
    snprintf(s->why, sizeof(s->why), "%s", why);
    atomic_store(&s->over, true);
}

static void on_message(void *ctx, const redisReply *m)
{
    struct seen *s = ctx;

    s->messages++;
    snprintf(s->last_msg, sizeof(s->last_msg), "%.*s", (int)m->element[2]->len, m->element[2]->str);
    atomic_store(&s->over, true);
}

static void addr_of(const char *host, unsigned port, struct redis_conn_opts *o)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
    char p[16];

    snprintf(p, sizeof(p), "%u", port);
    CHECK_EQ_INT(getaddrinfo(host, p, &hints, &res), 0);
    if (!res)
        abort();
    memcpy(&o->addr, res->ai_addr, res->ai_addrlen);
    o->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
}

/* The test Redis, from IDEMPROXY_TEST_REDIS_URL. */
static const struct redis_url *test_url(void)
{
    static struct redis_url url;
    static bool parsed;
    const char *u = getenv("IDEMPROXY_TEST_REDIS_URL");

    if (!parsed && (!u || redis_url_parse(u, &url, NULL, 0) < 0)) {
        fprintf(stderr, "IDEMPROXY_TEST_REDIS_URL must be a redis:// URL (scripts/test sets it)\n");
        exit(1);
    }
    parsed = true;
    return &url;
}

static struct redis_conn_opts test_opts(void)
{
    const struct redis_url *u = test_url();
    struct redis_conn_opts o = { .name = "test", .timeout_ms = 2000 };

    addr_of(u->hosts[0].host, u->hosts[0].port, &o);
    o.user = u->user;
    o.password = u->password;
    o.db = u->db;
    return o;
}

static void wait_over(struct seen *s, unsigned ms)
{
    for (unsigned i = 0; i < ms / 5 && !atomic_load(&s->over); i++)
        usleep(5000);
}

/* ---- pipelined commands, in order ---- */

#define N_CMDS 2000

static void on_incr(void *ctx, int err, const redisReply *r)
{
    struct seen *s = ctx;

    if (err || r->type != REDIS_REPLY_INTEGER) {
        s->errors++;
    } else {
        if (r->integer == s->last_int + 1)
            s->in_order++;
        s->last_int = r->integer;
    }
    if (++s->replies == N_CMDS)
        atomic_store(&s->over, true);
}

struct start {
    struct seen *s;
    struct redis_conn_opts o;
    int n;
};

static void start_incrs(void *ctx)
{
    struct start *st = ctx;
    struct seen *s = st->s;
    static const char key[] = "idemproxy-test:conn:counter";

    CHECK_EQ_INT(redis_conn_open(s->l, &st->o,
                                 &(struct redis_conn_handlers){ on_ready, on_down, on_message, s },
                                 &s->c),
                 0);
    {
        const char *argv[] = { "DEL", key };
        size_t lens[] = { 3, sizeof(key) - 1 };

        CHECK_EQ_INT(redis_conn_command(s->c, 2, argv, lens, NULL, NULL) == 0 ? 0 : -1, 0);
    }
    for (int i = 0; i < st->n; i++) {
        const char *argv[] = { "INCR", key };
        size_t lens[] = { 4, sizeof(key) - 1 };

        CHECK_EQ_INT(redis_conn_command(s->c, 2, argv, lens, on_incr, s), 0);
    }
}

static void free_conn(void *ctx)
{
    struct seen *s = ctx;

    redis_conn_free(s->c);
    s->c = NULL;
}

static void with_loop(struct seen *s)
{
    CHECK_EQ_INT(loop_new(&s->l), 0);
    CHECK_EQ_INT(loop_start(s->l), 0);
}

static void end_loop(struct seen *s)
{
    loop_call(s->l, free_conn, s);
    loop_stop(s->l);
    loop_free(s->l);
}

static void test_redis_conn_pipelines_in_order(void)
{
    struct seen s = { 0 };
    struct start st = { .s = &s, .o = test_opts(), .n = N_CMDS };

    with_loop(&s);
    loop_call(s.l, start_incrs, &st);
    wait_over(&s, 10000);
    end_loop(&s); /* the loop's writes are seen from here on */
    CHECK(atomic_load(&s.over));
    CHECK_EQ_INT(s.replies, N_CMDS);
    CHECK_EQ_INT(s.errors, 0);
    CHECK_EQ_INT(s.in_order, N_CMDS); /* 1, 2, 3, ...: every reply to its own command */
    CHECK_EQ_INT(s.last_int, N_CMDS);
    CHECK_EQ_INT(s.ready, 1); /* said once the replies of that read were handed out */
    CHECK_EQ_INT(s.downs, 0);
}

/* ---- failures: each fails what it holds and says why ---- */

static void start_one(void *ctx)
{
    struct start *st = ctx;
    struct seen *s = st->s;
    const char *argv[] = { "PING" };
    size_t lens[] = { 4 };

    if (redis_conn_open(s->l, &st->o, &(struct redis_conn_handlers){ on_ready, on_down, NULL, s },
                        &s->c) < 0) {
        s->down_err = -1;
        atomic_store(&s->over, true);
        return;
    }
    CHECK_EQ_INT(redis_conn_command(s->c, 1, argv, lens, on_incr, s), 0);
}

/* A loopback port with a listener that accepts and never answers (or, with
 * <reply>, sends that and closes). Returns the port; the fd in <ret_fd>. */
struct silent {
    int lfd;
    pthread_t thread;
    const char *reply;
};

static void *silent_main(void *arg)
{
    struct silent *sl = arg;
    int fd = accept(sl->lfd, NULL, NULL);

    if (fd >= 0 && sl->reply) {
        (void)!write(fd, sl->reply, strlen(sl->reply));
        usleep(200000);
    } else if (fd >= 0) {
        usleep(3000000);
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

static unsigned silent_start(struct silent *sl, const char *reply)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);

    sl->reply = reply;
    sl->lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK_EQ_INT(bind(sl->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    CHECK_EQ_INT(listen(sl->lfd, 4), 0);
    CHECK_EQ_INT(getsockname(sl->lfd, (struct sockaddr *)&a, &len), 0);
    CHECK_EQ_INT(pthread_create(&sl->thread, NULL, silent_main, sl), 0);
    return ntohs(a.sin_port);
}

static void silent_stop(struct silent *sl)
{
    shutdown(sl->lfd, SHUT_RDWR);
    pthread_join(sl->thread, NULL);
    close(sl->lfd);
}

static void run_one(struct seen *s, struct redis_conn_opts o)
{
    struct start st = { .s = s, .o = o };

    with_loop(s);
    loop_call(s->l, start_one, &st);
    wait_over(s, 10000);
    CHECK(atomic_load(&s->over));
    end_loop(s);
}

static void test_redis_conn_refused_silent_and_garbled(void)
{
    struct redis_conn_opts o = { .name = "x", .timeout_ms = 300 };
    struct silent sl;
    struct seen s = { 0 };
    unsigned port;

    /* refused: a port nobody listens on (the silent listener's, once closed) */
    port = silent_start(&sl, NULL);
    silent_stop(&sl);
    addr_of("127.0.0.1", port, &o);
    run_one(&s, o);
    CHECK_EQ_INT(s.down_err, -ECONNREFUSED);
    CHECK_EQ_INT(s.errors, 1); /* the PING got the error before down() */
    CHECK(strstr(s.why, "refused") != NULL);

    /* silent: the set-up and the PING time out */
    s = (struct seen){ 0 };
    port = silent_start(&sl, NULL);
    addr_of("127.0.0.1", port, &o);
    run_one(&s, o);
    silent_stop(&sl);
    CHECK_EQ_INT(s.down_err, -ETIMEDOUT);
    CHECK_EQ_INT(s.errors, 1);
    CHECK(strstr(s.why, "timeout") != NULL);

    /* not RESP: a protocol error, never a reply */
    s = (struct seen){ 0 };
    port = silent_start(&sl, "HTTP/1.1 400 Bad Request\r\n\r\n");
    addr_of("127.0.0.1", port, &o);
    run_one(&s, o);
    silent_stop(&sl);
    CHECK_EQ_INT(s.down_err, -EPROTO);
    CHECK_EQ_INT(s.errors, 1);
    CHECK_EQ_INT(s.replies, 1);
}

static void test_redis_conn_wrong_password_is_refused(void)
{
    struct redis_conn_opts o = test_opts();
    struct seen s = { 0 };

    o.user = "nobody-here";
    o.password = "wrong";
    run_one(&s, o);
    CHECK_EQ_INT(s.ready, 0);
    CHECK_EQ_INT(s.down_err, -EACCES);
    CHECK(strstr(s.why, "refused") != NULL);
    CHECK(strstr(s.why, "wrong") == NULL); /* the password is never in a message */
    CHECK_EQ_INT(s.errors, 1);
}

/* ---- subscriptions ---- */

static void on_sub(void *ctx, int err, const redisReply *r)
{
    struct seen *s = ctx;

    (void)r;
    if (err)
        s->errors++;
    s->replies++;
}

static void start_sub(void *ctx)
{
    struct start *st = ctx;
    struct seen *s = st->s;

    CHECK_EQ_INT(redis_conn_open(s->l, &st->o,
                                 &(struct redis_conn_handlers){ on_ready, on_down, on_message, s },
                                 &s->c),
                 0);
    CHECK_EQ_INT(redis_conn_subscribe(s->c, "idemproxy-test:conn", on_sub, s), 0);
}

struct pub {
    struct seen *s; /* the publisher's */
    struct redis_conn_opts o;
};

static void start_pub(void *ctx)
{
    struct pub *p = ctx;
    const char *argv[] = { "PUBLISH", "idemproxy-test:conn", "hello" };
    size_t lens[] = { 7, 19, 5 };

    CHECK_EQ_INT(redis_conn_open(p->s->l, &p->o,
                                 &(struct redis_conn_handlers){ NULL, on_down, NULL, p->s },
                                 &p->s->c),
                 0);
    CHECK_EQ_INT(redis_conn_command(p->s->c, 3, argv, lens, on_sub, p->s), 0);
}

static void try_get(void *ctx)
{
    struct seen *s = ctx;
    const char *argv[] = { "GET", "x" };
    size_t lens[] = { 3, 1 };

    s->get_err = redis_conn_command(s->c, 2, argv, lens, on_sub, s);
}

static void test_redis_conn_subscribe_gets_messages(void)
{
    struct seen s = { 0 }, ps = { 0 };
    struct start st = { .s = &s, .o = test_opts() };
    struct pub p = { .s = &ps, .o = test_opts() };

    with_loop(&s);
    loop_call(s.l, start_sub, &st);
    for (int i = 0; i < 400 && s.replies == 0; i++)
        usleep(5000); /* the subscription is confirmed */
    CHECK_EQ_INT(s.replies, 1);
    ps.l = s.l;
    /* publish until it arrives (a message sent before the SUBSCRIBE landed is lost) */
    for (int i = 0; i < 20 && !atomic_load(&s.over); i++) {
        loop_call(s.l, start_pub, &p);
        wait_over(&s, 200);
        loop_call(s.l, free_conn, &ps);
    }
    /* a subscribed connection takes no other command (asked on its thread) */
    loop_call(s.l, try_get, &s);
    end_loop(&s);
    CHECK(atomic_load(&s.over));
    CHECK(s.messages >= 1);
    CHECK_EQ_STR(s.last_msg, "hello");
    CHECK_EQ_INT(s.errors, 0);
    CHECK_EQ_INT(s.get_err, -ECONNRESET);
}

/* ---- freed inside its own callback ---- */

static void on_reply_free(void *ctx, int err, const redisReply *r)
{
    struct seen *s = ctx;

    (void)r;
    s->replies++;
    if (err == -ECANCELED)
        s->errors++; /* the commands after this one */
    if (s->replies == 1) {
        redis_conn_free(s->c);
        s->c = NULL;
        s->free_in_callback = true;
        atomic_store(&s->over, true);
    }
}

static void start_free(void *ctx)
{
    struct start *st = ctx;
    struct seen *s = st->s;
    const char *argv[] = { "PING" };
    size_t lens[] = { 4 };

    CHECK_EQ_INT(redis_conn_open(s->l, &st->o,
                                 &(struct redis_conn_handlers){ on_ready, on_down, NULL, s },
                                 &s->c),
                 0);
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(redis_conn_command(s->c, 1, argv, lens, on_reply_free, s), 0);
}

static void test_redis_conn_freed_inside_its_callback(void)
{
    struct seen s = { 0 };
    struct start st = { .s = &s, .o = test_opts() };

    with_loop(&s);
    loop_call(s.l, start_free, &st);
    wait_over(&s, 5000);
    end_loop(&s);
    CHECK(s.free_in_callback);
    CHECK_EQ_INT(s.replies, 3); /* the first answered, the other two cancelled */
    CHECK_EQ_INT(s.errors, 2);
    CHECK_EQ_INT(s.downs, 0); /* a free is not a failure */
}

TEST_MAIN(test_redis_conn_pipelines_in_order, test_redis_conn_refused_silent_and_garbled,
          test_redis_conn_wrong_password_is_refused, test_redis_conn_subscribe_gets_messages,
          test_redis_conn_freed_inside_its_callback)
