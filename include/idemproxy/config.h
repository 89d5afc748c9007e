/* SPDX-License-Identifier: MIT */
/* The option table of doc/configuration.md (Options): flags, IDEMPROXY_* environment variables and
 * defaults (flag > env > default), value parsers, --help. Each option's entry
 * says where it lives (the process, or the settings a route may set), whether
 * SIGHUP may change it, and whether it names a secret; freeing, copying,
 * comparing and swapping configurations are loops over the table. Pure logic,
 * no I/O but the help text and the secret files. Loading the whole
 * configuration, the file included, is config_file_load() (config_file.h). */
#ifndef IDEMPROXY_CONFIG_H
#define IDEMPROXY_CONFIG_H

#include <stdio.h>

#include "idemproxy/common.h"
#include "idemproxy/config_parse.h"
#include "idemproxy/log.h"

enum config_on_store_error {
    CONFIG_ON_STORE_ERROR_REJECT,
    CONFIG_ON_STORE_ERROR_PASSTHROUGH,
};

/* Which HTTP client carries the exchanges with the upstream (doc/performance.md). */
enum config_upstream_client {
    CONFIG_UPSTREAM_CLIENT_AUTO, /* idemproxy's own for http://, libcurl for https:// */
    CONFIG_UPSTREAM_CLIENT_CURL, /* libcurl for both */
};

enum config_on_unknown {
    CONFIG_ON_UNKNOWN_REFUSE, /* the key becomes unknown: 502 for every duplicate */
    CONFIG_ON_UNKNOWN_RETRY,  /* the lock is released or taken over: at least once */
};

/* A keyed request whose token does not verify (doc/configuration.md, Scope). */
enum config_on_unverified {
    CONFIG_ON_UNVERIFIED_REJECT,      /* 401 idempotency_scope_unverified */
    CONFIG_ON_UNVERIFIED_PASSTHROUGH, /* forwarded unprotected */
};

/* What an option's entry says of it. */
enum config_trait {
    /* a route may set it (doc/configuration.md, The file): it lives in struct route_settings */
    CONFIG_ROUTE = 1 << 0,
    CONFIG_RESTART = 1 << 1, /* SIGHUP keeps the running value: a change needs a restart */
    CONFIG_SECRET = 1 << 2,  /* names a file whose first line is a secret: never logged or copied */
};

/* The options a route may set (doc/configuration.md, The file). The process configuration holds
 * the top level's (struct config's <route>): the default route's settings,
 * and what every route starts from. Declared here, beside the table that
 * fills it. */
struct route_settings {
    char *methods[CONFIG_MAX_LIST]; /* methods, upper case, default POST,PUT,PATCH */
    size_t nmethods;
    bool require_key;                     /* require-key */
    char *scope_headers[CONFIG_MAX_LIST]; /* scope-header (repeatable), default Authorization */
    size_t nscope_headers;
    uint64_t ttl_ms;     /* ttl, default 86400 s */
    uint64_t max_ttl_ms; /* max-ttl, default 604800 s */
    uint64_t min_ttl_ms; /* min-ttl, default 0: the floor of a TTL a request asks for */
    /* tombstone-ttl, default 7 d; 0: none (doc/configuration.md, Tombstones) */
    uint64_t tombstone_ttl_ms;
    char *ttl_header;      /* ttl-header, default X-TTL; "" disables */
    uint64_t lock_ttl_ms;  /* lock-ttl, default 30 s */
    uint64_t wait_ms;      /* wait, default 0 */
    bool no_cache[600];    /* no-cache-status: no_cache[status] is true when not cached (default
                              5xx,408,409,429) */
    size_t max_body_bytes; /* max-body, default 1 MiB: keyed requests */
    size_t max_passthrough_body_bytes;       /* max-passthrough-body, default 0: no limit */
    size_t max_response_bytes;               /* max-response, default 4 MiB */
    char *replay_header;                     /* replay-header, default X-Idempotency-Replayed */
    enum config_on_unknown on_unknown;       /* on-unknown-outcome, default refuse */
    bool require_scope;                      /* require-scope: a keyed request needs a principal */
    enum config_on_unverified on_unverified; /* on-unverified, default reject */
};

