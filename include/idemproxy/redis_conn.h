/* SPDX-License-Identifier: MIT */
/* One connection to one Redis server (or sentinel), of the proxy's own, on
 * one event loop: a non-blocking socket, TLS through OpenSSL for rediss://,
 * RESP through hiredis' encoder (redisFormatCommandArgv) and reader
 * (redisReader), and the connection's set-up (AUTH, SELECT) sent ahead of
 * everything else. Commands are pipelined: each is appended to the output at
 * once and written as soon as the socket takes it; replies call back in
 * order. A connection that fails, or whose oldest command is not answered
 * within its timeout, fails every command it holds and is dead: its owner
 * frees it and opens another. Everything runs on the loop's thread. */
#ifndef IDEMPROXY_REDIS_CONN_H
#define IDEMPROXY_REDIS_CONN_H

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct loop;
struct redis_conn;
struct redis_tls;

/* A command's answer: <err> 0 and <reply> (any type, error replies
 * included; borrowed for the call), or a negative errno and NULL when the
 * connection failed first (redis_conn_strerror() says more). */
typedef void redis_reply_fn(void *ctx, int err, const redisReply *reply);

struct redis_conn_handlers {
    /* The set-up was answered: the server is ready for commands. */
    void (*ready)(void *ctx);
    /* The connection failed with <err> (<why> says how, for the log), after
     * every command it held got <err>. The owner frees it, here or later. */
    void (*down)(void *ctx, int err, const char *why);
    /* A message of a subscription (["message", channel, payload]): only
     * after redis_conn_subscribe(). */
    void (*message)(void *ctx, const redisReply *msg);
    void *ctx;
};

struct redis_conn_opts {
    struct sockaddr_storage addr; /* where to connect: resolved already */
    socklen_t addrlen;
    const char *name;      /* host:port as configured, for the log; copied */
    struct redis_tls *tls; /* NULL: plain TCP; borrowed, it must outlive the connection */
    const char *tls_name;  /* the name checked in the certificate and sent as SNI; copied */
    const char *user;      /* AUTH user (ACL), NULL: none; copied */
    const char *password;  /* AUTH password, NULL: no AUTH; copied, wiped when freed */
    unsigned db;           /* SELECT db when not 0 */
    uint64_t timeout_ms;   /* connect, TLS, set-up; and each command's answer */
};

/* The TLS settings of doc/stores.md (Pointing idemproxy at Redis), made once
 * for every connection. */
struct redis_tls_opts {
    const char *ca_file;   /* NULL: the system's CA store */
    const char *cert_file; /* client certificate, NULL: none */
    const char *key_file;  /* its key */
    bool insecure;         /* no verification at all */
};

/* Makes the TLS context. Returns 0, or -EINVAL with why (a file that cannot
 * be read, a key that does not match its certificate) in <why>. */
int redis_tls_new(const struct redis_tls_opts *o, struct redis_tls **ret, char *why,
                  size_t why_len);

/* Frees <t>. NULL-safe. */
void redis_tls_free(struct redis_tls *t);

/* Starts connecting on <loop> (its thread, or before it starts). Returns 0
 * with the connection in <ret> (its outcome comes through <h>, never inside
 * this call), or a negative errno. */
int redis_conn_open(struct loop *loop, const struct redis_conn_opts *o,
                    const struct redis_conn_handlers *h, struct redis_conn **ret);

/* Queues a command; before the set-up is answered it waits behind it.
 * Returns 0 (<fn> then runs exactly once, never inside this call), or
 * -ECONNRESET on a dead connection, -ENOMEM. */
int redis_conn_command(struct redis_conn *c, int argc, const char **argv, const size_t *lens,
                       redis_reply_fn *fn, void *ctx);

/* SUBSCRIBE <channel>: its confirmation goes to <fn>, the messages to the
 * handlers' message(). A subscribed connection takes no other command. */
int redis_conn_subscribe(struct redis_conn *c, const char *channel, redis_reply_fn *fn, void *ctx);

/* Drives <c> without its loop, for a shutdown whose loop has stopped (or
 * from inside a call on its thread that must wait for it): waits up to
 * <max_wait_ms> for its socket, then handles what came, or its deadline. */
void redis_conn_drive(struct redis_conn *c, unsigned max_wait_ms);

/* True once the set-up was answered, until the connection fails. */
bool redis_conn_is_ready(const struct redis_conn *c);

/* Commands sent and not answered yet. */
size_t redis_conn_pending(const struct redis_conn *c);

/* Frees <c>: commands it still holds get -ECANCELED first (down() is not
 * called). Allowed inside its own callbacks. NULL-safe. */
void redis_conn_free(struct redis_conn *c);

/* True when <r> is an error reply whose code is <code> ("NOSCRIPT",
 * "READONLY", ...). */
bool redis_reply_is_error(const redisReply *r, const char *code);

#endif
