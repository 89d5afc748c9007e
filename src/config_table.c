/* SPDX-License-Identifier: MIT */
/* The table of options (doc/configuration.md): each one's flag, environment
 * variable, default, help, kind and field. config.c loops over it. */
#include "config_impl.h"

#include <stddef.h>

#include "idemproxy/log.h"

/* How a bad value of each kind is explained: "'<v>' is not <what> (<expect>)". */
const struct config_kind_info config_kind_info[] = {
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
    [K_SECONDS] = { "a positive number of seconds",
                    "e.g. 30, 0.5, or with a unit s, m, h or d: 7d" },
    [K_SECONDS0] = { "a number of seconds",
                     "0 or more, e.g. 0.5, or with a unit s, m, h or d: 7d" },
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
    [K_ENDPOINT] = { "a collector URL", "use http:// or https://, a host, an optional port and "
                                        "path, e.g. http://127.0.0.1:4318/v1/traces" },
    [K_RATIO] = { "a ratio", "use a number from 0 to 1, e.g. 0.1" },
    [K_TOKEN_FILE] = { "a token file", "its first line is the token: 1 to 4096 visible ASCII "
                                       "characters, no spaces" },
};

static const char *const on_store_error_names[] = { "reject", "passthrough", NULL };
static const char *const on_unknown_names[] = { "refuse", "retry", NULL };
static const char *const on_unverified_names[] = { "reject", "passthrough", NULL };
static const char *const upstream_client_names[] = { "auto", "curl", NULL };
static const char *const log_format_names[] = { "text", "json", NULL };
static const char *const log_level_names[] = { "error", "warn", "info", "debug", NULL };

/* K_CHOICE writes the index through an int. */
_Static_assert(sizeof(enum config_on_store_error) == sizeof(int), "enum size");
_Static_assert(sizeof(enum config_upstream_client) == sizeof(int), "enum size");
_Static_assert(sizeof(enum config_on_unknown) == sizeof(int), "enum size");
_Static_assert(sizeof(enum config_on_unverified) == sizeof(int), "enum size");
_Static_assert(sizeof(enum log_format) == sizeof(int), "enum size");
_Static_assert(sizeof(enum log_level) == sizeof(int), "enum size");

#define F(field) offsetof(struct config, field)
#define R(field) offsetof(struct route_settings, field)

/* Environment entries are read in this order, so IDEMPOTENCY_DEFAULT_TTL_SEC
 * comes before IDEMPROXY_TTL, which then overrides it. */
const struct opt config_opts[] = {
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
    { "--require-scope", "IDEMPROXY_REQUIRE_SCOPE", NULL, "false",
      "answer 401 idempotency_scope_missing to a keyed request without a principal (no "
      "scope header, token or trusted principal header)",
      K_BOOL, CONFIG_ROUTE, R(require_scope), 0, NULL, false, false },
    { "--on-unverified", "IDEMPROXY_ON_UNVERIFIED", "reject|passthrough", "reject",
      "a keyed request whose bearer token does not verify (scope: jwt in the file): answer 401 "
      "idempotency_scope_unverified, or proxy it unprotected",
      K_CHOICE, CONFIG_ROUTE, R(on_unverified), 0, on_unverified_names, false, false },
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
    { "--tombstone-ttl", "IDEMPROXY_TOMBSTONE_TTL", "S", "7d",
      "how long an expired key answers 410 idempotency_key_expired; 0 disables", K_SECONDS0,
      CONFIG_ROUTE, R(tombstone_ttl_ms), 0, NULL, false, false },
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
    { "--otlp-endpoint", "IDEMPROXY_OTLP_ENDPOINT", "URL", NULL,
      "export traces as OTLP/HTTP JSON to this collector, e.g. http://127.0.0.1:4318/v1/traces",
      K_ENDPOINT, CONFIG_RESTART, F(otlp_endpoint), 0, NULL, false, false },
    { "--trace-sample", "IDEMPROXY_TRACE_SAMPLE", "RATIO", "1.0",
      "the share of requests traced that come without a traceparent (one that has it decides)",
      K_RATIO, CONFIG_RESTART, F(trace_sample), 0, NULL, false, false },
    { "--trace-queue", "IDEMPROXY_TRACE_QUEUE", "N", "2048",
      "spans waiting for the exporter at most; past that they are dropped and counted", K_COUNT,
      CONFIG_RESTART, F(trace_queue), 0, NULL, false, false },
    { "--drain-delay", "IDEMPROXY_DRAIN_DELAY", "S", "0",
      "on SIGTERM, /readyz answers 503 at once while the listener accepts this long more",
      K_SECONDS0, 0, F(drain_delay_ms), 0, NULL, false, false },
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
