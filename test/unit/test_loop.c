/* SPDX-License-Identifier: MIT */
/* The event loop: posted tasks run on its thread in order, loop_call() waits
 * for its function, timers and watches fire there, and a stopped loop runs
 * what was posted before the stop and refuses the rest. */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "check.h"
#include "idemproxy/loop.h"

#define WAIT_MS 5000

struct seen {
    struct loop *l;
    atomic_int order[8]; /* order[i]: the turn the i-th task ran in, 0: not yet */
    atomic_int next;
    atomic_int off_thread; /* callbacks that ran off the loop thread */
    atomic_int hits;
    uint64_t at_ms;
};

static void note(struct seen *s, int i)
{
    if (!loop_on_thread(s->l) || loop_current() != s->l)
        atomic_fetch_add(&s->off_thread, 1);
    atomic_store(&s->order[i], atomic_fetch_add(&s->next, 1) + 1);
}

struct posted {
    struct loop_task task;
    struct seen *s;
    int i;
};

static void on_posted(void *ctx)
{
    struct posted *p = ctx;

    note(p->s, p->i);
}

static bool wait_for(atomic_int *v, int want)
{
    uint64_t due = now_ms() + WAIT_MS;

    while (atomic_load(v) < want && now_ms() < due)
        usleep(1000);
    return atomic_load(v) >= want;
}

static void test_loop_runs_posted_tasks_in_order_on_its_thread(void)
{
    struct seen s = { 0 };
    struct posted p[5];

    CHECK_EQ_INT(loop_new(&s.l), 0);
    CHECK(!loop_on_thread(s.l));
    CHECK(loop_current() == NULL);
    CHECK_EQ_INT(loop_start(s.l), 0);
    for (int i = 0; i < 5; i++) {
        p[i] = (struct posted){ .task = { .fn = on_posted, .ctx = &p[i] }, .s = &s, .i = i };
        CHECK_EQ_INT(loop_post(s.l, &p[i].task), 0);
    }
    CHECK(wait_for(&s.next, 5));
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(atomic_load(&s.order[i]), i + 1);
    CHECK_EQ_INT(atomic_load(&s.off_thread), 0);
    loop_free(s.l);
}

static void on_call(void *ctx)
{
    struct seen *s = ctx;

    usleep(20000); /* the caller must wait for this */
    note(s, 0);
}

static void test_loop_call_waits_and_runs_on_the_loop(void)
{
    struct seen s = { 0 };

    CHECK_EQ_INT(loop_new(&s.l), 0);
    CHECK_EQ_INT(loop_start(s.l), 0);
    loop_call(s.l, on_call, &s);
    CHECK_EQ_INT(atomic_load(&s.order[0]), 1); /* done when loop_call() returned */
    CHECK_EQ_INT(atomic_load(&s.off_thread), 0);
    loop_stop(s.l);
    /* Stopped: it runs right here instead. */
    atomic_store(&s.next, 0);
    loop_call(s.l, on_call, &s);
    CHECK_EQ_INT(atomic_load(&s.off_thread), 1);
    loop_free(s.l);
}

struct timed {
    struct loop_timer timer;
    struct seen *s;
    uint64_t armed_ms;
};

static void on_timer(void *ctx)
{
    struct timed *t = ctx;

    t->s->at_ms = now_ms() - t->armed_ms;
    note(t->s, 0);
}

static void test_loop_timer_fires_when_due(void)
{
    struct seen s = { 0 };
    struct timed t = { .s = &s };

    t.timer = (struct loop_timer){ .fn = on_timer, .ctx = &t, .due_ms = UINT64_MAX };
    CHECK_EQ_INT(loop_new(&s.l), 0);
    CHECK_EQ_INT(loop_timer_add(s.l, &t.timer), 0);
    t.armed_ms = now_ms();
    t.timer.due_ms = t.armed_ms + 50;
    CHECK_EQ_INT(loop_start(s.l), 0);
    CHECK(wait_for(&s.next, 1));
    CHECK(s.at_ms >= 50);
    CHECK(s.at_ms < 1000);
    CHECK_EQ_INT(t.timer.due_ms, UINT64_MAX); /* fired once, unarmed */
    CHECK_EQ_INT(atomic_load(&s.off_thread), 0);
    loop_free(s.l);
}

/* Timers added and deleted from inside timer callbacks (a Redis connection
 * made and dropped while the loop runs): a callback deletes itself and the
 * timer after it, which then never fires, and adds a new one, which does. */
struct churn {
    struct loop *l;
    struct loop_timer a, b, c;
    atomic_int a_runs, b_runs, c_runs;
    atomic_int add_err; /* what loop_timer_add() returned inside churn_a() */
    atomic_bool done;
};

static void churn_c(void *ctx)
{
    struct churn *ch = ctx;

    atomic_fetch_add(&ch->c_runs, 1);
    loop_timer_del(ch->l, &ch->c);
    atomic_store(&ch->done, true);
}

static void churn_a(void *ctx)
{
    struct churn *ch = ctx;

    atomic_fetch_add(&ch->a_runs, 1);
    loop_timer_del(ch->l, &ch->a);
    loop_timer_del(ch->l, &ch->b); /* due in the same pass: it must not run */
    ch->c = (struct loop_timer){ .fn = churn_c, .ctx = ch, .due_ms = now_ms() + 20 };
    atomic_store(&ch->add_err, loop_timer_add(ch->l, &ch->c)); /* CHECK is for the test thread */
}

static void churn_b(void *ctx)
{
    struct churn *ch = ctx;

    atomic_fetch_add(&ch->b_runs, 1);
}

