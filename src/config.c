/* SPDX-License-Identifier: MIT */
/* The options (doc/configuration.md): one static table drives the defaults, the
 * environment, the flags, the file's keys, --help, and every loop over a
 * configuration (free, copy, diff, reload); main thread, at start and on SIGHUP. */
#include "idemproxy/config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idemproxy/store_registry.h"

enum kind {
    K_ADDR,          /* struct config_addr */
    K_URL,           /* char *, the upstream URL */
    K_REDIS,         /* char *, a Redis URL (redis_url.h); "" means none */
    K_STORE,         /* char *, a store URL: PostgreSQL's (pg_url.h) or Redis's; "" means none */
    K_STR,           /* char *, any text */
    K_HEADER,        /* char *, a non-empty token */
    K_HEADER_OPT,    /* char *, a token or "" */
    K_METHODS,       /* char *[CONFIG_MAX_LIST] + count, replaced as a whole */
    K_HEADERS,       /* char *[CONFIG_MAX_LIST] + count, repeated flags accumulate */
    K_BOOL,          /* bool */
    K_SECONDS,       /* uint64_t ms, positive */
    K_SECONDS0,      /* uint64_t ms, zero allowed */
    K_BYTES,         /* size_t */
    K_STATUS,        /* bool[600] */
    K_CHOICE,        /* an enum: the index in <choices> */
    K_COUNT,         /* unsigned, 1..COUNT_MAX */
    K_COUNT0,        /* unsigned, 0..COUNT_MAX */
    K_ACTION,        /* bool set to true: --help, --version */
    K_TOKEN_FILE,    /* --admin-token-file: the path, and its first line in cfg->admin_token */
    K_PASSWORD_FILE, /* --*-password-file: the path, and its first line in the secret field */
    K_FILE,          /* char *, the path of a file this process can read */
    K_HOSTNAME,      /* char *, a DNS name or an IP address */
};

/* How a bad value of each kind is explained: "'<v>' is not <what> (<expect>)". */
static const struct {
    const char *what;
    const char *expect;
} kind_info[] = {
    [K_ADDR] = { "an address", "use HOST:PORT or [IPv6]:PORT, a port from 1 to 65535 and a host "
                               "that resolves" },
    [K_URL] = { "an upstream URL", "use http:// or https://, a host, an optional port and path "
                                   "prefix, no user info, query or fragment, e.g. "
                                   "http://127.0.0.1:3000" },
    [K_REDIS] = { "a Redis URL",
                  "use redis://[[user]:password@]host[:port][/db], rediss:// for TLS, or "
                  "redis-sentinel://host[:port][,host[:port]...]?master=NAME" },
    [K_STORE] = { "a store URL", NULL }, /* the forms come from the store registry */
    [K_STR] = { "a string", "any text" },
    [K_HEADER] = { "a header name", "use a non-empty token such as Idempotency-Key" },
    [K_HEADER_OPT] = { "a header name", "use a token such as X-TTL, or \"\" to disable" },
    [K_METHODS] = { "a method list", "use comma-separated methods, e.g. POST,PUT,PATCH" },
    [K_HEADERS] = { "a header name", "use a token such as Authorization; a list is "
                                     "comma-separated" },
    [K_BOOL] = { "a boolean", "use true/false, 1/0, yes/no or on/off" },
    [K_SECONDS] = { "a positive number of seconds", "e.g. 30 or 0.5" },
    [K_SECONDS0] = { "a number of seconds", "0 or more, e.g. 0.5" },
    [K_BYTES] = { "a size", "use BYTES, optionally K, M or G" },
    [K_STATUS] = { "a status list", "use codes 100-599 and classes such as 4xx, comma-separated, "
                                    "or \"\" to cache every status" },
    [K_CHOICE] = { "a valid choice", NULL },
    [K_COUNT] = { "a whole number", "use 1 to 1000000" },
    [K_COUNT0] = { "a whole number", "use 0 to 1000000" },
    [K_ACTION] = { "an action", "takes no value" },
    [K_PASSWORD_FILE] = { "a password file", "its first line is the password: 1 to 4096 bytes, "
                                             "no control characters" },
    [K_FILE] = { "a readable file", "give the path of a file this process can read" },
    [K_HOSTNAME] = { "a host name", "letters, digits, '-', '.' and '_', or an IP address" },
    [K_TOKEN_FILE] = { "a token file", "its first line is the token: 1 to 4096 visible ASCII "
                                       "characters, no spaces" },
};

struct opt {
    const char *flag; /* "--listen"; for an environment-only entry, the flag it feeds */
    const char *env;  /* the environment variable, NULL: none */
    const char *arg;  /* value placeholder in --help, NULL: a flag without value */
    const char *def;  /* default, parsed like any value; NULL: none */
    const char *help;
    enum kind kind;
    unsigned traits; /* enum config_trait */
    size_t off;      /* the field, in struct config (or struct route_settings: CONFIG_ROUTE) */
    size_t off2;     /* K_METHODS, K_HEADERS: the entry count; the secret files: the secret */
    const char *const *choices; /* K_CHOICE, NULL-terminated, index = enum value */
    bool env_only;              /* no flag of its own: IDEMPOTENCY_* */
    bool alias;                 /* another entry's field (an older variable): not looped over */
};

static const char *const on_store_error_names[] = { "reject", "passthrough", NULL };
static const char *const on_unknown_names[] = { "refuse", "retry", NULL };
static const char *const upstream_client_names[] = { "auto", "curl", NULL };
static const char *const log_format_names[] = { "text", "json", NULL };
static const char *const log_level_names[] = { "error", "warn", "info", "debug", NULL };

/* K_CHOICE writes the index through an int. */
_Static_assert(sizeof(enum config_on_store_error) == sizeof(int), "enum size");
_Static_assert(sizeof(enum config_upstream_client) == sizeof(int), "enum size");
_Static_assert(sizeof(enum config_on_unknown) == sizeof(int), "enum size");
_Static_assert(sizeof(enum log_format) == sizeof(int), "enum size");
_Static_assert(sizeof(enum log_level) == sizeof(int), "enum size");

#define F(field) offsetof(struct config, field)
#define R(field) offsetof(struct route_settings, field)

