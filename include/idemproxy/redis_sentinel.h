/* SPDX-License-Identifier: MIT */
/* Finding a Redis master through its sentinels, as the Redis "sentinel
 * clients" guide says: ask the sentinels in turn (SENTINEL
 * get-master-addr-by-name), move the one that answered to the front, and
 * listen to +switch-master on a connection of its own. While that
 * subscription is not established the sentinels are asked again every
 * second (a +switch-master may go unheard), and once when it comes back.
 * Each call to redis_sentinel_ask() gets a ticket, and each answer says up
 * to which ticket it is fresh (its question was sent after those calls),
 * so that the store can wait for an answer given after a failure before it
 * connects, and confirm a new connection against an answer given after its
 * set-up. Lives on one loop. */
#ifndef IDEMPROXY_REDIS_SENTINEL_H
#define IDEMPROXY_REDIS_SENTINEL_H

#include "idemproxy/redis_conn.h"
#include "idemproxy/redis_url.h"

struct loop;
struct redis_sentinel;

/* The master is <host>:<port> (as the sentinels report it: usually an IP
 * address). <fresh> is the last ticket of redis_sentinel_ask() that this
 * answer is fresh for: its question was sent after that call (0 for a
 * +switch-master message, which answers no question). On the sentinel's
 * loop thread. */
typedef void redis_master_fn(void *ctx, const char *host, unsigned port, uint64_t fresh);

struct redis_sentinel_opts {
    const struct redis_url *url; /* redis-sentinel://: the sentinels, the master's name,
                                    the sentinels' credentials; borrowed */
    struct redis_tls *tls;       /* rediss-sentinel://: TLS to the sentinels too; borrowed */
    uint64_t timeout_ms;         /* each question to a sentinel */
    redis_master_fn *master;
    void *ctx;
};

/* Creates it on <loop> (not started, or its thread): the first question is
 * asked in the loop's next turn. Resolves the sentinels' names here
 * (blocking: not on a loop thread). Returns 0 or a negative errno. */
int redis_sentinel_new(struct loop *loop, const struct redis_sentinel_opts *o,
                       struct redis_sentinel **ret);

/* Asks the sentinels again (a reconnect, a READONLY reply, a server that is
 * not the master, a new connection to confirm). Any thread. A question
 * already under way was sent before this call: another follows it. Returns
 * the call's ticket (1, 2, ...): the first answer whose <fresh> is at least
 * that was asked after this call. */
uint64_t redis_sentinel_ask(struct redis_sentinel *s);

/* Looks the sentinels' names up again (blocking: a pool thread). */
void redis_sentinel_resolve(struct redis_sentinel *s);

/* Frees <s>, on its loop's thread or once that loop has stopped. NULL-safe. */
void redis_sentinel_free(struct redis_sentinel *s);

#endif