struct config {
    struct config_addr listen;       /* --listen, default 127.0.0.1:8080 */
    struct config_addr admin_listen; /* --admin-listen, default 127.0.0.1:9090 */
    char *upstream; /* --upstream, required: scheme://host[:port][/prefix] without a trailing '/' */
    char *upstream_tls_ca_file;     /* --upstream-tls-ca-file, NULL: the system's CA store */
    char *upstream_tls_cert_file;   /* --upstream-tls-cert-file, NULL: no client certificate */
    char *upstream_tls_key_file;    /* --upstream-tls-key-file */
    char *upstream_tls_server_name; /* --upstream-tls-server-name, NULL: the URL's host */
    bool upstream_tls_insecure;     /* --upstream-tls-insecure: no certificate verification */
    char *tls_cert_file;            /* --tls-cert-file, NULL: --listen is plain HTTP */
    char *tls_key_file;             /* --tls-key-file */
    char *request_id_header;        /* --request-id-header, default X-Request-Id, "": none */
    char
        *store_encryption_key_file; /* --store-encryption-key-file, NULL: answers stored in clear */
    char *storage_header;           /* --storage-header, default Idempotency-Storage, "": none */
    char *store_url;              /* --store / IDEMPROXY_STORE_URL, NULL: see config_store_url() */
    char *store_password_file;    /* --store-password-file, NULL: none */
    char *store_password;         /* its first line: beats a password in the URL */
    char *redis_url;              /* --redis / IDEMPROXY_REDIS_URL, NULL: see config_store_url() */
    char *redis_password_file;    /* --redis-password-file, NULL: none */
    char *redis_password;         /* its first line: beats a password in the URL */
    char *redis_tls_ca_file;      /* --redis-tls-ca-file, NULL: the system's CA store */
    char *redis_tls_cert_file;    /* --redis-tls-cert-file, NULL: no client certificate */
    char *redis_tls_key_file;     /* --redis-tls-key-file */
    char *redis_tls_server_name;  /* --redis-tls-server-name, NULL: the URL's host */
    bool redis_tls_insecure;      /* --redis-tls-insecure: no certificate verification */
    unsigned redis_wait_replicas; /* --redis-wait-replicas, default 0: no WAIT */
    uint64_t redis_wait_timeout_ms;    /* --redis-wait-timeout, default 0.1 s */
    char *key_header;                  /* --key-header, default Idempotency-Key */
    char *key_prefix;                  /* --key-prefix, default "idem:" */
    size_t memory_max_bytes;           /* --memory-max-bytes, default 256 MiB */
    uint64_t upstream_timeout_ms;      /* --upstream-timeout, default 30 s */
    uint64_t upstream_late_timeout_ms; /* --upstream-late-timeout, default 60 s, 0: none */
    enum config_upstream_client upstream_client; /* --upstream-client, default auto */
    uint64_t client_timeout_ms;                  /* --client-timeout, default 30 s */
    uint64_t shutdown_timeout_ms;                /* --shutdown-timeout, default 10 s */
    uint64_t drain_delay_ms;                     /* --drain-delay, default 0 */
    char *otlp_endpoint;                         /* --otlp-endpoint, NULL: no tracing */
    double trace_sample;                         /* --trace-sample, default 1.0 */
    unsigned trace_queue;                        /* --trace-queue, default 2048 */
    uint64_t store_timeout_ms;                   /* --store-timeout, default 1 s */
    enum config_on_store_error on_store_error;   /* --on-store-error, default reject */
    unsigned max_connections;                    /* --max-connections, default 4096 */
    enum log_format log_format;                  /* --log-format, default text */
    enum log_level log_level;                    /* --log-level, default info */
    bool enabled;                                /* IDEMPOTENCY_ENABLED, default true */
    char *admin_token_file;                      /* --admin-token-file, NULL: none */
    char *admin_token;                           /* its first line: the secret /keys asks for */
    /* --config / IDEMPROXY_CONFIG: the YAML file (doc/configuration.md,
     * Configuration file), NULL: none */
    char *config_file;
    bool check_config;           /* --check-config: validate, print the problems, exit 0 or 2 */
    bool show_help;              /* --help / -h was given: print config_print_help() and exit 0 */
    bool show_version;           /* --version was given */
    struct route_settings route; /* the top level's route options (see struct route_settings) */
};