/* Environment entries are read in this order, so IDEMPOTENCY_DEFAULT_TTL_SEC
 * comes before IDEMPROXY_TTL, which then overrides it. */
static const struct opt opts[] = {
    { "--listen", "IDEMPROXY_LISTEN", "HOST:PORT", "127.0.0.1:8080",
      "address of the proxy (IPv6 as [::1]:8080)", K_ADDR, CONFIG_RESTART, F(listen), 0, NULL,
      false, false },
    { "--upstream", "IDEMPROXY_UPSTREAM", "URL", NULL,
      "required: the API to protect, http:// or https:// (no user info, query or fragment); "
      "every request goes there, a path prefix before every target",
      K_URL, CONFIG_RESTART, F(upstream), 0, NULL, false, false },
    { "--upstream-tls-ca-file", "IDEMPROXY_UPSTREAM_TLS_CA_FILE", "FILE", NULL,
      "https://: the CAs that verify the upstream's certificate; none: the system's", K_FILE,
      CONFIG_RESTART, F(upstream_tls_ca_file), 0, NULL, false, false },
    { "--upstream-tls-cert-file", "IDEMPROXY_UPSTREAM_TLS_CERT_FILE", "FILE", NULL,
      "https://: a client certificate (PEM, its chain after it) for the upstream", K_FILE,
      CONFIG_RESTART, F(upstream_tls_cert_file), 0, NULL, false, false },
    { "--upstream-tls-key-file", "IDEMPROXY_UPSTREAM_TLS_KEY_FILE", "FILE", NULL,
      "https://: the client certificate's key (PEM)", K_FILE, CONFIG_RESTART,
      F(upstream_tls_key_file), 0, NULL, false, false },
    { "--upstream-tls-server-name", "IDEMPROXY_UPSTREAM_TLS_SERVER_NAME", "NAME", NULL,
      "https://: the name verified in the upstream's certificate and sent as SNI (for an "
      "upstream reached by IP); none: the URL's host",
      K_HOSTNAME, CONFIG_RESTART, F(upstream_tls_server_name), 0, NULL, false, false },
    { "--upstream-tls-insecure", "IDEMPROXY_UPSTREAM_TLS_INSECURE", NULL, "false",
      "https://: do not verify the upstream's certificate (warned about at start)", K_BOOL,
      CONFIG_RESTART, F(upstream_tls_insecure), 0, NULL, false, false },
    { "--tls-cert-file", "IDEMPROXY_TLS_CERT_FILE", "FILE", NULL,
      "makes --listen HTTPS (TLS 1.2 and 1.3): its certificate (PEM, the chain after it)", K_FILE,
      CONFIG_RESTART, F(tls_cert_file), 0, NULL, false, false },
    { "--tls-key-file", "IDEMPROXY_TLS_KEY_FILE", "FILE", NULL, "the key of --tls-cert-file (PEM)",
      K_FILE, CONFIG_RESTART, F(tls_key_file), 0, NULL, false, false },
    { "--request-id-header", "IDEMPROXY_REQUEST_ID_HEADER", "NAME", "X-Request-Id",
      "the request id: kept when sane, else made; forwarded, echoed, logged; \"\" disables",
      K_HEADER_OPT, CONFIG_RESTART, F(request_id_header), 0, NULL, false, false },
    { "--store-encryption-key-file", "IDEMPROXY_STORE_ENCRYPTION_KEY_FILE", "FILE", NULL,
      "seal stored answers (AES-256-GCM): lines of ID:BASE64-32-BYTE-KEY, the first seals, "
      "every one opens (rotation)",
      K_FILE, CONFIG_RESTART, F(store_encryption_key_file), 0, NULL, false, false },
    { "--storage-header", "IDEMPROXY_STORAGE_HEADER", "NAME", "Idempotency-Storage",
      "the upstream's answer header no-store or ttl=S (capped by --max-ttl), never passed on; "
      "\"\" disables",
      K_HEADER_OPT, CONFIG_RESTART, F(storage_header), 0, NULL, false, false },
    { "--store", "IDEMPROXY_STORE_URL", "URL", NULL,
      "the store: postgresql://user@host[:port][,host[:port]...]/db[?params] (also postgres://; "
      "libpq's URI), or any --redis URL; none: --redis, else the in-process memory store",
      K_STORE, CONFIG_RESTART, F(store_url), 0, NULL, false, false },
    { "--store-password-file", "IDEMPROXY_STORE_PASSWORD_FILE", "FILE", NULL,
      "the store's password: the file's first line, which beats one in the URL and "
      "--redis-password-file's (and stays out of the process list)",
      K_PASSWORD_FILE, CONFIG_RESTART | CONFIG_SECRET, F(store_password_file), F(store_password),
      NULL, false, false },
    { "--redis", "IDEMPROXY_REDIS_URL", "URL", NULL,
      "Redis store, redis://[[user]:password@]host[:port][/db], rediss:// for TLS, "
      "redis://h1:p1,h2:p2 for a cluster's seeds (a cluster is found by itself), or "
      "redis-sentinel://host[:port][,...]?master=NAME; none: in-process memory store",
      K_REDIS, CONFIG_RESTART, F(redis_url), 0, NULL, false, false },
    { "--redis-password-file", "IDEMPROXY_REDIS_PASSWORD_FILE", "FILE", NULL,
      "Redis password: the file's first line, which beats one in the URL (and stays out of the "
      "process list)",
      K_PASSWORD_FILE, CONFIG_RESTART | CONFIG_SECRET, F(redis_password_file), F(redis_password),
      NULL, false, false },
    { "--redis-tls-ca-file", "IDEMPROXY_REDIS_TLS_CA_FILE", "FILE", NULL,
      "rediss://: the CAs that verify Redis's certificate; none: the system's CA store", K_FILE,
      CONFIG_RESTART, F(redis_tls_ca_file), 0, NULL, false, false },
    { "--redis-tls-cert-file", "IDEMPROXY_REDIS_TLS_CERT_FILE", "FILE", NULL,
      "rediss://: a client certificate (PEM) for Redis servers that ask for one", K_FILE,
      CONFIG_RESTART, F(redis_tls_cert_file), 0, NULL, false, false },
    { "--redis-tls-key-file", "IDEMPROXY_REDIS_TLS_KEY_FILE", "FILE", NULL,
      "rediss://: the client certificate's key (PEM)", K_FILE, CONFIG_RESTART,
      F(redis_tls_key_file), 0, NULL, false, false },
    { "--redis-tls-server-name", "IDEMPROXY_REDIS_TLS_SERVER_NAME", "NAME", NULL,
      "rediss://: the name checked in Redis's certificate and sent as SNI; none: the URL's host",
      K_HOSTNAME, CONFIG_RESTART, F(redis_tls_server_name), 0, NULL, false, false },
    { "--redis-tls-insecure", "IDEMPROXY_REDIS_TLS_INSECURE", NULL, "false",
      "rediss://: do not verify Redis's certificate (warned about at start; for tests only)",
      K_BOOL, CONFIG_RESTART, F(redis_tls_insecure), 0, NULL, false, false },
    { "--redis-wait-replicas", "IDEMPROXY_REDIS_WAIT_REPLICAS", "N", "0",
      "after each write, wait (WAIT) for this many replicas to have it; a new key they do not "
      "confirm in time is refused (503); 0: do not wait",
      K_COUNT0, CONFIG_RESTART, F(redis_wait_replicas), 0, NULL, false, false },
    { "--redis-wait-timeout", "IDEMPROXY_REDIS_WAIT_TIMEOUT", "S", "0.1",
      "how long --redis-wait-replicas waits for the replicas", K_SECONDS, CONFIG_RESTART,
      F(redis_wait_timeout_ms), 0, NULL, false, false },
    { "--admin-listen", "IDEMPROXY_ADMIN_LISTEN", "HOST:PORT", "127.0.0.1:9090",
      "address of /healthz, /readyz and /metrics", K_ADDR, CONFIG_RESTART, F(admin_listen), 0, NULL,
      false, false },
    { "--methods", "IDEMPROXY_METHODS", "LIST", "POST,PUT,PATCH",
      "comma-separated methods that need idempotency", K_METHODS, CONFIG_ROUTE, R(methods),
      R(nmethods), NULL, false, false },
    { "--key-header", "IDEMPROXY_KEY_HEADER", "NAME", "Idempotency-Key",
      "request header carrying the key", K_HEADER, 0, F(key_header), 0, NULL, false, false },
    { "--replay-header", "IDEMPROXY_REPLAY_HEADER", "NAME", "X-Idempotency-Replayed",
      "response header telling a replay (true) from an execution (false)", K_HEADER, CONFIG_ROUTE,
      R(replay_header), 0, NULL, false, false },
    { "--require-key", "IDEMPROXY_REQUIRE_KEY", NULL, "false",
      "answer 400 to an enforced request without a key", K_BOOL, CONFIG_ROUTE, R(require_key), 0,
      NULL, false, false },
    { "--scope-header", "IDEMPROXY_SCOPE_HEADER", "NAME", "Authorization",
      "header whose value scopes keys per client; repeatable (environment: comma-separated)",
      K_HEADERS, CONFIG_ROUTE, R(scope_headers), R(nscope_headers), NULL, false, false },
    { "--key-prefix", "IDEMPROXY_KEY_PREFIX", "STR", "idem:", "prefix of every store key", K_STR,
      CONFIG_RESTART, F(key_prefix), 0, NULL, false, false },
    { "--ttl", "IDEMPOTENCY_DEFAULT_TTL_SEC", "S", NULL,
      "seconds a completed response is kept, overridden by IDEMPROXY_TTL and --ttl", K_SECONDS,
      CONFIG_ROUTE, R(ttl_ms), 0, NULL, true, true },
    { "--ttl", "IDEMPROXY_TTL", "S", "86400", "seconds a completed response is kept", K_SECONDS,
      CONFIG_ROUTE, R(ttl_ms), 0, NULL, false, false },
    { "--max-ttl", "IDEMPROXY_MAX_TTL", "S", "604800", "cap on a TTL asked for by a request",
      K_SECONDS, CONFIG_ROUTE, R(max_ttl_ms), 0, NULL, false, false },
    { "--min-ttl", "IDEMPROXY_MIN_TTL", "S", "0", "floor of a TTL asked for by a request",
      K_SECONDS0, CONFIG_ROUTE, R(min_ttl_ms), 0, NULL, false, false },
    { "--ttl-header", "IDEMPROXY_TTL_HEADER", "NAME", "X-TTL",
      "request header asking for another TTL; \"\" disables", K_HEADER_OPT, CONFIG_ROUTE,
      R(ttl_header), 0, NULL, false, false },
    { "--lock-ttl", "IDEMPROXY_LOCK_TTL", "S", "30", "seconds a lock lives without a heartbeat",
      K_SECONDS, CONFIG_ROUTE, R(lock_ttl_ms), 0, NULL, false, false },
    { "--no-cache-status", "IDEMPROXY_NO_CACHE_STATUS", "LIST", "5xx,408,409,429",
      "statuses and classes (4xx, 5xx) not stored; \"\" stores every status", K_STATUS,
      CONFIG_ROUTE, R(no_cache), 0, NULL, false, false },
    { "--max-body", "IDEMPROXY_MAX_BODY", "BYTES", "1M",
      "largest body of a keyed request, read whole before the lock (413 above)", K_BYTES,
      CONFIG_ROUTE, R(max_body_bytes), 0, NULL, false, false },
    { "--max-passthrough-body", "IDEMPROXY_MAX_PASSTHROUGH_BODY", "BYTES", "0",
      "largest body of a request passed through, which streams to the upstream (413 above); 0: "
      "no limit",
      K_BYTES, CONFIG_ROUTE, R(max_passthrough_body_bytes), 0, NULL, false, false },
    { "--max-response", "IDEMPROXY_MAX_RESPONSE", "BYTES", "4M",
      "largest response stored for replay", K_BYTES, CONFIG_ROUTE, R(max_response_bytes), 0, NULL,
      false, false },
    { "--memory-max-bytes", "IDEMPROXY_MEMORY_MAX_BYTES", "BYTES", "256M",
      "budget of the memory store", K_BYTES, CONFIG_RESTART, F(memory_max_bytes), 0, NULL, false,
      false },
    { "--upstream-timeout", "IDEMPROXY_UPSTREAM_TIMEOUT", "S", "30",
      "bound on the wait for an answer's head (504 after) and each silence in its body (the "
      "answer cut after)",
      K_SECONDS, CONFIG_RESTART, F(upstream_timeout_ms), 0, NULL, false, false },
    { "--upstream-late-timeout", "IDEMPROXY_UPSTREAM_LATE_TIMEOUT", "S", "60",
      "after the 504 of --upstream-timeout, how long a keyed exchange may stay silent and go on: "
      "a late answer is still stored; 0: none",
      K_SECONDS0, CONFIG_RESTART, F(upstream_late_timeout_ms), 0, NULL, false, false },
    { "--upstream-client", "IDEMPROXY_UPSTREAM_CLIENT", "auto|curl", "auto",
      "auto: our own HTTP client for http://, libcurl for https://; curl: libcurl for both",
      K_CHOICE, CONFIG_RESTART, F(upstream_client), 0, upstream_client_names, false, false },
    { "--on-unknown-outcome", "IDEMPROXY_ON_UNKNOWN_OUTCOME", "refuse|retry", "refuse",
      "a request that may have run upstream without an answer (timeout, reset, a holder lost): "
      "its key answers 502 idempotency_outcome_unknown (refuse), or runs again (retry)",
      K_CHOICE, CONFIG_ROUTE, R(on_unknown), 0, on_unknown_names, false, false },
    { "--client-timeout", "IDEMPROXY_CLIENT_TIMEOUT", "S", "30",
      "a client idle this long, or this slow to send a header section, is disconnected", K_SECONDS,
      CONFIG_RESTART, F(client_timeout_ms), 0, NULL, false, false },
    { "--shutdown-timeout", "IDEMPROXY_SHUTDOWN_TIMEOUT", "S", "10",
      "on SIGTERM, how long running requests may finish", K_SECONDS, 0, F(shutdown_timeout_ms), 0,
      NULL, false, false },
    { "--store-timeout", "IDEMPROXY_STORE_TIMEOUT", "S", "1",
      "bound on one store call (then store_unavailable)", K_SECONDS, CONFIG_RESTART,
      F(store_timeout_ms), 0, NULL, false, false },
    { "--wait", "IDEMPROXY_WAIT", "S", "0",
      "hold a duplicate of a running request this long for its replay; 0 answers 409 at once",
      K_SECONDS0, CONFIG_ROUTE, R(wait_ms), 0, NULL, false, false },
    { "--on-store-error", "IDEMPROXY_ON_STORE_ERROR", "reject|passthrough", "reject",
      "when the store fails: answer 503, or proxy unprotected", K_CHOICE, 0, F(on_store_error), 0,
      on_store_error_names, false, false },
    { "--max-connections", "IDEMPROXY_MAX_CONNECTIONS", "N", "4096",
      "client connections served at once", K_COUNT, CONFIG_RESTART, F(max_connections), 0, NULL,
      false, false },
    { "--log-format", "IDEMPROXY_LOG_FORMAT", "json|text", "text", "log line format", K_CHOICE, 0,
      F(log_format), 0, log_format_names, false, false },
    { "--log-level", "IDEMPROXY_LOG_LEVEL", "error|warn|info|debug", "info",
      "most verbose level logged", K_CHOICE, 0, F(log_level), 0, log_level_names, false, false },
    { NULL, "IDEMPOTENCY_ENABLED", "BOOL", "true",
      "false turns enforcement off: every request is passed through", K_BOOL, CONFIG_RESTART,
      F(enabled), 0, NULL, true, false },
    { "--admin-token-file", "IDEMPROXY_ADMIN_TOKEN_FILE", "FILE", NULL,
      "/keys on the admin listener requires Authorization: Bearer <the file's first line>; "
      "none: /keys is served only on a loopback admin address",
      K_TOKEN_FILE, CONFIG_RESTART | CONFIG_SECRET, F(admin_token_file), F(admin_token), NULL,
      false, false },
    { "--config", "IDEMPROXY_CONFIG", "FILE", NULL,
      "YAML configuration file: any option above (spelled without the dashes), routes and key "
      "sources; flags and environment win over it; SIGHUP reads it again",
      K_FILE, CONFIG_RESTART, F(config_file), 0, NULL, false, false },
    { "--check-config", NULL, NULL, NULL,
      "validate the options, environment and configuration file, print each problem, and exit "
      "0 (valid) or 2",
      K_ACTION, 0, F(check_config), 0, NULL, false, false },
    { "--help", NULL, NULL, NULL, "print this help and exit (also -h)", K_ACTION, 0, F(show_help),
      0, NULL, false, false },
    { "--version", NULL, NULL, NULL, "print the version and exit", K_ACTION, 0, F(show_version), 0,
      NULL, false, false },
};

