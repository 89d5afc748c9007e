/* SPDX-License-Identifier: MIT */
/* The option table of SPEC §3: flags, IDEMPROXY_* environment variables and
 * defaults (flag > env > default), value parsers, --help. Pure logic, no I/O
 * but the help text. */
#ifndef IDEMPROXY_CONFIG_H
#define IDEMPROXY_CONFIG_H

#include <stdio.h>
#include <sys/socket.h>

#include "idemproxy/common.h"
#include "idemproxy/log.h"

struct route_table;

#define CONFIG_MAX_LIST 32 /* entries of a list option (methods, scope headers) */

enum config_on_store_error {
    CONFIG_ON_STORE_ERROR_REJECT,
    CONFIG_ON_STORE_ERROR_PASSTHROUGH,
};

enum config_on_unknown {
    CONFIG_ON_UNKNOWN_REFUSE, /* the key becomes unknown: 502 for every duplicate */
    CONFIG_ON_UNKNOWN_RETRY,  /* the lock is released or taken over: at least once */
};

struct config_addr {
    char text[300]; /* as given: "127.0.0.1:8080", "[::1]:8080", "localhost:80" */
    struct sockaddr_storage sa;
    socklen_t sa_len;
};

struct config {
    struct config_addr listen;       /* --listen, default 127.0.0.1:8080 */
    struct config_addr admin_listen; /* --admin-listen, default 127.0.0.1:9090 */
    char *upstream; /* --upstream, required: scheme://host[:port][/prefix] without a trailing '/' */
    char *redis_url;                /* --redis / IDEMPROXY_REDIS_URL, NULL: memory store */
    char *redis_password_file;      /* --redis-password-file, NULL: none */
    char *redis_password;           /* its first line: beats a password in the URL */
    char *redis_tls_ca_file;        /* --redis-tls-ca-file, NULL: the system's CA store */
    char *redis_tls_cert_file;      /* --redis-tls-cert-file, NULL: no client certificate */
    char *redis_tls_key_file;       /* --redis-tls-key-file */
    char *redis_tls_server_name;    /* --redis-tls-server-name, NULL: the URL's host */
    bool redis_tls_insecure;        /* --redis-tls-insecure: no certificate verification */
    unsigned redis_wait_replicas;   /* --redis-wait-replicas, default 0: no WAIT */
    uint64_t redis_wait_timeout_ms; /* --redis-wait-timeout, default 0.1 s */
    char *methods[CONFIG_MAX_LIST]; /* --methods, upper case, default POST,PUT,PATCH */
    size_t nmethods;
    char *key_header;                     /* --key-header, default Idempotency-Key */
    char *replay_header;                  /* --replay-header, default X-Idempotency-Replayed */
    bool require_key;                     /* --require-key */
    char *scope_headers[CONFIG_MAX_LIST]; /* --scope-header (repeatable), default Authorization */
    size_t nscope_headers;
    char *key_prefix;      /* --key-prefix, default "idem:" */
    uint64_t ttl_ms;       /* --ttl, default 86400 s */
    uint64_t max_ttl_ms;   /* --max-ttl, default 604800 s */
    char *ttl_header;      /* --ttl-header, default X-TTL; "" disables */
    uint64_t lock_ttl_ms;  /* --lock-ttl, default 30 s */
    bool no_cache[600];    /* --no-cache-status: no_cache[status] is true when not cached (default
                              5xx,408,409,429) */
    size_t max_body_bytes; /* --max-body, default 1 MiB */
    size_t max_response_bytes;                 /* --max-response, default 4 MiB */
    size_t memory_max_bytes;                   /* --memory-max-bytes, default 256 MiB */
    uint64_t upstream_timeout_ms;              /* --upstream-timeout, default 30 s */
    uint64_t upstream_late_timeout_ms;         /* --upstream-late-timeout, default 60 s, 0: none */
    enum config_on_unknown on_unknown;         /* --on-unknown-outcome, default refuse */
    uint64_t client_timeout_ms;                /* --client-timeout, default 30 s */
    uint64_t shutdown_timeout_ms;              /* --shutdown-timeout, default 10 s */
    uint64_t store_timeout_ms;                 /* --store-timeout, default 1 s */
    uint64_t wait_ms;                          /* --wait, default 0 */
    enum config_on_store_error on_store_error; /* --on-store-error, default reject */
    unsigned max_connections;                  /* --max-connections, default 4096 */
    enum log_format log_format;         /* --log-format, default text */
    enum log_level log_level;           /* --log-level, default info */
    bool enabled;                              /* IDEMPOTENCY_ENABLED, default true */
    char *admin_token_file;                    /* --admin-token-file, NULL: none */
    char *admin_token;                         /* its first line: the secret /keys asks for */
    char *config_file; /* --config / IDEMPROXY_CONFIG: the YAML file (SPEC §6), NULL: none */
    bool check_config; /* --check-config: validate, print the problems, exit 0 or 2 */
    struct route_table *routes; /* owned reference: the routes and the default route (route.h) */
    bool show_help;             /* --help / -h was given: print config_print_help() and exit 0 */
    bool show_version;          /* --version was given */
};