static void test_loop_timers_added_and_deleted_while_running(void)
{
    struct churn ch = { 0 };
    uint64_t due;

    CHECK_EQ_INT(loop_new(&ch.l), 0);
    due = now_ms() + 30;
    ch.a = (struct loop_timer){ .fn = churn_a, .ctx = &ch, .due_ms = due };
    ch.b = (struct loop_timer){ .fn = churn_b, .ctx = &ch, .due_ms = due };
    CHECK_EQ_INT(loop_timer_add(ch.l, &ch.a), 0);
    CHECK_EQ_INT(loop_timer_add(ch.l, &ch.b), 0);
    CHECK_EQ_INT(loop_start(ch.l), 0);
    for (int i = 0; i < 500 && !atomic_load(&ch.done); i++)
        usleep(2000);
    loop_stop(ch.l);
    CHECK(atomic_load(&ch.done));
    CHECK_EQ_INT(atomic_load(&ch.a_runs), 1);
    CHECK_EQ_INT(atomic_load(&ch.b_runs), 0);
    CHECK_EQ_INT(atomic_load(&ch.c_runs), 1);
    CHECK_EQ_INT(atomic_load(&ch.add_err), 0);
    loop_free(ch.l);
}

struct watched {
    struct loop_watch watch;
    struct seen *s;
};

static void on_readable(void *ctx, uint32_t events)
{
    struct watched *w = ctx;
    char c;

    if (events & EPOLLIN)
        atomic_fetch_add(&w->s->hits, (int)read(w->watch.fd, &c, 1));
    note(w->s, 0);
}

static void test_loop_watch_reports_a_readable_fd(void)
{
    struct seen s = { 0 };
    struct watched w = { .s = &s };
    int fds[2];

    CHECK_EQ_INT(pipe(fds), 0);
    w.watch = (struct loop_watch){ .fn = on_readable, .ctx = &w, .fd = fds[0] };
    CHECK_EQ_INT(loop_new(&s.l), 0);
    CHECK_EQ_INT(loop_watch_add(s.l, &w.watch, EPOLLIN), 0);
    CHECK_EQ_INT(loop_start(s.l), 0);
    CHECK_EQ_INT(write(fds[1], "x", 1), 1);
    CHECK(wait_for(&s.hits, 1));
    CHECK_EQ_INT(atomic_load(&s.off_thread), 0);
    loop_stop(s.l);
    loop_watch_del(s.l, &w.watch);
    loop_free(s.l);
    close(fds[0]);
    close(fds[1]);
}

/* Two watches ready in one batch, each deleting the other: exactly one runs. */
struct rival {
    struct loop_watch watch;
    struct loop *l;
    struct rival *other;
    atomic_int *ran;
};

static void on_rival(void *ctx, uint32_t events)
{
    struct rival *r = ctx;

    (void)events;
    loop_watch_del(r->l, &r->watch);
    loop_watch_del(r->l, &r->other->watch);
    atomic_fetch_add(r->ran, 1);
}

static void test_loop_watch_deleted_in_the_same_batch_gets_no_event(void)
{
    struct loop *l;
    atomic_int ran = 0;
    struct rival a, b;
    int pa[2], pb[2];

    CHECK_EQ_INT(pipe(pa), 0);
    CHECK_EQ_INT(pipe(pb), 0);
    CHECK_EQ_INT(write(pa[1], "x", 1), 1); /* both readable before the loop starts */
    CHECK_EQ_INT(write(pb[1], "x", 1), 1);
    CHECK_EQ_INT(loop_new(&l), 0);
    a = (struct rival){
        .watch = { .fn = on_rival, .ctx = &a, .fd = pa[0] }, .l = l, .other = &b, .ran = &ran
    };
    b = (struct rival){
        .watch = { .fn = on_rival, .ctx = &b, .fd = pb[0] }, .l = l, .other = &a, .ran = &ran
    };
    CHECK_EQ_INT(loop_watch_add(l, &a.watch, EPOLLIN), 0);
    CHECK_EQ_INT(loop_watch_add(l, &b.watch, EPOLLIN), 0);
    CHECK_EQ_INT(loop_start(l), 0);
    CHECK(wait_for(&ran, 1));
    usleep(50000); /* time for a wrong second call */
    CHECK_EQ_INT(atomic_load(&ran), 1);
    loop_free(l);
    close(pa[0]);
    close(pa[1]);
    close(pb[0]);
    close(pb[1]);
}

static void test_loop_stop_runs_what_was_posted_and_refuses_the_rest(void)
{
    struct seen s = { 0 };
    struct posted p[2];

    CHECK_EQ_INT(loop_new(&s.l), 0);
    for (int i = 0; i < 2; i++)
        p[i] = (struct posted){ .task = { .fn = on_posted, .ctx = &p[i] }, .s = &s, .i = i };
    CHECK_EQ_INT(loop_post(s.l, &p[0].task), 0); /* before the start: runs once started */
    CHECK_EQ_INT(loop_start(s.l), 0);
    loop_stop(s.l);
    CHECK_EQ_INT(atomic_load(&s.order[0]), 1);
    CHECK_EQ_INT(loop_post(s.l, &p[1].task), -ECANCELED);
    CHECK_EQ_INT(atomic_load(&s.order[1]), 0);
    loop_stop(s.l); /* idempotent */
    loop_free(s.l);
    loop_free(NULL);
}

TEST_MAIN(test_loop_runs_posted_tasks_in_order_on_its_thread,
          test_loop_call_waits_and_runs_on_the_loop, test_loop_timer_fires_when_due,
          test_loop_timers_added_and_deleted_while_running,
          test_loop_watch_reports_a_readable_fd,
          test_loop_watch_deleted_in_the_same_batch_gets_no_event,
          test_loop_stop_runs_what_was_posted_and_refuses_the_rest)