#undef F
#undef R

/* ---- fields ---- */

/* Where the field of <o> lies in <cfg>: in the process's part, or in its
 * route settings. */
static char *field_base(const struct opt *o, struct config *cfg)
{
    return o->traits & CONFIG_ROUTE ? (char *)&cfg->route : (char *)cfg;
}

static const char *cfield_base(const struct opt *o, const struct config *cfg)
{
    return o->traits & CONFIG_ROUTE ? (const char *)&cfg->route : (const char *)cfg;
}

/* The entries the loops over a configuration visit: each field once, and no
 * action (--help). */
static bool is_looped(const struct opt *o) { return !o->alias && o->kind != K_ACTION; }

/* Sets the field of <o>, in the struct at <base>, from <v>. <append> asks a
 * repeatable list to grow. */
static int opt_set(char *base, const struct opt *o, const char *v, bool append)
{
    void *field = base + o->off;
    size_t *count = (size_t *)(void *)(base + o->off2);

    switch (o->kind) {
    case K_ADDR:
        return config_parse_addr(v, field);
    case K_URL:
        return config_parse_upstream(field, v);
    case K_REDIS:
        return config_parse_redis_url(field, v);
    case K_STORE:
        return config_parse_store_url(field, v);
    case K_STR:
        return config_parse_string(field, v);
    case K_HEADER:
    case K_HEADER_OPT:
        return config_parse_header(field, v, o->kind == K_HEADER_OPT);
    case K_METHODS:
        return config_parse_list(field, count, v, false, true);
    case K_HEADERS:
        return config_parse_list(field, count, v, append, false);
    case K_BOOL:
        return config_parse_bool(v, field);
    case K_SECONDS:
        return config_parse_seconds(v, field);
    case K_SECONDS0:
        return config_parse_seconds0(v, field);
    case K_BYTES:
        return config_parse_bytes(v, field);
    case K_STATUS:
        return config_parse_status_list(v, field);
    case K_CHOICE:
        return config_parse_choice(o->choices, v, field);
    case K_COUNT:
    case K_COUNT0:
        return config_parse_count(v, o->kind == K_COUNT0, field);
    case K_ACTION:
        *(bool *)field = true;
        return 0;
    case K_TOKEN_FILE:
    case K_PASSWORD_FILE:
        return config_parse_secret_file(field, (char **)(void *)(base + o->off2), v,
                                        o->kind == K_TOKEN_FILE);
    case K_FILE:
        return config_parse_file(field, v);
    case K_HOSTNAME:
        return config_parse_hostname(field, v);
    }
    return -EINVAL;
}