/* The steps of loading, in the order config_file_load() takes them: the
 * defaults, the file (config_set_option()), the environment and the flags.
 * Each returns 0, or a negative errno with one line in <err> naming the
 * option (e.g. "--ttl: '0' is not a positive number of seconds"). <cfg>
 * starts zeroed; whatever they return, config_done() frees it. */

/* Sets every option to its default. Returns 0 or -ENOMEM. */
int config_init(struct config *cfg, char *err, size_t errlen);

/* Sets show_help or show_version when <argv> asks for them (those win over
 * everything else, bad values included) and returns true; else false. */
bool config_wants_action(struct config *cfg, int argc, char *const argv[]);

/* The configuration file named by the last --config of <argv>, else by
 * IDEMPROXY_CONFIG in <envp>; NULL: none. */
const char *config_find_file(int argc, char *const argv[], char *const envp[]);

/* Applies the environment <envp> (a NULL-terminated "NAME=value" array, as
 * environ), then the flags <argv>[1..argc-1]. Returns 0 or -EINVAL,
 * stopping at the first problem. (config_check.h checks the result.) */
int config_apply_args(struct config *cfg, int argc, char *const argv[], char *const envp[],
                      char *err, size_t errlen);

/* Frees what <cfg> owns (secrets wiped). NULL-safe, idempotent. */
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

/* config_set_option() for a route's settings <rs>: -ENOENT for a name that
 * is not an option a route may set. */
int config_set_route_option(struct route_settings *rs, const char *name, const char *const *items,
                            size_t n, bool is_list, char *why, size_t whylen);

/* True when <name> is an option a route may set (doc/configuration.md, The file). */
bool config_is_route_option(const char *name);

/* Writes the names of the options a route may set, comma-separated, to <out>. */
void config_route_option_names(char *out, size_t outlen);

/* Puts up to <max> of those names (static strings) in <out>; returns how many. */
size_t config_route_option_list(const char **out, size_t max);

/* Makes <dst> (zeroed) a deep copy of <src>. Returns 0 or -ENOMEM (then
 * config_route_done(<dst>)). */
int config_route_copy(struct route_settings *dst, const struct route_settings *src);

/* Frees what <rs> owns. NULL-safe, idempotent. */
void config_route_done(struct route_settings *rs);

/* Runs once for each option whose value differs between two configurations:
 * <name> as the file spells it ("max-body", or the variable of an option that
 * is only one, "IDEMPOTENCY_ENABLED"), <traits> its enum config_trait bits. */
typedef void config_diff_fn(void *ctx, const char *name, unsigned traits);

/* Compares <a> and <b> option by option (a secret by its file and by the
 * secret itself), calling <fn> for each difference in table order. Returns
 * how many differ. */
size_t config_diff(const struct config *a, const struct config *b, config_diff_fn *fn, void *ctx);

/* What SIGHUP does to the running configuration <cfg>: every option it may
 * change (not CONFIG_RESTART) takes its value from <next>, whose old value
 * goes to <next> in exchange (config_done(<next>) frees it). Options that
 * need a restart keep their running value. */
void config_swap_reloadable(struct config *cfg, struct config *next);

/* Writes the usage text: every option, its environment variable and default. */
void config_print_help(FILE *f);

/* Told of an IDEMPROXY_* variable that names no option: <name>, and the
 * nearest that does (NULL: none is near). */
typedef void config_env_fn(void *ctx, const char *name, const char *near);

/* Calls <fn> for each IDEMPROXY_* variable of <envp> that is no option's
 * (ignored, and worth a warning: a misspelt one is silently unset). Returns
 * how many. */
size_t config_each_unknown_env(char *const envp[], config_env_fn *fn, void *ctx);

/* The store's URL: --store, else --redis; NULL: the memory store. */
static inline const char *config_store_url(const struct config *cfg)
{
    return cfg->store_url ? cfg->store_url : cfg->redis_url;
}

/* The store's password from a file: --store-password-file's, else
 * --redis-password-file's; NULL: none (the URL's, or libpq's own). */
static inline const char *config_store_password(const struct config *cfg)
{
    return cfg->store_password ? cfg->store_password : cfg->redis_password;
}

/* True when an answer of <status> is stored under <rs> (no-cache-status). */
bool config_is_cacheable(const struct route_settings *rs, unsigned status);

/* True when <method> is one of <rs>'s methods (exact, upper case). */
bool config_is_enforced(const struct route_settings *rs, struct span method);

#endif
