/* SPDX-License-Identifier: MIT */
/* The values of the options of doc/configuration.md (Options), each parsed as its kind. Used by the
 * option table (config.h), the tests and the fuzzers. Each parser returns 0
 * with the value in <ret> (untouched on failure) or -EINVAL; those that keep
 * text replace *<slot> with a new copy (the old one freed) and leave it alone
 * on failure, or return -ENOMEM. Pure, but for the resolver (an address's
 * host) and the files they read (a secret, a readable path). */
#ifndef IDEMPROXY_CONFIG_PARSE_H
#define IDEMPROXY_CONFIG_PARSE_H

#include <sys/socket.h>

#include "idemproxy/common.h"

#define CONFIG_MAX_LIST 32 /* entries of a list option (methods, scope headers) */

struct config_addr {
    char text[300]; /* as given: "127.0.0.1:8080", "[::1]:8080", "localhost:80" */
    struct sockaddr_storage sa;
    socklen_t sa_len;
};

/* BYTES: a non-negative integer with an optional K, M or G suffix (powers of 1024). */
int config_parse_bytes(const char *s, size_t *ret);
/* S: positive seconds, may be fractional ("0.5"), with an optional unit s, m, h
 * or d ("7d", "1.5h"), as milliseconds (at least 1). */
int config_parse_seconds(const char *s, uint64_t *ret);
/* S, zero allowed. */
int config_parse_seconds0(const char *s, uint64_t *ret);
/* true/false/1/0/yes/no/on/off, case-insensitive. */
int config_parse_bool(const char *s, bool *ret);
/* HOST:PORT or [V6]:PORT; HOST may be a name that resolves. */
int config_parse_addr(const char *s, struct config_addr *ret);
/* A comma-separated list of statuses (100-599) and classes (4xx, 5xx); "" is
 * an empty list. Fills ret[600]. */
int config_parse_status_list(const char *s, bool ret[600]);
/* A whole number from 1 (0 with <zero_ok>) to 1000000. */
int config_parse_count(const char *s, bool zero_ok, unsigned *ret);

/* A ratio: a decimal number from 0 to 1 ("0.25", "1", "1e-3"). Returns 0 or -EINVAL. */
int config_parse_ratio(const char *s, double *ret);
/* One of the NULL-terminated <choices>: its index. */
int config_parse_choice(const char *const *choices, const char *s, int *ret);

/* The one of the <n> <names> (NULL ones skipped) nearest the <len> bytes of
 * <s> by edit distance, when near enough to be the one meant: at most 3
 * edits, and at most a third of its length. NULL when none is. */
const char *config_nearest(const char *s, size_t len, const char *const *names, size_t n);

/* Any text. */
int config_parse_string(char **slot, const char *v);
/* A header name (a token); "" too with <may_be_empty>. */
int config_parse_header(char **slot, const char *v, bool may_be_empty);
/* scheme://host[:port][/prefix], http or https, as libcurl's URL API reads
 * it, with no user info, query or fragment; one trailing '/' dropped. */
int config_parse_upstream(char **slot, const char *v);
/* A Redis URL (redis_url.h); "" sets *<slot> to NULL (no Redis). */
int config_parse_redis_url(char **slot, const char *v);
/* A store URL of any store of the registry (store_registry.h); "" sets
 * *<slot> to NULL (no URL). */
int config_parse_store_url(char **slot, const char *v);
/* Why <v> is no Redis URL (<any_store>: no store URL either), into <why>. */
void config_store_url_why(const char *v, bool any_store, char *why, size_t len);
/* The path of a file this process can read (-errno when it cannot). */
int config_parse_file(char **slot, const char *path);
/* A DNS name or an IP address. */
int config_parse_hostname(char **slot, const char *v);
/* Reads the first line of the file <path> (its line end left out) as a
 * secret: into <secret_slot> (the old secret wiped), and the path into
 * <path_slot>. A token (<token>) has the whitespace around it cut and is 1
 * to 4096 visible ASCII characters; a password is 1 to 4096 bytes with no
 * control character. -errno when the file cannot be read. */
int config_parse_secret_file(char **path_slot, char **secret_slot, const char *path, bool token);
/* Parses the comma-separated tokens of <v> into the list <list> of <n>
 * entries (at most CONFIG_MAX_LIST), replacing it, or appending when
 * <append>; <upper> (methods) upper-cases them and refuses an empty list,
 * which other lists (scope headers) take as none. -E2BIG past the limit. */
int config_parse_list(char **list, size_t *n, const char *v, bool append, bool upper);
/* Frees the <n> entries of <list>; <n> becomes 0. */
void config_parse_list_clear(char **list, size_t *n);

#endif
