/* SPDX-License-Identifier: MIT */
/* The option table of SPEC §3. One static table drives the defaults, the
 * environment, the flags and --help, so nothing is written twice. Runs once,
 * in main, before any thread starts. */
#include "idemproxy/config.h"

#include <ctype.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "idemproxy/config_file.h"
#include "idemproxy/http.h"
#include "idemproxy/redis_url.h"
#include "idemproxy/route.h"
#include "idemproxy/upstream.h"

#define SECONDS_MAX 1000000000ull /* about 31 years: anything longer is a typo */
#define COUNT_MAX 1000000u
#define WHY_MAX 256

enum kind {
    K_ADDR,          /* struct config_addr */
    K_URL,           /* char *, the upstream URL */
    K_REDIS,         /* char *, a Redis URL (redis_url.h); "" means none */
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
    K_PASSWORD_FILE, /* --redis-password-file: the path, and its first line in cfg->redis_password
                      */
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
    size_t off;                 /* the field in struct config */
    size_t off_n;               /* K_METHODS, K_HEADERS: the entry count */
    const char *const *choices; /* K_CHOICE, NULL-terminated, index = enum value */
    bool env_only;              /* no flag of its own: IDEMPOTENCY_* */
};

static const char *const on_store_error_names[] = { "reject", "passthrough", NULL };
static const char *const on_unknown_names[] = { "refuse", "retry", NULL };
static const char *const log_format_names[] = { "text", "json", NULL };
static const char *const log_level_names[] = { "error", "warn", "info", "debug", NULL };

/* K_CHOICE writes the index through an int. */
_Static_assert(sizeof(enum config_on_store_error) == sizeof(int), "enum size");
_Static_assert(sizeof(enum config_on_unknown) == sizeof(int), "enum size");
_Static_assert(sizeof(enum log_format) == sizeof(int), "enum size");
_Static_assert(sizeof(enum log_level) == sizeof(int), "enum size");

#define F(field) offsetof(struct config, field)

/* Environment entries are read in this order, so IDEMPOTENCY_DEFAULT_TTL_SEC
 * comes before IDEMPROXY_TTL, which then overrides it. */
