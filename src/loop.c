/* SPDX-License-Identifier: MIT */
/* The event loop (loop.h): epoll, its timers and the tasks posted to it. */
#include "idemproxy/loop.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define LOOP_EVENTS 256
#define LOOP_IDLE_MS 1000   /* the longest wait: nothing here needs less when idle */
#define LOOP_TIMER_PASSES 4 /* passes over the timers in one turn, at most */

struct loop {
    int epfd;
    int wakefd; /* eventfd: a task was posted, or the stop */
    struct loop_watch wake;
    /* The watch of each descriptor, by fd. An event is dispatched through
     * this, not through a pointer kept in the kernel: a watch deleted (and
     * freed) while the same epoll_wait() batch is handled gets no stale
     * event; a new one on a reused fd may get a spurious one, which is
     * harmless for non-blocking sockets. */
    struct loop_watch **byfd;
    int nbyfd;
    struct list timers;           /* struct loop_timer */
    struct list_node *timer_next; /* the next timer of the pass that fires them */
    pthread_t thread;
    bool started;
    atomic_bool running; /* the thread is in its loop: loop_call() must post */

    pthread_mutex_t mu; /* guards the task list and <stopping> */
    struct list tasks;  /* struct loop_task posted, in order */
    bool stopping;
};

static _Thread_local struct loop *current;

int loop_new(struct loop **ret)
{
    struct loop *l = calloc(1, sizeof(*l));

    if (!l)
        return -ENOMEM;
    pthread_mutex_init(&l->mu, NULL);
    list_init(&l->tasks);
    list_init(&l->timers);
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    l->wake = (struct loop_watch){ .fn = NULL, .ctx = NULL, .fd = l->wakefd };
    if (l->epfd < 0 || l->wakefd < 0 || loop_watch_add(l, &l->wake, EPOLLIN) < 0) {
        loop_free(l);
        return -EMFILE;
    }
    *ret = l;
    return 0;
}

int loop_watch_add(struct loop *l, struct loop_watch *w, uint32_t events)
{
    struct epoll_event ev = { .events = events, .data.fd = w->fd };

    if (w->fd < 0)
        return -EBADF;
    if (w->fd >= l->nbyfd) {
        int n = w->fd < 64 ? 128 : 2 * w->fd;
        struct loop_watch **byfd = realloc(l->byfd, (size_t)n * sizeof(*byfd));

        if (!byfd)
            return -ENOMEM;
        memset(byfd + l->nbyfd, 0, (size_t)(n - l->nbyfd) * sizeof(*byfd));
        l->byfd = byfd;
        l->nbyfd = n;
    }
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, w->fd, &ev) < 0)
        return -errno;
    l->byfd[w->fd] = w;
    return 0;
}

int loop_watch_mod(struct loop *l, struct loop_watch *w, uint32_t events)
{
    struct epoll_event ev = { .events = events, .data.fd = w->fd };

    return epoll_ctl(l->epfd, EPOLL_CTL_MOD, w->fd, &ev) < 0 ? -errno : 0;
}

void loop_watch_del(struct loop *l, struct loop_watch *w)
{
    (void)epoll_ctl(l->epfd, EPOLL_CTL_DEL, w->fd, NULL); /* the fd may be closed already */
    if (w->fd >= 0 && w->fd < l->nbyfd && l->byfd[w->fd] == w)
        l->byfd[w->fd] = NULL;
}

int loop_timer_add(struct loop *l, struct loop_timer *t)
{
    list_append(&l->timers, &t->node);
    return 0;
}

void loop_timer_del(struct loop *l, struct loop_timer *t)
{
    if (l->timer_next == &t->node)
        l->timer_next = list_next(&l->timers, &t->node);
    list_remove(&t->node);
}

static void wake(struct loop *l)
{
    uint64_t one = 1;

    (void)!write(l->wakefd, &one, sizeof(one));
}