/* The size of a field of kind <k>, for the kinds held by value. */
static size_t value_size(enum kind k)
{
    switch (k) {
    case K_ADDR:
        return sizeof(struct config_addr);
    case K_BOOL:
    case K_ACTION:
        return sizeof(bool);
    case K_SECONDS:
    case K_SECONDS0:
        return sizeof(uint64_t);
    case K_BYTES:
        return sizeof(size_t);
    case K_STATUS:
        return 600 * sizeof(bool);
    case K_CHOICE:
        return sizeof(int);
    case K_COUNT:
    case K_COUNT0:
        return sizeof(unsigned);
    default:
        return 0; /* a string or a list: owned pointers */
    }
}

static bool is_list(enum kind k) { return k == K_METHODS || k == K_HEADERS; }

static bool is_secret_file(enum kind k) { return k == K_TOKEN_FILE || k == K_PASSWORD_FILE; }

static char **string_at(char *base, size_t off) { return (char **)(void *)(base + off); }

static char *const *cstring_at(const char *base, size_t off)
{
    return (char *const *)(const void *)(base + off);
}

static size_t *count_at(char *base, size_t off) { return (size_t *)(void *)(base + off); }

static size_t ccount_at(const char *base, size_t off)
{
    return *(const size_t *)(const void *)(base + off);
}