static const struct opt opts[] = {
    { "--listen", "IDEMPROXY_LISTEN", "HOST:PORT", "127.0.0.1:8080",
      "address of the proxy (IPv6 as [::1]:8080)", K_ADDR, F(listen), 0, NULL, false },
    { "--upstream", "IDEMPROXY_UPSTREAM", "URL", NULL,
      "required: the API to protect, http:// or https:// (no user info, query or fragment); "
      "every request goes there, a path prefix before every target",
      K_URL, F(upstream), 0, NULL, false },
    { "--redis", "IDEMPROXY_REDIS_URL", "URL", NULL,
      "Redis store, redis://[[user]:password@]host[:port][/db], rediss:// for TLS, "
      "redis://h1:p1,h2:p2 for a cluster's seeds (a cluster is found by itself), or "
      "redis-sentinel://host[:port][,...]?master=NAME; none: in-process memory store",
      K_REDIS, F(redis_url), 0, NULL, false },
    { "--redis-password-file", "IDEMPROXY_REDIS_PASSWORD_FILE", "FILE", NULL,
      "Redis password: the file's first line, which beats one in the URL (and stays out of the "
      "process list)",
      K_PASSWORD_FILE, F(redis_password_file), 0, NULL, false },
    { "--redis-tls-ca-file", "IDEMPROXY_REDIS_TLS_CA_FILE", "FILE", NULL,
      "rediss://: the CAs that verify Redis's certificate; none: the system's CA store", K_FILE,
      F(redis_tls_ca_file), 0, NULL, false },
    { "--redis-tls-cert-file", "IDEMPROXY_REDIS_TLS_CERT_FILE", "FILE", NULL,
      "rediss://: a client certificate (PEM) for Redis servers that ask for one", K_FILE,
      F(redis_tls_cert_file), 0, NULL, false },
    { "--redis-tls-key-file", "IDEMPROXY_REDIS_TLS_KEY_FILE", "FILE", NULL,
      "rediss://: the client certificate's key (PEM)", K_FILE, F(redis_tls_key_file), 0, NULL,
      false },
    { "--redis-tls-server-name", "IDEMPROXY_REDIS_TLS_SERVER_NAME", "NAME", NULL,
      "rediss://: the name checked in Redis's certificate and sent as SNI; none: the URL's host",
      K_HOSTNAME, F(redis_tls_server_name), 0, NULL, false },
    { "--redis-tls-insecure", "IDEMPROXY_REDIS_TLS_INSECURE", NULL, "false",
      "rediss://: do not verify Redis's certificate (warned about at start; for tests only)",
      K_BOOL, F(redis_tls_insecure), 0, NULL, false },
    { "--redis-wait-replicas", "IDEMPROXY_REDIS_WAIT_REPLICAS", "N", "0",
      "after each write, wait (WAIT) for this many replicas to have it; a new key they do not "
      "confirm in time is refused (503); 0: do not wait",
      K_COUNT0, F(redis_wait_replicas), 0, NULL, false },
    { "--redis-wait-timeout", "IDEMPROXY_REDIS_WAIT_TIMEOUT", "S", "0.1",
      "how long --redis-wait-replicas waits for the replicas", K_SECONDS, F(redis_wait_timeout_ms),
      0, NULL, false },
    { "--admin-listen", "IDEMPROXY_ADMIN_LISTEN", "HOST:PORT", "127.0.0.1:9090",
      "address of /healthz, /readyz and /metrics", K_ADDR, F(admin_listen), 0, NULL, false },
    { "--methods", "IDEMPROXY_METHODS", "LIST", "POST,PUT,PATCH",
      "comma-separated methods that need idempotency", K_METHODS, F(methods), F(nmethods), NULL,
      false },
    { "--key-header", "IDEMPROXY_KEY_HEADER", "NAME", "Idempotency-Key",
      "request header carrying the key", K_HEADER, F(key_header), 0, NULL, false },
    { "--replay-header", "IDEMPROXY_REPLAY_HEADER", "NAME", "X-Idempotency-Replayed",
      "response header telling a replay (true) from an execution (false)", K_HEADER,
      F(replay_header), 0, NULL, false },
    { "--require-key", "IDEMPROXY_REQUIRE_KEY", NULL, "false",
      "answer 400 to an enforced request without a key", K_BOOL, F(require_key), 0, NULL, false },
    { "--scope-header", "IDEMPROXY_SCOPE_HEADER", "NAME", "Authorization",
      "header whose value scopes keys per client; repeatable (environment: comma-separated)",
      K_HEADERS, F(scope_headers), F(nscope_headers), NULL, false },
    { "--key-prefix", "IDEMPROXY_KEY_PREFIX", "STR", "idem:", "prefix of every store key", K_STR,
      F(key_prefix), 0, NULL, false },
    { "--ttl", "IDEMPOTENCY_DEFAULT_TTL_SEC", "S", NULL,
      "seconds a completed response is kept, overridden by IDEMPROXY_TTL and --ttl", K_SECONDS,
      F(ttl_ms), 0, NULL, true },
    { "--ttl", "IDEMPROXY_TTL", "S", "86400", "seconds a completed response is kept", K_SECONDS,
      F(ttl_ms), 0, NULL, false },
    { "--max-ttl", "IDEMPROXY_MAX_TTL", "S", "604800", "cap on a TTL asked for by a request",
      K_SECONDS, F(max_ttl_ms), 0, NULL, false },
    { "--ttl-header", "IDEMPROXY_TTL_HEADER", "NAME", "X-TTL",
      "request header asking for another TTL; \"\" disables", K_HEADER_OPT, F(ttl_header), 0, NULL,
      false },
    { "--lock-ttl", "IDEMPROXY_LOCK_TTL", "S", "30", "seconds a lock lives without a heartbeat",
      K_SECONDS, F(lock_ttl_ms), 0, NULL, false },
    { "--no-cache-status", "IDEMPROXY_NO_CACHE_STATUS", "LIST", "5xx,408,409,429",
      "statuses and classes (4xx, 5xx) not stored; \"\" stores every status", K_STATUS, F(no_cache),
      0, NULL, false },
    { "--max-body", "IDEMPROXY_MAX_BODY", "BYTES", "1M", "largest request body (413 above)",
      K_BYTES, F(max_body_bytes), 0, NULL, false },
    { "--max-response", "IDEMPROXY_MAX_RESPONSE", "BYTES", "4M",
      "largest response stored for replay", K_BYTES, F(max_response_bytes), 0, NULL, false },
    { "--memory-max-bytes", "IDEMPROXY_MEMORY_MAX_BYTES", "BYTES", "256M",
      "budget of the memory store", K_BYTES, F(memory_max_bytes), 0, NULL, false },
    { "--upstream-timeout", "IDEMPROXY_UPSTREAM_TIMEOUT", "S", "30",
      "bound on a whole upstream exchange (504 after)", K_SECONDS, F(upstream_timeout_ms), 0, NULL,
      false },
    { "--upstream-late-timeout", "IDEMPROXY_UPSTREAM_LATE_TIMEOUT", "S", "60",
      "after the 504 of --upstream-timeout, how much longer a keyed exchange may go on: a late "
      "answer is still stored; 0: none",
      K_SECONDS0, F(upstream_late_timeout_ms), 0, NULL, false },
    { "--on-unknown-outcome", "IDEMPROXY_ON_UNKNOWN_OUTCOME", "refuse|retry", "refuse",
      "a request that may have run upstream without an answer (timeout, reset, a holder lost): "
      "its key answers 502 idempotency_outcome_unknown (refuse), or runs again (retry)",
      K_CHOICE, F(on_unknown), 0, on_unknown_names, false },
    { "--client-timeout", "IDEMPROXY_CLIENT_TIMEOUT", "S", "30",
      "a client idle this long, or this slow to send a header section, is disconnected", K_SECONDS,
      F(client_timeout_ms), 0, NULL, false },
    { "--shutdown-timeout", "IDEMPROXY_SHUTDOWN_TIMEOUT", "S", "10",
      "on SIGTERM, how long running requests may finish", K_SECONDS, F(shutdown_timeout_ms), 0,
      NULL, false },
    { "--store-timeout", "IDEMPROXY_STORE_TIMEOUT", "S", "1",
      "bound on one store call (then store_unavailable)", K_SECONDS, F(store_timeout_ms), 0, NULL,
      false },
    { "--wait", "IDEMPROXY_WAIT", "S", "0",
      "hold a duplicate of a running request this long for its replay; 0 answers 409 at once",
      K_SECONDS0, F(wait_ms), 0, NULL, false },
    { "--on-store-error", "IDEMPROXY_ON_STORE_ERROR", "reject|passthrough", "reject",
      "when the store fails: answer 503, or proxy unprotected", K_CHOICE, F(on_store_error), 0,
      on_store_error_names, false },
    { "--max-connections", "IDEMPROXY_MAX_CONNECTIONS", "N", "4096",
      "client connections served at once", K_COUNT, F(max_connections), 0, NULL, false },
    { "--log-format", "IDEMPROXY_LOG_FORMAT", "json|text", "text", "log line format", K_CHOICE,
      F(log_format), 0, log_format_names, false },
    { "--log-level", "IDEMPROXY_LOG_LEVEL", "error|warn|info|debug", "info",
      "most verbose level logged", K_CHOICE, F(log_level), 0, log_level_names, false },
    { NULL, "IDEMPOTENCY_ENABLED", "BOOL", "true",
      "false turns enforcement off: every request is passed through", K_BOOL, F(enabled), 0, NULL,
      true },
    { "--admin-token-file", "IDEMPROXY_ADMIN_TOKEN_FILE", "FILE", NULL,
      "/keys on the admin listener requires Authorization: Bearer <the file's first line>; "
      "none: /keys is served only on a loopback admin address",
      K_TOKEN_FILE, F(admin_token_file), 0, NULL, false },
    { "--config", "IDEMPROXY_CONFIG", "FILE", NULL,
      "YAML configuration file: any option above (spelled without the dashes), routes and key "
      "sources; flags and environment win over it; SIGHUP reads it again",
      K_FILE, F(config_file), 0, NULL, false },
    { "--check-config", NULL, NULL, NULL,
      "validate the options, environment and configuration file, print each problem, and exit "
      "0 (valid) or 2",
      K_ACTION, F(check_config), 0, NULL, false },
    { "--help", NULL, NULL, NULL, "print this help and exit (also -h)", K_ACTION, F(show_help), 0,
      NULL, false },
    { "--version", NULL, NULL, NULL, "print the version and exit", K_ACTION, F(show_version), 0,
      NULL, false },
};