/* Fills <cfg> from the defaults, then the configuration file (--config or
 * IDEMPROXY_CONFIG: its top level, config_file.h), then the environment
 * <envp> (a NULL-terminated "NAME=value" array, as environ), then the flags
 * <argv>[1..argc-1]; validates the result and builds cfg->routes (the file's
 * routes over the final top-level settings, and the default route). Returns
 * 0, or -EINVAL with the problems written to <err>, one per line: a flag or
 * an environment variable stops at its first problem, with a line naming
 * the option (e.g. "--ttl: '0' is not a positive number of seconds"); the
 * file's problems are all reported, each as "FILE:LINE:COLUMN: message".
 * <cfg> must be zeroed; on any return the caller calls config_done(). With
 * --help or --version it returns 0 with show_help/show_version set and
 * skips every check. */
int config_load(struct config *cfg, int argc, char *const argv[], char *const envp[], char *err,
                size_t errlen);

/* Frees what config_load() allocated. NULL-safe, idempotent. */
void config_done(struct config *cfg);

/* Sets the option <name>, spelled as its flag without the leading dashes
 * ("max-body"), as the configuration file does: from the one value
 * <items>[0] (<is_list> false), or from the <n> items of a list (<is_list>
 * true, for the list options only: methods, scope-header, no-cache-status;
 * an empty list empties it). Returns 0; -ENOENT when no option has that name
 * (or it cannot be set from a file: config, check-config, help, version);
 * -EINVAL for a bad value; -ENOMEM. On failure one line saying why, without
 * a position, is written to <why>. */
int config_set_option(struct config *cfg, const char *name, const char *const *items, size_t n,
                      bool is_list, char *why, size_t whylen);

/* True when <name> is an option a route may set (SPEC §6): methods,
 * require-key, scope-header, ttl, max-ttl, ttl-header, lock-ttl, wait,
 * no-cache-status, max-body, max-response, replay-header. */
bool config_is_route_option(const char *name);

/* Checks the settings a route may change in <cfg> against each other and
 * the top level (a TTL above max-ttl, a max-response the memory store cannot
 * hold twice). Returns 0, or -EINVAL with one line in <why>. */
int config_check_route(const struct config *cfg, char *why, size_t whylen);

/* Makes <dst> (zeroed) a deep copy of <src>, without its secrets (the Redis
 * password and the admin token are left NULL) and without its routes: what
 * a route's settings start from. Returns 0 or -ENOMEM (then config_done(<dst>)). */
int config_copy(struct config *dst, const struct config *src);

/* Writes the usage text: every option, its environment variable and default. */
void config_print_help(FILE *f);

/* Value parsers, used by config_load() and the tests. Each returns 0 with the
 * value in <ret> (untouched on failure) or -EINVAL. */
/* BYTES: a non-negative integer with an optional K, M or G suffix (powers of 1024). */
int config_parse_bytes(const char *s, size_t *ret);
/* S: positive seconds, may be fractional ("0.5"), as milliseconds (at least 1). */
int config_parse_seconds(const char *s, uint64_t *ret);
/* true/false/1/0/yes/no/on/off, case-insensitive. */
int config_parse_bool(const char *s, bool *ret);
/* HOST:PORT or [V6]:PORT; HOST may be a name that resolves. */
int config_parse_addr(const char *s, struct config_addr *ret);
/* A comma-separated list of statuses (100-599) and classes (4xx, 5xx); "" is
 * an empty list. Fills ret[600]. */
int config_parse_status_list(const char *s, bool ret[600]);

/* True when <method> is one of cfg->methods (exact, upper case). */
bool config_is_enforced(const struct config *cfg, struct span method);

#endif