static void free_secret(char **slot)
{
    if (*slot)
        explicit_bzero(*slot, strlen(*slot));
    free(*slot);
    *slot = NULL;
}

/* Frees what the field of <o> owns in the struct at <base>. */
static void field_done(const struct opt *o, char *base)
{
    if (value_size(o->kind))
        return;
    if (is_list(o->kind)) {
        config_parse_list_clear(string_at(base, o->off), count_at(base, o->off2));
        return;
    }
    free(*string_at(base, o->off));
    *string_at(base, o->off) = NULL;
    if (is_secret_file(o->kind))
        free_secret(string_at(base, o->off2));
}

static bool same_string(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* True when the field of <o> holds the same value in the structs at <a> and <b>. */
static bool field_same(const struct opt *o, const char *a, const char *b)
{
    size_t size = value_size(o->kind), n;

    if (o->kind == K_ADDR)
        return strcmp(((const struct config_addr *)(const void *)(a + o->off))->text,
                      ((const struct config_addr *)(const void *)(b + o->off))->text) == 0;
    if (size)
        return memcmp(a + o->off, b + o->off, size) == 0;
    if (is_list(o->kind)) {
        n = ccount_at(a, o->off2);
        if (n != ccount_at(b, o->off2))
            return false;
        for (size_t i = 0; i < n; i++) {
            if (!same_string(cstring_at(a, o->off)[i], cstring_at(b, o->off)[i]))
                return false;
        }
        return true;
    }
    return same_string(*cstring_at(a, o->off), *cstring_at(b, o->off)) &&
           (!is_secret_file(o->kind) ||
            same_string(*cstring_at(a, o->off2), *cstring_at(b, o->off2)));
}

static void swap_bytes(char *a, char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char t = a[i];

        a[i] = b[i];
        b[i] = t;
    }
}

/* Exchanges the values of the field of <o> between the structs at <a> and <b>. */
static void field_swap(const struct opt *o, char *a, char *b)
{
    size_t size = value_size(o->kind);

    if (size) {
        swap_bytes(a + o->off, b + o->off, size);
    } else if (is_list(o->kind)) {
        swap_bytes(a + o->off, b + o->off, CONFIG_MAX_LIST * sizeof(char *));
        swap_bytes(a + o->off2, b + o->off2, sizeof(size_t));
    } else {
        swap_bytes(a + o->off, b + o->off, sizeof(char *));
        if (is_secret_file(o->kind))
            swap_bytes(a + o->off2, b + o->off2, sizeof(char *));
    }
}

/* Makes the field of <o> at <dst> (a byte copy of <src>'s) a deep copy. The
 * caller has set every pointer of <dst> to NULL first, so that a failure
 * leaves nothing <src> owns in it. */
static int field_copy(const struct opt *o, char *dst, const char *src)
{
    size_t n = is_list(o->kind) ? ccount_at(src, o->off2) : 1;

    if (value_size(o->kind) || is_secret_file(o->kind))
        return 0; /* values are copied; secrets are not (a route never holds one) */
    for (size_t i = 0; i < n; i++) {
        const char *from = cstring_at(src, o->off)[i];

        if (from && !(string_at(dst, o->off)[i] = strdup(from)))
            return -ENOMEM;
    }
    return 0;
}

/* ---- error lines ---- */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* A value as it may appear in the one error line: no control bytes, not too long. */
static void quote_value(const char *v, char *out, size_t outlen)
{
    size_t i = 0, max = outlen > 4 ? outlen - 4 : 0;

    for (; *v && i < max; v++)
        out[i++] = ((unsigned char)*v < 0x20 || (unsigned char)*v == 0x7f) ? '?' : *v;
    if (*v) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
}