#undef F

/* ---- value parsers ---- */

int config_parse_bytes(const char *s, size_t *ret)
{
    size_t v = 0, mul = 1;
    const char *p = s;

    if (!s || *s < '0' || *s > '9')
        return -EINVAL; /* no sign, no space, not empty */
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (SIZE_MAX - (size_t)(*p - '0')) / 10)
            return -EINVAL;
        v = v * 10 + (size_t)(*p - '0');
    }
    switch (*p) {
    case '\0':
        break;
    case 'K':
    case 'k':
        mul = (size_t)1 << 10;
        break;
    case 'M':
    case 'm':
        mul = (size_t)1 << 20;
        break;
    case 'G':
    case 'g':
        mul = (size_t)1 << 30;
        break;
    default:
        return -EINVAL;
    }
    if (*p && p[1] != '\0')
        return -EINVAL;
    if (v > SIZE_MAX / mul)
        return -EINVAL;
    *ret = v * mul;
    return 0;
}

/* Decimal only: strtod() would also take "inf", "nan", "0x1p3" and "1e3". */
static int parse_seconds(const char *s, bool allow_zero, uint64_t *ret)
{
    uint64_t whole = 0, frac_ms = 0, ms;
    unsigned frac_digits = 0;
    bool digits = false, nonzero = false;
    const char *p = s;

    if (!s)
        return -EINVAL;
    for (; *p >= '0' && *p <= '9'; p++) {
        whole = whole * 10 + (uint64_t)(*p - '0');
        if (whole > SECONDS_MAX)
            return -EINVAL;
        digits = true;
        nonzero |= *p != '0';
    }
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++) {
            /* Keep four digits: three for milliseconds, one to round. */
            if (frac_digits < 4) {
                frac_ms = frac_ms * 10 + (uint64_t)(*p - '0');
                frac_digits++;
            }
            digits = true;
            nonzero |= *p != '0';
        }
    }
    if (!digits || *p != '\0')
        return -EINVAL;
    for (; frac_digits < 4; frac_digits++)
        frac_ms *= 10;
    ms = whole * 1000 + (frac_ms + 5) / 10;
    if (ms == 0 && nonzero)
        ms = 1; /* a positive value never becomes zero */
    if (ms == 0 && !allow_zero)
        return -EINVAL;
    *ret = ms;
    return 0;
}

int config_parse_seconds(const char *s, uint64_t *ret) { return parse_seconds(s, false, ret); }

int config_parse_bool(const char *s, bool *ret)
{
    static const char *const yes[] = { "true", "1", "yes", "on" };
    static const char *const no[] = { "false", "0", "no", "off" };

    if (!s)
        return -EINVAL;
    for (size_t i = 0; i < ARRAY_SIZE(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *ret = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *ret = false;
            return 0;
        }
    }
    return -EINVAL;
}

