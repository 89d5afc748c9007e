/* SPDX-License-Identifier: MIT */
/* PostgreSQL URLs (SPEC §10): libpq's URI form, postgresql:// or
 * postgres://, checked by libpq's own parser, and shown with every password
 * hidden. Pure functions. */
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

/* Writes <s> into <out> (<len> bytes, at least 1) with the password of its
 * user info and the values of its password and sslpassword parameters
 * replaced by "***". */
void pg_url_redact(const char *s, char *out, size_t len);

#endif