/* "--ttl", "IDEMPROXY_TTL (--ttl)" or "IDEMPOTENCY_ENABLED": where a value came from. */
static void source_name(const struct opt *o, bool from_env, char *out, size_t outlen)
{
    if (!from_env)
        snprintf(out, outlen, "%s", o->flag);
    else if (o->flag)
        snprintf(out, outlen, "%s (%s)", o->env, o->flag);
    else
        snprintf(out, outlen, "%s", o->env);
}

static void choices_text(const char *const *choices, char *out, size_t outlen)
{
    size_t used = (size_t)snprintf(out, outlen, "use");

    for (size_t i = 0; choices[i] && used < outlen; i++) {
        const char *sep = i == 0 ? " " : choices[i + 1] ? ", " : " or ";

        used += (size_t)snprintf(out + used, outlen - used, "%s%s", sep, choices[i]);
    }
}

/* <v> with the user info of a URL (what lies between "://" and the last '@'
 * before the path) as "***", so that an error line never shows a password. */
static void mask_userinfo(const char *v, char *out, size_t outlen)
{
    const char *start = strstr(v, "://"), *at, *end;

    snprintf(out, outlen, "%s", v);
    if (!start)
        return;
    start += 3;
    end = start + strcspn(start, "/?#");
    at = NULL;
    for (const char *p = start; p < end; p++) {
        if (*p == '@')
            at = p;
    }
    if (at)
        snprintf(out, outlen, "%.*s***%s", (int)(start - v), v, at);
}

/* Explains why <v> was refused for <o> (<r> from opt_set()), the line
 * starting with <src>: the flag, the variable, or the file's key. */
static void value_err(const struct opt *o, const char *src, const char *v, int r, char *err,
                      size_t errlen)
{
    char val[80], expect[640], masked[512];

    if (o->kind == K_URL) {
        mask_userinfo(v, masked, sizeof(masked));
        v = masked;
    }
    if (o->kind == K_REDIS || o->kind == K_STORE) {
        char why[200], forms[400];

        /* the parser says what is wrong, then what the forms are */
        config_store_url_why(v, o->kind == K_STORE, why, sizeof(why));
        store_registry_redact_url(v, masked, sizeof(masked));
        v = masked;
        if (o->kind == K_STORE)
            store_registry_forms(forms, sizeof(forms));
        snprintf(expect, sizeof(expect), "%s; %s", why,
                 o->kind == K_STORE ? forms : kind_info[o->kind].expect);
    }
    quote_value(v, val, sizeof(val));
    if (o->kind == K_CHOICE)
        choices_text(o->choices, expect, sizeof(expect));
    else if (o->kind != K_REDIS && o->kind != K_STORE)
        snprintf(expect, sizeof(expect), "%s", kind_info[o->kind].expect);
    if (r == -ENOMEM)
        set_err(err, errlen, "%s: out of memory", src);
    else if ((o->kind == K_TOKEN_FILE || o->kind == K_PASSWORD_FILE || o->kind == K_FILE) &&
             r != -EINVAL)
        set_err(err, errlen, "%s: cannot read '%s': %s", src, val, strerror(-r));
    else if (r == -E2BIG)
        set_err(err, errlen, "%s: too many entries (at most %d)", src, CONFIG_MAX_LIST);
    else
        set_err(err, errlen, "%s: '%s' is not %s (%s)", src, val, kind_info[o->kind].what, expect);
}

static int apply(struct config *cfg, const struct opt *o, bool from_env, const char *v, bool append,
                 char *err, size_t errlen)
{
    int r = opt_set(field_base(o, cfg), o, v, append);
    char src[128];

    if (r < 0) {
        source_name(o, from_env, src, sizeof(src));
        value_err(o, src, v, r, err, errlen);
        return r == -ENOMEM ? -ENOMEM : -EINVAL;
    }
    return 0;
}

static const struct opt *opt_find(const char *name, size_t n);

/* ---- names, and the nearest one to a misspelt name ---- */

enum name_form { NAME_FLAG, NAME_KEY, NAME_ENV };

/* The table's name nearest <s> (<len> bytes) in <form>: a flag, a file's
 * key (a flag without its dashes) or a variable; NULL when none is near.
 * The part every name shares ("--", "IDEMPROXY_") is left out of the
 * comparison, so that it does not make every short name look near. */
static const char *nearest_name(const char *s, size_t len, enum name_form form)
{
    const char *names[ARRAY_SIZE(opts)], *near;
    size_t skip = form == NAME_FLAG ? 2 : form == NAME_ENV ? 10 : 0;

    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        const struct opt *o = &opts[i];

        names[i] = NULL;
        if (form == NAME_ENV && o->env && strncmp(o->env, "IDEMPROXY_", 10) == 0)
            names[i] = o->env + skip;
        else if (form != NAME_ENV && o->flag && !o->env_only &&
                 (form == NAME_FLAG || o->kind != K_ACTION))
            names[i] = o->flag + 2;
    }
    if (len < skip)
        return NULL;
    near = config_nearest(s + skip, len - skip, names, ARRAY_SIZE(names));
    return near ? near - skip : NULL; /* back to the whole name */
}

size_t config_each_unknown_env(char *const envp[], config_env_fn *fn, void *ctx)
{
    size_t n = 0;

    for (size_t i = 0; envp && envp[i]; i++) {
        const char *e = envp[i], *eq = strchr(e, '=');
        size_t len = eq ? (size_t)(eq - e) : strlen(e);
        bool known = false;
        char name[128];

        if (strncmp(e, "IDEMPROXY_", 10) != 0 || len >= sizeof(name))
            continue;
        for (size_t j = 0; j < ARRAY_SIZE(opts) && !known; j++)
            known = opts[j].env && strlen(opts[j].env) == len && memcmp(opts[j].env, e, len) == 0;
        if (known)
            continue;
        memcpy(name, e, len);
        name[len] = '\0';
        fn(ctx, name, nearest_name(name, len, NAME_ENV));
        n++;
    }
    return n;
}

/* ---- the configuration file's view of the table ---- */

/* The entry a file's key <name> sets: a flag's, without its dashes; not the
 * actions, and not --config itself. */
static const struct opt *file_opt(const char *name)
{
    char flag[64];
    const struct opt *o;

    if (snprintf(flag, sizeof(flag), "--%s", name) >= (int)sizeof(flag))
        return NULL;
    o = opt_find(flag, strlen(flag));
    if (!o || o->kind == K_ACTION || strcmp(o->flag, "--config") == 0)
        return NULL;
    return o;
}