int config_parse_addr(const char *s, struct config_addr *ret)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct addrinfo *res = NULL;
    char host[sizeof(ret->text)];
    const char *colon, *port;
    size_t hostlen, len;
    unsigned long portnum = 0;
    int r;

    if (!s)
        return -EINVAL;
    len = strlen(s);
    if (len == 0 || len >= sizeof(ret->text))
        return -EINVAL;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');

        if (!close || close[1] != ':')
            return -EINVAL;
        hostlen = (size_t)(close - s - 1);
        memcpy(host, s + 1, hostlen);
        colon = close + 1;
        hints.ai_family = AF_INET6;
    } else {
        colon = strrchr(s, ':');
        if (!colon || memchr(s, ':', (size_t)(colon - s)))
            return -EINVAL; /* an IPv6 address needs brackets */
        hostlen = (size_t)(colon - s);
        memcpy(host, s, hostlen);
    }
    host[hostlen] = '\0';
    if (hostlen == 0)
        return -EINVAL;
    port = colon + 1;
    if (*port == '\0' || strlen(port) > 5)
        return -EINVAL;
    for (const char *p = port; *p; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        portnum = portnum * 10 + (unsigned long)(*p - '0');
    }
    if (portnum < 1 || portnum > 65535)
        return -EINVAL;

    /* Numeric first: an address literal never waits for a resolver. */
    hints.ai_flags |= AI_NUMERICHOST;
    r = getaddrinfo(host, port, &hints, &res);
    if (r == EAI_NONAME && s[0] != '[') {
        hints.ai_flags &= ~AI_NUMERICHOST;
        r = getaddrinfo(host, port, &hints, &res);
    }
    if (r != 0 || !res)
        return -EINVAL;
    if (res->ai_addrlen > sizeof(ret->sa)) {
        freeaddrinfo(res);
        return -EINVAL;
    }
    memset(ret, 0, sizeof(*ret));
    memcpy(ret->text, s, len + 1);
    memcpy(&ret->sa, res->ai_addr, res->ai_addrlen);
    ret->sa_len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

static bool is_space(char c) { return c == ' ' || c == '\t'; }

/* Trims blanks around s[0..n). */
static struct span trim(const char *s, size_t n)
{
    while (n > 0 && is_space(*s)) {
        s++;
        n--;
    }
    while (n > 0 && is_space(s[n - 1]))
        n--;
    return (struct span){ .base = s, .len = n };
}

int config_parse_status_list(const char *s, bool ret[600])
{
    bool set[600] = { false };
    const char *p = s;

    if (!s)
        return -EINVAL;
    if (trim(s, strlen(s)).len == 0)
        goto out; /* "": cache every status */
    for (;;) {
        const char *end = strchr(p, ',');
        struct span e = trim(p, end ? (size_t)(end - p) : strlen(p));

        if (e.len != 3 || e.base[0] < '1' || e.base[0] > '5')
            return -EINVAL;
        if ((e.base[1] == 'x' || e.base[1] == 'X') && (e.base[2] == 'x' || e.base[2] == 'X')) {
            int base = (e.base[0] - '0') * 100;

            for (int i = base; i < base + 100; i++)
                set[i] = true;
        } else if (e.base[1] >= '0' && e.base[1] <= '9' && e.base[2] >= '0' && e.base[2] <= '9') {
            set[(e.base[0] - '0') * 100 + (e.base[1] - '0') * 10 + (e.base[2] - '0')] = true;
        } else {
            return -EINVAL;
        }
        if (!end)
            break;
        p = end + 1;
    }
out:
    memcpy(ret, set, sizeof(set));
    return 0;
}

bool config_is_enforced(const struct config *cfg, struct span method)
{
    for (size_t i = 0; i < cfg->nmethods; i++) {
        if (strlen(cfg->methods[i]) == method.len &&
            memcmp(cfg->methods[i], method.base, method.len) == 0)
            return true;
    }
    return false;
}

static int parse_count(const char *s, bool zero_ok, unsigned *ret)
{
    unsigned long v = 0;

    if (!s || !*s)
        return -EINVAL;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        v = v * 10 + (unsigned long)(*p - '0');
        if (v > COUNT_MAX)
            return -EINVAL;
    }
    if (v == 0 && !zero_ok)
        return -EINVAL;
    *ret = (unsigned)v;
    return 0;
}

static int parse_choice(const char *const *choices, const char *s, int *ret)
{
    for (int i = 0; choices[i]; i++) {
        if (strcmp(s, choices[i]) == 0) {
            *ret = i;
            return 0;
        }
    }
    return -EINVAL;
}

/* ---- setters: each replaces the field's value ---- */

static int replace_string(char **slot, const char *v, size_t n)
{
    char *copy = strndup(v, n);

    if (!copy)
        return -ENOMEM;
    free(*slot);
    *slot = copy;
    return 0;
}

static bool has_ctl(const char *s)
{
    for (; *s; s++) {
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s == 0x7f)
            return true;
    }
    return false;
}

/* scheme://host[:port][/prefix], as the upstream module will read it (libcurl's
 * URL API), with no user info, query or fragment; one trailing '/' dropped. */
static int set_upstream(char **slot, const char *v)
{
    struct upstream_base base;
    size_t len = strlen(v);
    int r;

    /* No '?' or '#' at all (curl drops an empty query or fragment without a
     * word, and the URL is shown as given), and ASCII only. */
    if (has_ctl(v) || strpbrk(v, "?#"))
        return -EINVAL;
    for (const char *c = v; *c; c++) {
        if ((unsigned char)*c >= 0x80)
            return -EINVAL;
    }
    r = upstream_base_parse(v, &base); /* http or https only, as curl reads it */
    if (r < 0)
        return r;
    upstream_base_done(&base);
    if (v[len - 1] == '/')
        len--;
    return replace_string(slot, v, len);
}

