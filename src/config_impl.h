/* SPDX-License-Identifier: MIT */
/* What config.c and its table (config_table.c) share: the kinds of value an
 * option takes and the entry that describes one option. */
#ifndef IDEMPROXY_CONFIG_IMPL_H
#define IDEMPROXY_CONFIG_IMPL_H

#include "idemproxy/config.h"

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
    K_ENDPOINT,      /* char *, an http(s) URL of a collector (the upstream URL's form) */
    K_RATIO,         /* double, 0 to 1 */
};

/* How a bad value of each kind is explained: "'<v>' is not <what> (<expect>)". */
struct config_kind_info {
    const char *what;
    const char *expect;
};

extern const struct config_kind_info config_kind_info[];

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

/* Every option, in the order the environment is read (config_table.c). */
#define CONFIG_NOPTS 66 /* a table of another length does not compile */
extern const struct opt config_opts[CONFIG_NOPTS];

#endif
