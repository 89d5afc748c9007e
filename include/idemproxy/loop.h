/* SPDX-License-Identifier: MIT */
/* One event loop on one thread: file descriptors watched with epoll, a few
 * timers looked at every turn, and tasks posted from any thread. The front
 * end (libmicrohttpd driven from outside) and the upstream (curl's
 * multi_socket API) share it, and so does the Redis store's connection, so a
 * request is read, forwarded and answered without changing threads. */
#ifndef IDEMPROXY_LOOP_H
#define IDEMPROXY_LOOP_H

#include <stdint.h>

#include "idemproxy/common.h"
#include "idemproxy/list.h"

struct loop;

typedef void loop_fn(void *ctx);
typedef void loop_fd_fn(void *ctx, uint32_t events);

/* A watched descriptor; owned by whoever added it, who keeps it alive until
 * it is deleted. <fn> runs on the loop thread with the epoll events. */
struct loop_watch {
    loop_fd_fn *fn;
    void *ctx;
    int fd;
};

/* A timer: <fn> runs on the loop thread once <due_ms> (now_ms() clock) has
 * come; UINT64_MAX is unarmed. Its owner sets <due_ms> on the loop thread
 * (or before the loop starts), and re-arms it from <fn> if it wants more. */
struct loop_timer {
    loop_fn *fn;
    void *ctx;
    uint64_t due_ms;
    struct list_node node; /* the loop's, while added */
};

/* A task posted from any thread; owned by the poster until <fn> runs. */
struct loop_task {
    loop_fn *fn;
    void *ctx;
    struct list_node node; /* the loop's, while posted */
};

/* Creates a loop (not running yet). Returns 0 or a negative errno. */
int loop_new(struct loop **ret);

/* Adds, changes or removes the epoll registration of <w> (EPOLLIN, EPOLLOUT),
 * one watch per descriptor. On the loop thread, or while the loop does not
 * run. Once deleted, <w> gets no event, not even one of the batch being
 * handled: it may be freed at once. */
int loop_watch_add(struct loop *l, struct loop_watch *w, uint32_t events);
int loop_watch_mod(struct loop *l, struct loop_watch *w, uint32_t events);
void loop_watch_del(struct loop *l, struct loop_watch *w);

/* Registers <t>: before loop_start(), on the loop thread (timer callbacks
 * included), or once the loop has stopped. Returns 0. */
int loop_timer_add(struct loop *l, struct loop_timer *t);

/* Unregisters <t>, so that its memory may go; the same threads as
 * loop_timer_add(), timer callbacks included (even <t>'s own). */
void loop_timer_del(struct loop *l, struct loop_timer *t);

/* Runs <t>->fn on the loop thread, in posting order. Any thread. Returns 0, or
 * -ECANCELED once the loop has stopped: then it never runs. */
int loop_post(struct loop *l, struct loop_task *t);

/* Runs <fn>(<ctx>) on the loop thread and waits for it; runs it right here
 * when called on the loop thread or when the loop is not running. */
void loop_call(struct loop *l, loop_fn *fn, void *ctx);

/* True on the loop's thread. */
bool loop_on_thread(const struct loop *l);

/* The loop whose thread this is, or NULL. */
struct loop *loop_current(void);

/* Starts the loop's thread. Returns 0 or a negative errno. */
int loop_start(struct loop *l);

/* Stops the loop's thread after the tasks already posted have run, and
 * joins it. NULL-safe; idempotent. Watches and timers stay registered. */
void loop_stop(struct loop *l);

/* Frees a stopped (or never started) loop. NULL-safe. */
void loop_free(struct loop *l);

#endif