#define TOKEN_MAX 4096

/* Reads the first line of the file <path> (its line end left out) as a
 * secret: into <secret_slot>, and the path into <path_slot>. A token
 * (<token>) has the whitespace around it cut and is 1 to TOKEN_MAX visible
 * ASCII characters; a password is 1 to TOKEN_MAX bytes with no control
 * character. Nothing changes on failure. */
static int set_secret_file(char **path_slot, char **secret_slot, const char *path, bool token)
{
    char buf[TOKEN_MAX + 2], *secret;
    struct span t;
    size_t n;
    FILE *f;
    int r;

    f = fopen(path, "re");
    if (!f)
        return -errno;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    r = ferror(f) ? -EIO : 0;
    fclose(f);
    if (r < 0)
        return r;
    t = (struct span){ .base = buf, .len = 0 };
    while (t.len < n && buf[t.len] != '\r' && buf[t.len] != '\n')
        t.len++; /* a NUL stays in: it is refused below, not a silent end */
    while (token && t.len > 0 && (t.base[0] == ' ' || t.base[0] == '\t')) {
        t.base++;
        t.len--;
    }
    while (token && t.len > 0 && (t.base[t.len - 1] == ' ' || t.base[t.len - 1] == '\t'))
        t.len--;
    r = t.len == 0 || t.len > TOKEN_MAX ? -EINVAL : 0;
    for (size_t i = 0; r == 0 && i < t.len; i++) {
        unsigned char c = (unsigned char)t.base[i];

        if (token ? c < 0x21 || c > 0x7e : c < 0x20 || c == 0x7f)
            r = -EINVAL;
    }
    if (r == 0) {
        secret = strndup(t.base, t.len);
        r = secret ? replace_string(path_slot, path, strlen(path)) : -ENOMEM;
        if (r == 0) {
            if (*secret_slot)
                explicit_bzero(*secret_slot, strlen(*secret_slot));
            free(*secret_slot);
            *secret_slot = secret;
        } else if (secret) {
            explicit_bzero(secret, t.len);
            free(secret);
        }
    }
    explicit_bzero(buf, sizeof(buf));
    return r;
}

static int set_redis(char **slot, const char *v)
{
    struct redis_url u;
    int err;

    if (*v == '\0') {
        free(*slot); /* "" asks for no Redis, as if unset */
        *slot = NULL;
        return 0;
    }
    err = redis_url_parse(v, &u, NULL, 0);
    if (err < 0)
        return err;
    redis_url_done(&u);
    return replace_string(slot, v, strlen(v));
}

/* A path this process can read, kept as given. */
static int set_file(char **slot, const char *path)
{
    if (!*path || has_ctl(path))
        return -EINVAL;
    if (access(path, R_OK) < 0)
        return -errno;
    return replace_string(slot, path, strlen(path));
}

static int set_hostname(char **slot, const char *v)
{
    size_t n = strlen(v);

    if (n == 0 || n > 253)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!isalnum((unsigned char)v[i]) && !strchr("-._:", v[i]))
            return -EINVAL;
    }
    return replace_string(slot, v, n);
}

static void list_clear(char **list, size_t *n)
{
    for (size_t i = 0; i < *n; i++) {
        free(list[i]);
        list[i] = NULL;
    }
    *n = 0;
}

/* Parses the comma-separated tokens of <v> and replaces the list with them,
 * or appends them when <append>; <upper> (methods) upper-cases them and
 * refuses an empty list, which other lists (scope headers) take as none.
 * Nothing changes on failure. -E2BIG past CONFIG_MAX_LIST entries. */
static int list_set(char **list, size_t *n, const char *v, bool append, bool upper)
{
    char *items[CONFIG_MAX_LIST] = { NULL };
    size_t count = 0, base = append ? *n : 0;
    const char *p = v;
    int r;

    if (trim(v, strlen(v)).len == 0 && !upper) {
        if (!append)
            list_clear(list, n); /* scope headers "": none, every client in one scope */
        return 0;
    }
    for (;;) {
        const char *end = strchr(p, ',');
        struct span e = trim(p, end ? (size_t)(end - p) : strlen(p));

        if (!http_is_token(e)) {
            r = -EINVAL;
            goto fail;
        }
        if (base + count == CONFIG_MAX_LIST) {
            r = -E2BIG;
            goto fail;
        }
        items[count] = strndup(e.base, e.len);
        if (!items[count]) {
            r = -ENOMEM;
            goto fail;
        }
        if (upper) {
            for (char *c = items[count]; *c; c++) {
                if (*c >= 'a' && *c <= 'z')
                    *c = (char)(*c - 'a' + 'A');
            }
        }
        count++;
        if (!end)
            break;
        p = end + 1;
    }
    if (!append)
        list_clear(list, n);
    memcpy(list + *n, items, count * sizeof(items[0]));
    *n += count;
    return 0;

fail:
    for (size_t i = 0; i < count; i++)
        free(items[i]);
    return r;
}

