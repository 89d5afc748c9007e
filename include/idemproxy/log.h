/* SPDX-License-Identifier: MIT */
/* Log lines, text or JSON, to stderr; the only writer to stderr. Thread-safe:
 * each line is written with one write(). */
#ifndef IDEMPROXY_LOG_H
#define IDEMPROXY_LOG_H

#include "idemproxy/common.h"

enum log_level {
    LOG_LEVEL_ERROR,
    LOG_LEVEL_WARN,
    LOG_LEVEL_INFO,
    LOG_LEVEL_DEBUG,
};

enum log_format {
    LOG_FORMAT_TEXT,
    LOG_FORMAT_JSON,
};

/* Sets the format and the most verbose level written. Call once, before threads start. */
void log_setup(enum log_level level, enum log_format format);

/* True when a message at <level> would be written. */
bool log_enabled(enum log_level level);

/* Writes one line: time, level, message (in JSON: {"time","level","msg"}).
 * A message may quote what a client sent: in text, every byte outside
 * printable ASCII becomes \xHH and '"' and '\' get a backslash, so a line
 * stays one line; in JSON, bytes that are not UTF-8 (and NUL) become the text
 * \xHH, so every line is valid JSON. */
void log_write(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One access line: what a request was and how it was answered. Spans are
 * borrowed for the call. Only these fields exist, so no other header of the
 * request (Authorization, --scope-header values) can reach the log. */
struct log_access {
    struct span method;
    struct span target;
    struct span key; /* the Idempotency-Key as sent; base NULL when absent */
    unsigned status; /* 0: no answer was sent (out of memory) */
    const char *outcome;
    const char *route; /* the route's name; NULL: left out */
    bool has_upstream; /* the request was forwarded: <upstream_us> is meaningful */
    uint64_t upstream_us;
    uint64_t total_us;
    size_t bytes;        /* response body bytes */
    const char *unknown; /* the cause, when this request made its key's outcome unknown */
};

/* Writes the access line of <a> at info level, its client fields (method,
 * target, key) and route escaped as log_write() escapes a message. Text:
 * "<time> info access <method> <target> <status> <outcome> route=<route>
 * key=<key> upstream_ms=<ms|-> total_ms=<ms> bytes=<n> unknown=<cause>"
 * (route= left out when NULL, key= when absent, unknown= unless it applies).
 * JSON: {"time","level","msg":"access","method","target","status","outcome",
 * "route","key","upstream_ms","total_ms","bytes","unknown"} ("route", "key",
 * "upstream_ms" and "unknown" absent when they do not apply).
 * Milliseconds have three decimals. */
void log_access(const struct log_access *a);

/* The level is tested before the arguments are formatted. */
#define LOG(level, ...)                                                                            \
    do {                                                                                           \
        if (log_enabled(level))                                                                    \
            log_write(level, __VA_ARGS__);                                                         \
    } while (0)

#define log_error(...) LOG(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warn(...) LOG(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...) LOG(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) LOG(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