bool config_is_route_option(const char *name)
{
    const struct opt *o = file_opt(name);

    return o && (o->traits & CONFIG_ROUTE);
}

void config_route_option_names(char *out, size_t outlen)
{
    size_t used = 0;

    out[0] = '\0';
    for (size_t i = 0; i < ARRAY_SIZE(opts) && used < outlen; i++) {
        if ((opts[i].traits & CONFIG_ROUTE) && is_looped(&opts[i]))
            used += (size_t)snprintf(out + used, outlen - used, "%s%s", used ? ", " : "",
                                     opts[i].flag + 2);
    }
}

/* Sets <o>'s field in the struct at <base> from the file's value or list
 * under the key <name>; a problem's line starts with <name>. */
static int set_named(char *base, const struct opt *o, const char *name, const char *const *items,
                     size_t n, bool list, char *why, size_t whylen)
{
    char joined[4096];
    const char *v = items[0];
    size_t used = 0;
    int r;

    if (!list && n != 1) {
        set_err(why, whylen, "%s: needs a value", name);
        return -EINVAL;
    }
    if (list && o->kind != K_METHODS && o->kind != K_HEADERS && o->kind != K_STATUS) {
        set_err(why, whylen, "%s: takes one value, not a list", name);
        return -EINVAL;
    }
    /* A list is given to the comma-separated parser: an item may not hold a
     * comma of its own (no method, header name or status does). */
    joined[0] = '\0';
    for (size_t i = 0; list && i < n; i++) {
        size_t len = strlen(items[i]);

        if (strchr(items[i], ',') || len == 0 || used + len + 2 > sizeof(joined)) {
            char val[80];

            quote_value(items[i], val, sizeof(val));
            set_err(why, whylen, "%s: '%s' is not %s (%s)", name, val, kind_info[o->kind].what,
                    "one item per list entry");
            return -EINVAL;
        }
        if (i > 0)
            joined[used++] = ',';
        memcpy(joined + used, items[i], len + 1);
        used += len;
    }
    if (list)
        v = joined;
    r = opt_set(base, o, v, false);
    if (r < 0) {
        value_err(o, name, v, r, why, whylen);
        return r == -ENOMEM ? -ENOMEM : -EINVAL;
    }
    return 0;
}

int config_set_option(struct config *cfg, const char *name, const char *const *items, size_t n,
                      bool is_list, char *why, size_t whylen)
{
    const struct opt *o = file_opt(name);

    if (!o) {
        const char *near = nearest_name(name, strlen(name), NAME_KEY);

        if (near)
            set_err(why, whylen, "unknown key '%s' (did you mean %s?)", name, near);
        else
            set_err(why, whylen, "unknown key '%s'", name);
        return -ENOENT;
    }
    return set_named(field_base(o, cfg), o, name, items, n, is_list, why, whylen);
}

int config_set_route_option(struct route_settings *rs, const char *name, const char *const *items,
                            size_t n, bool is_list, char *why, size_t whylen)
{
    const struct opt *o = file_opt(name);

    if (!o || !(o->traits & CONFIG_ROUTE)) {
        set_err(why, whylen, "'%s' is not an option a route may set", name);
        return -ENOENT;
    }
    return set_named((char *)rs, o, name, items, n, is_list, why, whylen);
}

/* ---- loading ---- */

static const char *env_lookup(char *const envp[], const char *name)
{
    size_t n = strlen(name);

    for (size_t i = 0; envp && envp[i]; i++) {
        if (strncmp(envp[i], name, n) == 0 && envp[i][n] == '=')
            return envp[i] + n + 1;
    }
    return NULL;
}

/* The table entry of flag <name> (the first <n> bytes), NULL if none. */
static const struct opt *opt_find(const char *name, size_t n)
{
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        const struct opt *o = &opts[i];

        if (o->flag && !o->env_only && strlen(o->flag) == n && memcmp(o->flag, name, n) == 0)
            return o;
    }
    return NULL;
}

/* --help and --version win over everything else, bad values included, so a
 * broken environment can still print the help. Values are skipped, so that
 * "--key-prefix -h" is not mistaken for it. */
bool config_wants_action(struct config *cfg, int argc, char *const argv[])
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const struct opt *o;

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            cfg->show_help = true;
        else if (strcmp(a, "--version") == 0)
            cfg->show_version = true;
        else if (strncmp(a, "--", 2) == 0 && !strchr(a, '=') && (o = opt_find(a, strlen(a))) &&
                 o->arg && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
            i++; /* the same rule as load_flags() */
    }
    return cfg->show_help || cfg->show_version;
}

static int load_flags(struct config *cfg, int argc, char *const argv[], char *err, size_t errlen)
{
    bool seen[ARRAY_SIZE(opts)] = { false };

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *eq, *v;
        const struct opt *o;
        size_t n;
        int r;

        if (a[0] != '-' || strcmp(a, "--") == 0) {
            char val[80];

            quote_value(a, val, sizeof(val));
            set_err(err, errlen, "unexpected argument '%s' (options start with --, see --help)",
                    val);
            return -EINVAL;
        }
        eq = strchr(a, '=');
        n = eq ? (size_t)(eq - a) : strlen(a);
        o = strncmp(a, "--", 2) == 0 ? opt_find(a, n) : NULL;
        if (!o) {
            char val[80];

            const char *near = nearest_name(a, n, NAME_FLAG);

            quote_value(a, val, sizeof(val));
            if (eq)
                val[n < sizeof(val) - 1 ? n : sizeof(val) - 1] = '\0';
            set_err(err, errlen, "unknown option '%s' (%s%s%ssee --help)", val,
                    near ? "did you mean " : "", near ? near : "", near ? "? " : "");
            return -EINVAL;
        }
        if (eq) {
            v = eq + 1;
            if (o->kind == K_ACTION) {
                set_err(err, errlen, "%s: takes no value", o->flag);
                return -EINVAL;
            }
        } else if (!o->arg) {
            v = "true"; /* --require-key, --help */
        } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
            v = argv[++i];
        } else {
            char expect[400];

            if (o->kind == K_CHOICE)
                choices_text(o->choices, expect, sizeof(expect));
            else if (o->kind == K_STORE)
                store_registry_forms(expect, sizeof(expect));
            else
                snprintf(expect, sizeof(expect), "%s", kind_info[o->kind].expect);
            set_err(err, errlen, "%s: missing value (%s %s: %s)", o->flag, o->flag, o->arg, expect);
            return -EINVAL;
        }
        /* The first flag of a list replaces the environment's list; repeats append. */
        r = apply(cfg, o, false, v, seen[o - opts], err, errlen);
        if (r < 0)
            return r;
        seen[o - opts] = true;
    }
    return 0;
}