/* Sets the field of <o> from <v>. <append> asks a repeatable list to grow. */
static int opt_set(struct config *cfg, const struct opt *o, const char *v, bool append)
{
    void *field = (char *)cfg + o->off;
    size_t *count = (size_t *)(void *)((char *)cfg + o->off_n);

    switch (o->kind) {
    case K_ADDR:
        return config_parse_addr(v, field);
    case K_URL:
        return set_upstream(field, v);
    case K_REDIS:
        return set_redis(field, v);
    case K_STR:
        return replace_string(field, v, strlen(v));
    case K_HEADER:
        if (!http_is_token(span_from_cstr(v)))
            return -EINVAL;
        return replace_string(field, v, strlen(v));
    case K_HEADER_OPT:
        if (*v && !http_is_token(span_from_cstr(v)))
            return -EINVAL;
        return replace_string(field, v, strlen(v));
    case K_METHODS:
        return list_set(field, count, v, false, true);
    case K_HEADERS:
        return list_set(field, count, v, append, false);
    case K_BOOL:
        return config_parse_bool(v, field);
    case K_SECONDS:
        return parse_seconds(v, false, field);
    case K_SECONDS0:
        return parse_seconds(v, true, field);
    case K_BYTES:
        return config_parse_bytes(v, field);
    case K_STATUS:
        return config_parse_status_list(v, field);
    case K_CHOICE:
        return parse_choice(o->choices, v, field);
    case K_COUNT:
        return parse_count(v, false, field);
    case K_COUNT0:
        return parse_count(v, true, field);
    case K_ACTION:
        *(bool *)field = true;
        return 0;
    case K_TOKEN_FILE:
        return set_secret_file(&cfg->admin_token_file, &cfg->admin_token, v, true);
    case K_PASSWORD_FILE:
        return set_secret_file(&cfg->redis_password_file, &cfg->redis_password, v, false);
    case K_FILE:
        return set_file(field, v);
    case K_HOSTNAME:
        return set_hostname(field, v);
    }
    return -EINVAL;
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
    char val[80], expect[256], masked[512];
    struct redis_url u;

    if (o->kind == K_URL) {
        mask_userinfo(v, masked, sizeof(masked));
        v = masked;
    }
    if (o->kind == K_REDIS) {
        char why[200];

        /* the parser says what is wrong, then what the forms are */
        if (redis_url_parse(v, &u, why, sizeof(why)) == 0)
            redis_url_done(&u);
        redis_url_redact(v, masked, sizeof(masked));
        v = masked;
        snprintf(expect, sizeof(expect), "%s; %s", why, kind_info[o->kind].expect);
    }
    quote_value(v, val, sizeof(val));
    if (o->kind == K_CHOICE)
        choices_text(o->choices, expect, sizeof(expect));
    else if (o->kind != K_REDIS)
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
    int r = opt_set(cfg, o, v, append);
    char src[128];

    if (r < 0) {
        source_name(o, from_env, src, sizeof(src));
        value_err(o, src, v, r, err, errlen);
        return r == -ENOMEM ? -ENOMEM : -EINVAL;
    }
    return 0;
}

static const struct opt *opt_find(const char *name, size_t n);

/* apply(), the error line starting with the file's key <name>. */
static int apply_named(struct config *cfg, const struct opt *o, const char *name, const char *v,
                       char *err, size_t errlen)
{
    int r = opt_set(cfg, o, v, false);

    if (r < 0) {
        value_err(o, name, v, r, err, errlen);
        return r == -ENOMEM ? -ENOMEM : -EINVAL;
    }
    return 0;
}

/* ---- the configuration file's view of the table ---- */

static const char *const route_options[] = {
    "methods",
    "require-key",
    "scope-header",
    "ttl",
    "max-ttl",
    "ttl-header",
    "lock-ttl",
    "wait",
    "no-cache-status",
    "max-body",
    "max-response",
    "replay-header",
    "on-unknown-outcome",
};

bool config_is_route_option(const char *name)
{
    for (size_t i = 0; i < ARRAY_SIZE(route_options); i++) {
        if (strcmp(name, route_options[i]) == 0)
            return true;
    }
    return false;
}

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

