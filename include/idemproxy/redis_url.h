/* SPDX-License-Identifier: MIT */
/* Redis URLs (doc/stores.md, Pointing idemproxy at Redis): one server, several
 * cluster seed nodes, or the sentinels of a named master; plain or TLS. Pure
 * functions. */
#ifndef IDEMPROXY_REDIS_URL_H
#define IDEMPROXY_REDIS_URL_H

#include <stdbool.h>
#include <stddef.h>

#define REDIS_URL_MAX_HOSTS 16
#define REDIS_URL_HOST_MAX 256

enum redis_url_kind {
    REDIS_URL_SERVER,   /* redis://HOST[:PORT] (or rediss://) */
    REDIS_URL_SEEDS,    /* redis://H1:P1,H2:P2,…: seed nodes of one Redis Cluster */
    REDIS_URL_SENTINEL, /* redis-sentinel://S1:P1,…?master=NAME (or rediss-sentinel://) */
};

struct redis_addr {
    char host[REDIS_URL_HOST_MAX]; /* a name, or an IP literal without brackets */
    unsigned port;
};

struct redis_url {
    enum redis_url_kind kind;
    bool tls;
    struct redis_addr hosts[REDIS_URL_MAX_HOSTS]; /* the server, the seeds or the sentinels */
    unsigned nhosts;
    char *user;     /* owned, decoded; NULL: none (AUTH with the password alone) */
    char *password; /* owned, decoded; NULL: none */
    unsigned db;
    char *master;            /* owned: Sentinel's name of the master */
    char *sentinel_user;     /* owned: the sentinels' own user, NULL: none */
    char *sentinel_password; /* owned: the sentinels' own password, NULL: none */
};

/* Parses <s>:
 *   redis[s]://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…][/DB]
 *   redis[s]-sentinel://[[USER]:PASSWORD@]S1[:PORT][,S2[:PORT]…][/DB]?master=NAME
 *       [&sentinel_user=U][&sentinel_password=P]
 * The scheme is case-insensitive; the user info and query values are
 * percent-decoded (%00 is refused). Without a query (redis://, rediss://)
 * the last '@' ends the user info, so a password may hold '@', '/', '?' or
 * '#' unencoded; in a Sentinel URL it is the last '@' before the first '?'
 * (a '?' in its password must be encoded, an '@' in a query value need not).
 * "USER@" without a colon names an ACL user (as redis-py and node-redis read
 * it; its password from a file, or none). Ports default to 6379 (26379
 * for a sentinel). Returns 0 with <ret> filled (free it with redis_url_done()), or -EINVAL with a
 * message of at most 160 bytes in <why> (which may be NULL), or -ENOMEM. */
int redis_url_parse(const char *s, struct redis_url *ret, char *why, size_t why_len);

/* Frees what <u> owns and zeroes it. NULL-safe. */
void redis_url_done(struct redis_url *u);

/* Writes <s> into <out> (<len> bytes, always terminated, truncated if need
 * be) with the password of its user info and the value of sentinel_password
 * replaced by "***": the form every log line and error message uses. */
void redis_url_redact(const char *s, char *out, size_t len);

/* "host:port", with brackets around an IPv6 literal, into <out>. */
void redis_addr_format(const struct redis_addr *a, char *out, size_t len);

#endif