bool config_is_cacheable(const struct route_settings *rs, unsigned status)
{
    return status < ARRAY_SIZE(rs->no_cache) && !rs->no_cache[status];
}

bool config_is_enforced(const struct route_settings *rs, struct span method)
{
    for (size_t i = 0; i < rs->nmethods; i++) {
        if (strlen(rs->methods[i]) == method.len &&
            memcmp(rs->methods[i], method.base, method.len) == 0)
            return true;
    }
    return false;
}

/* ---- loops over the table ---- */

int config_route_copy(struct route_settings *dst, const struct route_settings *src)
{
    int r = 0;

    memcpy(dst, src, sizeof(*dst));
    /* Every pointer of <dst> is made its own (or NULL) before anything can
     * fail, so that config_route_done(<dst>) never frees what <src> owns. */
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        if ((opts[i].traits & CONFIG_ROUTE) && is_looped(&opts[i]) && !value_size(opts[i].kind))
            memset((char *)dst + opts[i].off, 0,
                   (is_list(opts[i].kind) ? CONFIG_MAX_LIST : 1) * sizeof(char *));
    }
    for (size_t i = 0; i < ARRAY_SIZE(opts) && r == 0; i++) {
        if ((opts[i].traits & CONFIG_ROUTE) && is_looped(&opts[i]))
            r = field_copy(&opts[i], (char *)dst, (const char *)src);
    }
    return r;
}

void config_route_done(struct route_settings *rs)
{
    if (!rs)
        return;
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        if ((opts[i].traits & CONFIG_ROUTE) && is_looped(&opts[i]))
            field_done(&opts[i], (char *)rs);
    }
}

void config_done(struct config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        if (!(opts[i].traits & CONFIG_ROUTE) && is_looped(&opts[i]))
            field_done(&opts[i], (char *)cfg);
    }
    config_route_done(&cfg->route);
}

/* The name of <o> in a diff: the file's key, or the variable of an option
 * that has no flag. */
static const char *diff_name(const struct opt *o) { return o->flag ? o->flag + 2 : o->env; }

size_t config_diff(const struct config *a, const struct config *b, config_diff_fn *fn, void *ctx)
{
    size_t n = 0;

    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        const struct opt *o = &opts[i];

        if (is_looped(o) && !field_same(o, cfield_base(o, a), cfield_base(o, b))) {
            n++;
            fn(ctx, diff_name(o), o->traits);
        }
    }
    return n;
}

void config_swap_reloadable(struct config *cfg, struct config *next)
{
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        const struct opt *o = &opts[i];

        if (is_looped(o) && !(o->traits & CONFIG_RESTART))
            field_swap(o, field_base(o, cfg), field_base(o, next));
    }
}

/* ---- loading ---- */

const char *config_find_file(int argc, char *const argv[], char *const envp[])
{
    const char *path = env_lookup(envp, "IDEMPROXY_CONFIG");

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        size_t n = eq ? (size_t)(eq - a) : strlen(a);
        const struct opt *o = strncmp(a, "--", 2) == 0 ? opt_find(a, n) : NULL;
        bool is_config = o && strcmp(o->flag, "--config") == 0;

        if (is_config && eq) {
            path = eq + 1;
            continue;
        }
        if (!o || !o->arg || eq || i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)
            continue;
        i++; /* the value, as load_flags() takes it */
        if (is_config)
            path = argv[i];
    }
    return path;
}

int config_init(struct config *cfg, char *err, size_t errlen)
{
    set_err(err, errlen, "%s", "");
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        if (opts[i].def) {
            int r = apply(cfg, &opts[i], false, opts[i].def, false, err, errlen);

            if (r < 0)
                return r;
        }
    }
    return 0;
}

int config_apply_args(struct config *cfg, int argc, char *const argv[], char *const envp[],
                      char *err, size_t errlen)
{
    int r;

    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        const char *v = opts[i].env ? env_lookup(envp, opts[i].env) : NULL;

        if (v && (r = apply(cfg, &opts[i], true, v, false, err, errlen)) < 0)
            return r;
    }
    r = load_flags(cfg, argc, argv, err, errlen);
    return r;
}

void config_print_help(FILE *f)
{
    fprintf(f, "Usage: idemproxy --upstream URL [options]\n"
               "       idemproxy --config FILE [options] [--check-config]\n\n"
               "An HTTP reverse proxy that enforces the Idempotency-Key header.\n"
               "Each option is also read from the environment variable shown, and from the "
               "--config\nfile (spelled without the dashes); a flag wins over the environment, "
               "which wins over\nthe file, which wins over the default. "
               "Lists in the environment are comma-separated.\n"
               "S is seconds (fractions allowed, e.g. 0.5); BYTES takes a K, M or G suffix.\n\n"
               "Options:\n");
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        const struct opt *o = &opts[i];

        if (o->env_only)
            continue;
        fprintf(f, "  %s%s%s\n      %s\n", o->flag, o->arg ? " " : "", o->arg ? o->arg : "",
                o->help);
        if (o->env || o->def) {
            fprintf(f, "      [");
            if (o->env)
                fprintf(f, "env %s%s", o->env, o->def ? ", " : "");
            if (o->def)
                fprintf(f, "default %s", o->def);
            fprintf(f, "]\n");
        }
    }
    fprintf(f, "\nEnvironment only:\n");
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        const struct opt *o = &opts[i];

        if (!o->env_only)
            continue;
        fprintf(f, "  %s=%s\n      %s\n", o->env, o->arg, o->help);
        if (o->def)
            fprintf(f, "      [default %s]\n", o->def);
    }
}