int config_set_option(struct config *cfg, const char *name, const char *const *items, size_t n,
                      bool is_list, char *why, size_t whylen)
{
    const struct opt *o = file_opt(name);
    char joined[4096];
    size_t used = 0;

    if (!o) {
        set_err(why, whylen, "unknown key '%s'", name);
        return -ENOENT;
    }
    if (!is_list) {
        if (n != 1) {
            set_err(why, whylen, "%s: needs a value", name);
            return -EINVAL;
        }
        return apply_named(cfg, o, name, items[0], why, whylen);
    }
    if (o->kind != K_METHODS && o->kind != K_HEADERS && o->kind != K_STATUS) {
        set_err(why, whylen, "%s: takes one value, not a list", name);
        return -EINVAL;
    }
    /* The list is given to the comma-separated parser: an item may not hold a
     * comma of its own (no method, header name or status does). */
    joined[0] = '\0';
    for (size_t i = 0; i < n; i++) {
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
    return apply_named(cfg, o, name, joined, why, whylen);
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
static bool scan_actions(struct config *cfg, int argc, char *const argv[])
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

            quote_value(a, val, sizeof(val));
            if (eq)
                val[n < sizeof(val) - 1 ? n : sizeof(val) - 1] = '\0';
            set_err(err, errlen, "unknown option '%s' (see --help)", val);
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
            char expect[128];

            if (o->kind == K_CHOICE)
                choices_text(o->choices, expect, sizeof(expect));
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

static void format_secs(uint64_t ms, char *out, size_t outlen)
{
    if (ms % 1000 == 0)
        snprintf(out, outlen, "%" PRIu64 " s", ms / 1000);
    else
        snprintf(out, outlen, "%" PRIu64 ".%03" PRIu64 " s", ms / 1000, ms % 1000);
}

static void format_bytes(size_t n, char *out, size_t outlen)
{
    if (n >= (1u << 20) && n % (1u << 20) == 0)
        snprintf(out, outlen, "%zu MiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0)
        snprintf(out, outlen, "%zu KiB", n >> 10);
    else
        snprintf(out, outlen, "%zu bytes", n);
}

/* The memory store must hold at least two responses of the largest size it
 * stores, or a request could be executed and then have nowhere to go. */
static int check_memory_budget(const struct config *cfg, char *err, size_t errlen)
{
    char have[32], resp[32];

    if (cfg->redis_url || !cfg->enabled || cfg->memory_max_bytes / 2 >= cfg->max_response_bytes)
        return 0;
    format_bytes(cfg->memory_max_bytes, have, sizeof(have));
    format_bytes(cfg->max_response_bytes, resp, sizeof(resp));
    set_err(err, errlen,
            "--memory-max-bytes: %s cannot hold two responses of --max-response (%s); raise it "
            "or lower --max-response",
            have, resp);
    return -EINVAL;
}

/* TLS options without a TLS URL would be ignored: a user who gives them
 * expects TLS, so that is an error; so is half a client certificate. */
static int check_redis_tls(const struct config *cfg, char *err, size_t errlen)
{
    static const struct {
        const char *flag;
        size_t off;
    } tls_opts[] = {
        { "--redis-tls-ca-file", offsetof(struct config, redis_tls_ca_file) },
        { "--redis-tls-cert-file", offsetof(struct config, redis_tls_cert_file) },
        { "--redis-tls-key-file", offsetof(struct config, redis_tls_key_file) },
        { "--redis-tls-server-name", offsetof(struct config, redis_tls_server_name) },
    };
    struct redis_url u;
    bool tls = false;

    if (cfg->redis_url && redis_url_parse(cfg->redis_url, &u, NULL, 0) == 0) {
        tls = u.tls;
        redis_url_done(&u);
    }
    for (size_t i = 0; i < ARRAY_SIZE(tls_opts); i++) {
        if (!tls && *(char *const *)(const void *)((const char *)cfg + tls_opts[i].off)) {
            set_err(err, errlen, "%s: needs a rediss:// or rediss-sentinel:// --redis URL",
                    tls_opts[i].flag);
            return -EINVAL;
        }
    }
    if (!tls && cfg->redis_tls_insecure) {
        set_err(err, errlen,
                "--redis-tls-insecure: needs a rediss:// or rediss-sentinel:// "
                "--redis URL");
        return -EINVAL;
    }
    if (!cfg->redis_tls_cert_file != !cfg->redis_tls_key_file) {
        set_err(err, errlen,
                "%s: a client certificate needs both --redis-tls-cert-file and "
                "--redis-tls-key-file",
                cfg->redis_tls_cert_file ? "--redis-tls-cert-file" : "--redis-tls-key-file");
        return -EINVAL;
    }
    return 0;
}

/* WAIT is Redis's: without a Redis URL the option would be ignored. A
 * WAIT holds its connection, and the ops behind it, for up to its timeout,
 * so that timeout must leave room inside --store-timeout. */
static int check_redis_wait(const struct config *cfg, char *err, size_t errlen)
{
    char wait[32], store[32];

    if (cfg->redis_wait_replicas == 0)
        return 0;
    if (!cfg->redis_url) {
        set_err(err, errlen, "--redis-wait-replicas: needs a --redis URL (the memory store has "
                             "no replicas)");
        return -EINVAL;
    }
    if (cfg->redis_wait_timeout_ms >= cfg->store_timeout_ms) {
        format_secs(cfg->redis_wait_timeout_ms, wait, sizeof(wait));
        format_secs(cfg->store_timeout_ms, store, sizeof(store));
        set_err(err, errlen,
                "--redis-wait-timeout: %s must be shorter than --store-timeout (%s): the ops "
                "behind a WAIT wait for it",
                wait, store);
        return -EINVAL;
    }
    return 0;
}

static int check(const struct config *cfg, char *err, size_t errlen)
{
    int r;

    if (!cfg->upstream) {
        set_err(err, errlen,
                "--upstream: required (the URL of the API to protect, e.g. "
                "--upstream http://127.0.0.1:3000)");
        return -EINVAL;
    }
    r = config_check_route(cfg, err, errlen);
    if (r == 0)
        r = check_redis_tls(cfg, err, errlen);
    if (r == 0)
        r = check_redis_wait(cfg, err, errlen);
    return r;
}

int config_check_route(const struct config *cfg, char *why, size_t whylen)
{
    if (cfg->ttl_ms > cfg->max_ttl_ms) {
        char ttl[32], max[32];

        format_secs(cfg->ttl_ms, ttl, sizeof(ttl));
        format_secs(cfg->max_ttl_ms, max, sizeof(max));
        set_err(why, whylen, "--ttl: %s is above --max-ttl (%s)", ttl, max);
        return -EINVAL;
    }
    return check_memory_budget(cfg, why, whylen);
}

/* ---- copies ---- */

static int copy_string(char **dst, const char *src)
{
    *dst = NULL;
    if (src && !(*dst = strdup(src)))
        return -ENOMEM;
    return 0;
}

/* True when the field of kind <k> is one string the config owns. */
static bool owns_string(enum kind k)
{
    switch (k) {
    case K_URL:
    case K_REDIS:
    case K_STR:
    case K_HEADER:
    case K_HEADER_OPT:
    case K_FILE:
    case K_HOSTNAME:
    case K_TOKEN_FILE:
    case K_PASSWORD_FILE:
        return true;
    default:
        return false;
    }
}

int config_copy(struct config *dst, const struct config *src)
{
    int r = 0;

    memcpy(dst, src, sizeof(*dst));
    dst->redis_password = NULL;
    dst->admin_token = NULL;
    dst->routes = NULL;
    /* Every pointer of <dst> is made its own (or NULL) before anything can
     * fail, so that config_done(<dst>) never frees what <src> owns. */
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        char **field = (char **)(void *)((char *)dst + opts[i].off);

        if (owns_string(opts[i].kind))
            *field = NULL;
        else if (opts[i].kind == K_METHODS || opts[i].kind == K_HEADERS)
            memset(field, 0, CONFIG_MAX_LIST * sizeof(char *));
    }
    for (size_t i = 0; i < ARRAY_SIZE(opts) && r == 0; i++) {
        const struct opt *o = &opts[i];
        char **field = (char **)(void *)((char *)dst + o->off);
        char *const *from = (char *const *)(const void *)((const char *)src + o->off);
        size_t n;

        if (o->env_only)
            continue; /* the same field as its flag's entry */
        if (owns_string(o->kind)) {
            r = copy_string(field, *from);
        } else if (o->kind == K_METHODS || o->kind == K_HEADERS) {
            n = *(const size_t *)(const void *)((const char *)src + o->off_n);
            for (size_t k = 0; k < n && r == 0; k++)
                r = copy_string(&field[k], from[k]);
        }
    }
    return r;
}

/* The file --config names (its last value, as load_flags() reads flags),
 * else IDEMPROXY_CONFIG's; NULL: none. Read before the environment and the
 * flags, which are applied over the file. */
static const char *config_path(int argc, char *const argv[], char *const envp[])
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

int config_load(struct config *cfg, int argc, char *const argv[], char *const envp[], char *err,
                size_t errlen)
{
    struct config_file *file = NULL;
    const char *path;
    int r;

    set_err(err, errlen, "%s", "");
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        if (opts[i].def) {
            r = apply(cfg, &opts[i], false, opts[i].def, false, err, errlen);
            if (r < 0)
                return r;
        }
    }
    if (scan_actions(cfg, argc, argv))
        return 0;
    path = config_path(argc, argv, envp);
    if (path) {
        r = config_file_read(path, &file, err, errlen);
        if (r == 0)
            r = config_file_apply(file, cfg, err, errlen);
        if (r == -EINVAL && file) {
            struct route_table *t = NULL;

            /* Every problem of the file at once: its routes' too. */
            if (config_file_routes(file, cfg, &t, err, errlen) == 0)
                route_table_unref(t);
        }
        if (r < 0)
            goto out;
    }
    for (size_t i = 0; i < ARRAY_SIZE(opts); i++) {
        const char *v = opts[i].env ? env_lookup(envp, opts[i].env) : NULL;

        if (v) {
            r = apply(cfg, &opts[i], true, v, false, err, errlen);
            if (r < 0)
                goto out;
        }
    }
    r = load_flags(cfg, argc, argv, err, errlen);
    if (r == 0)
        r = check(cfg, err, errlen);
    if (r == 0)
        r = config_file_routes(file, cfg, &cfg->routes, err, errlen);
out:
    config_file_free(file);
    return r;
}

void config_done(struct config *cfg)
{
    if (!cfg)
        return;
    free(cfg->upstream);
    cfg->upstream = NULL;
    free(cfg->redis_url);
    cfg->redis_url = NULL;
    free(cfg->key_header);
    cfg->key_header = NULL;
    free(cfg->replay_header);
    cfg->replay_header = NULL;
    free(cfg->key_prefix);
    cfg->key_prefix = NULL;
    free(cfg->ttl_header);
    cfg->ttl_header = NULL;
    free(cfg->admin_token_file);
    cfg->admin_token_file = NULL;
    free(cfg->redis_password_file);
    cfg->redis_password_file = NULL;
    if (cfg->redis_password)
        explicit_bzero(cfg->redis_password, strlen(cfg->redis_password));
    free(cfg->redis_password);
    cfg->redis_password = NULL;
    free(cfg->redis_tls_ca_file);
    cfg->redis_tls_ca_file = NULL;
    free(cfg->redis_tls_cert_file);
    cfg->redis_tls_cert_file = NULL;
    free(cfg->redis_tls_key_file);
    cfg->redis_tls_key_file = NULL;
    free(cfg->redis_tls_server_name);
    cfg->redis_tls_server_name = NULL;
    if (cfg->admin_token)
        explicit_bzero(cfg->admin_token, strlen(cfg->admin_token));
    free(cfg->admin_token);
    cfg->admin_token = NULL;
    list_clear(cfg->methods, &cfg->nmethods);
    list_clear(cfg->scope_headers, &cfg->nscope_headers);
    free(cfg->config_file);
    cfg->config_file = NULL;
    route_table_unref(cfg->routes);
    cfg->routes = NULL;
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