int loop_post(struct loop *l, struct loop_task *t)
{
    bool was_empty;

    pthread_mutex_lock(&l->mu);
    if (l->stopping) {
        pthread_mutex_unlock(&l->mu);
        return -ECANCELED;
    }
    was_empty = list_is_empty(&l->tasks);
    list_append(&l->tasks, &t->node);
    /* Under the lock, so that loop_free() cannot close the eventfd meanwhile.
     * A list that was not empty has a wake-up on its way already. */
    if (was_empty)
        wake(l);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

/* Runs the tasks posted so far. Returns true once the loop is to stop. */
static bool run_tasks(struct loop *l)
{
    struct list batch;
    struct list_node *n;
    bool stopping;
    uint64_t v;

    (void)!read(l->wakefd, &v, sizeof(v));
    list_init(&batch);
    pthread_mutex_lock(&l->mu);
    list_splice(&batch, &l->tasks);
    stopping = l->stopping;
    pthread_mutex_unlock(&l->mu);
    while ((n = list_first(&batch))) {
        struct loop_task *t = list_entry(n, struct loop_task, node);

        list_remove(n); /* before it runs: it may be posted again, or be gone */
        t->fn(t->ctx);
    }
    return stopping;
}

struct call {
    loop_fn *fn;
    void *ctx;
    struct loop_task task;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
};

static void call_run(void *ctx)
{
    struct call *c = ctx;

    c->fn(c->ctx);
    pthread_mutex_lock(&c->mu);
    c->done = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void loop_call(struct loop *l, loop_fn *fn, void *ctx)
{
    struct call c = { .fn = fn, .ctx = ctx, .done = false };

    if (loop_on_thread(l) || !atomic_load(&l->running)) {
        fn(ctx);
        return;
    }
    c.task = (struct loop_task){ .fn = call_run, .ctx = &c };
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    if (loop_post(l, &c.task) < 0) {
        fn(ctx); /* stopped meanwhile: the thread is gone or going */
    } else {
        pthread_mutex_lock(&c.mu);
        while (!c.done)
            pthread_cond_wait(&c.cv, &c.mu);
        pthread_mutex_unlock(&c.mu);
    }
    pthread_cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
}

bool loop_on_thread(const struct loop *l) { return current == l; }

struct loop *loop_current(void) { return current; }

/* Runs the timers that are due. Returns whether one is due still (made
 * due by a callback of this pass, after its place in the list). */
static bool run_timers(struct loop *l)
{
    uint64_t now = now_ms();
    bool again = false;

    /* A callback may delete any timer, itself included, or add one. */
    for (struct list_node *tn = list_first(&l->timers); tn; tn = l->timer_next) {
        struct loop_timer *t = list_entry(tn, struct loop_timer, node);

        l->timer_next = list_next(&l->timers, tn);
        if (t->due_ms <= now) {
            t->due_ms = UINT64_MAX;
            t->fn(t->ctx);
        }
    }
    l->timer_next = NULL;
    for (struct list_node *tn = list_first(&l->timers); tn && !again;
         tn = list_next(&l->timers, tn))
        again = list_entry(tn, struct loop_timer, node)->due_ms <= now;
    return again;
}

static void *loop_main(void *arg)
{
    struct loop *l = arg;
    struct epoll_event evs[LOOP_EVENTS];

    current = l;
    for (;;) {
        uint64_t now = now_ms(), due = now + LOOP_IDLE_MS;
        int n;

        for (struct list_node *tn = list_first(&l->timers); tn; tn = list_next(&l->timers, tn)) {
            struct loop_timer *t = list_entry(tn, struct loop_timer, node);

            if (t->due_ms < due)
                due = t->due_ms;
        }
        n = epoll_wait(l->epfd, evs, LOOP_EVENTS, due <= now ? 0 : (int)(due - now));
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            struct loop_watch *w = fd < l->nbyfd ? l->byfd[fd] : NULL;

            if (!w)
                continue; /* deleted while this batch was handled */
            if (w == &l->wake) {
                if (run_tasks(l))
                    goto out;
                continue;
            }
            w->fn(w->ctx, evs[i].events);
        }
        /* Timers that a timer made due at once run in this turn too (a few
         * passes at most, so that descriptors are never starved): each
         * epoll_wait() with nothing to wait for is a system call saved. */
        for (int pass = 0; pass < LOOP_TIMER_PASSES && run_timers(l); pass++)
            ;
    }
out:
    atomic_store(&l->running, false);
    current = NULL;
    return NULL;
}

int loop_start(struct loop *l)
{
    int err;

    atomic_store(&l->running, true);
    err = -pthread_create(&l->thread, NULL, loop_main, l);
    if (err < 0) {
        atomic_store(&l->running, false);
        return err;
    }
    l->started = true;
    return 0;
}

void loop_stop(struct loop *l)
{
    if (!l || !l->started)
        return;
    pthread_mutex_lock(&l->mu);
    l->stopping = true;
    wake(l);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->started = false;
}

void loop_free(struct loop *l)
{
    if (!l)
        return;
    loop_stop(l);
    if (l->epfd >= 0)
        close(l->epfd);
    if (l->wakefd >= 0)
        close(l->wakefd);
    pthread_mutex_destroy(&l->mu);
    free(l->byfd);
    free(l);
}
