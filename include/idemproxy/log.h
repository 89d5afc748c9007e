/* SPDX-License-Identifier: MIT */
/* Log lines, text or JSON, to stderr; the only writer to stderr. Thread-safe:
 * each line is written with one write(). */
#ifndef IDEMPROXY_LOG_H
#define IDEMPROXY_LOG_H

#include <pthread.h>

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
    size_t bytes;           /* response body bytes */
    const char *unknown;    /* the cause, when this request made its key's outcome unknown */
    const char *reason;     /* why it was refused (a problem the proxy answered itself), or NULL */
    const char *request_id; /* NULL: none */
    const char *client;     /* the client's address, NULL: unknown */
    const char *trace_id;   /* its trace's id in hex (doc/operations.md, Tracing), NULL: none */
};

/* Writes the access line of <a> at info level, its client fields (method,
 * target, key) and route escaped as log_write() escapes a message. Text:
 * "<time> info access <method> <target> <status> <outcome> route=<route>
 * key=<key> upstream_ms=<ms|-> total_ms=<ms> bytes=<n> unknown=<cause>
 * request_id=<id> trace_id=<hex> client=<address> reason="<why>"" (route=
 * left out when NULL, key= when absent, unknown=, request_id=, trace_id=,
 * client= and reason= unless they apply). JSON: {"time","level",
 * "msg":"access","method","target","status","outcome","route","key",
 * "upstream_ms","total_ms","bytes","unknown","request_id","trace_id",
 * "client","reason"} (each absent when it does not apply). The request id and the reason are
 * escaped as client bytes. Milliseconds have three decimals. */
void log_access(const struct log_access *a);

/* A failure that repeats across requests (the store down, the upstream
 * refusing) keeps the log readable: the first line of a kind is written; the
 * same kind again within LOG_BURST_MS is counted instead, and the count is
 * written at most once every LOG_BURST_MS, as "<subject> (<kind>): 211 more
 * in the last 10 s" (by log_burst_tick(), or by the next line once the
 * window is over). Another kind is written at once. Any thread. */
#define LOG_BURST_MS 10000u

struct log_burst {
    const char *subject; /* what is counted: "upstream failures" */
    pthread_mutex_t mu;
    uint64_t since_ms;      /* when the window began (monotonic); 0: quiet */
    unsigned more;          /* lines of <kind> counted, not written, in the window */
    char kind[240];         /* the kind of the last line written */
    struct log_burst *next; /* in the list log_burst_tick() walks, once admitted */
    bool listed;
};

#define LOG_BURST_INIT(subj)                                                                       \
    {                                                                                              \
        .subject = (subj), .mu = PTHREAD_MUTEX_INITIALIZER                                         \
    }

/* Whether the line of <kind> (compared as text) is to be written now: true,
 * or false when it was counted. A count left from an earlier window is
 * written first. log_burst_admit_at() takes the monotonic time (tests). */
bool log_burst_admit(struct log_burst *b, const char *kind);
bool log_burst_admit_at(struct log_burst *b, const char *kind, uint64_t now_ms);

/* Writes the counts of the windows that are over, and ends the windows that
 * counted nothing. Call about once a second (main does). */
void log_burst_tick(void);
void log_burst_tick_at(uint64_t now_ms);

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
