/* SPDX-License-Identifier: MIT */
/* PostgreSQL URLs (doc/stores.md, PostgreSQL): libpq's URI form, postgresql:// or
 * postgres://, checked by libpq's own parser, and shown with every password
 * hidden; and client bytes made into text PostgreSQL takes. Pure functions. */
#ifndef IDEMPROXY_PG_URL_H
#define IDEMPROXY_PG_URL_H

#include <stdbool.h>
#include <stddef.h>

/* True when <s> starts with postgresql:// or postgres:// (any case). */
bool pg_url_is(const char *s);

/* Checks <s> with libpq's URI parser (PQconninfoParse): its parameters
 * included, an unknown one refused. Returns 0, -ENOMEM, or -EINVAL with
 * libpq's reason in <why> (<len> bytes, may be 0). */
int pg_url_check(const char *s, char *why, size_t len);

#define PG_URL_MAX_HOSTS 16
#define PG_URL_HOST_MAX 256

/* The servers a URL names, as libpq reads them: its host list (names, IP
 * addresses, socket folders), each with its port ("" for libpq's default). */
struct pg_url_hosts {
    unsigned n;
    char host[PG_URL_MAX_HOSTS][PG_URL_HOST_MAX];
    char port[PG_URL_MAX_HOSTS][8];
    bool hostaddr; /* the URL gives hostaddr itself: nothing to look up */
};

/* Reads the hosts of <s> into <ret>. Returns 0, -EINVAL (no URL libpq
 * reads, or more than PG_URL_MAX_HOSTS hosts) or -ENOMEM. */
int pg_url_hosts(const char *s, struct pg_url_hosts *ret);

/* True when <host> must be looked up: not an IP address, not a socket folder. */
bool pg_url_host_is_name(const char *host);

/* Writes <s> into <out> (<len> bytes, at least 1) with the password of its
 * user info and the values of its password and sslpassword parameters
 * replaced by "***". */
void pg_url_redact(const char *s, char *out, size_t len);

/* Writes the <n> bytes of <in> into <out> (<cap> bytes, at least 1) as
 * printable ASCII, which any server encoding takes as text: each byte
 * outside 0x20-0x7E as %XX (upper-case hex), the rest as they are; stops
 * before a byte whose form would not fit. NUL-terminated; returns its
 * length. */
size_t pg_text_escape(const char *in, size_t n, char *out, size_t cap);

#endif
