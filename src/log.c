/* SPDX-License-Identifier: MIT */
/* Log lines to stderr, text or JSON. Any thread may log: each line is built on
 * the caller's stack and written with one write(2), so lines never interleave
 * and no lock is taken. */
#include "idemproxy/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#define LOG_MSG_MAX 2048                     /* longer messages are cut and end with "..." */
#define LOG_LINE_MAX (LOG_MSG_MAX * 6 + 128) /* JSON escapes a byte into at most \u00XX */

/* Set once before threads start; atomics keep a late log_setup() well defined. */
static _Atomic int log_level = CONFIG_LOG_INFO;
static _Atomic int log_format = CONFIG_LOG_TEXT;

static const char *const level_names[] = {
    [CONFIG_LOG_ERROR] = "error",
    [CONFIG_LOG_WARN] = "warn",
    [CONFIG_LOG_INFO] = "info",
    [CONFIG_LOG_DEBUG] = "debug",
};

void log_setup(enum config_log_level level, enum config_log_format format)
{
    atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
    atomic_store_explicit(&log_format, (int)format, memory_order_relaxed);
}

bool log_enabled(enum config_log_level level)
{
    return (int)level <= atomic_load_explicit(&log_level, memory_order_relaxed);
}

/* "2026-11-21T10:00:00.123Z" */
static void format_time(char *out, size_t outlen)
{
    struct timespec ts;
    struct tm tm;
    size_t n;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = strftime(out, outlen, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, outlen - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

static void write_all(const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, p, n);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* nowhere left to report it */
        p += w;
        n -= (size_t)w;
    }
}

/* Keeps a text line on one line: a message may quote client input. */
static void flatten(char *s)
{
    for (; *s; s++) {
        if ((unsigned char)*s < 0x20 || (unsigned char)*s == 0x7f)
            *s = ' ';
    }
}

/* Replaces bytes that are not ASCII, so jansson (UTF-8 only) accepts any message. */
static void to_ascii(char *s)
{
    for (; *s; s++) {
        if ((unsigned char)*s >= 0x80)
            *s = '?';
    }
}

static size_t format_json(char *line, size_t linelen, const char *stamp, const char *level,
                          char *msg)
{
    json_t *obj;
    size_t n;

    obj = json_pack("{s:s, s:s, s:s}", "time", stamp, "level", level, "msg", msg);
    if (!obj) {
        to_ascii(msg); /* invalid UTF-8 */
        obj = json_pack("{s:s, s:s, s:s}", "time", stamp, "level", level, "msg", msg);
    }
    if (!obj)
        return 0;
    n = json_dumpb(obj, line, linelen - 1, JSON_COMPACT);
    json_decref(obj);
    if (n == 0 || n > linelen - 1)
        return 0;
    line[n++] = '\n';
    return n;
}

void log_write(enum config_log_level level, const char *fmt, ...)
{
    char msg[LOG_MSG_MAX], line[LOG_LINE_MAX], stamp[40];
    const char *name;
    va_list ap;
    size_t n;
    int r;

    if (!log_enabled(level))
        return;
    name = (unsigned)level < ARRAY_SIZE(level_names) ? level_names[level] : "debug";
    va_start(ap, fmt);
    r = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (r < 0)
        return;
    if ((size_t)r >= sizeof(msg))
        memcpy(msg + sizeof(msg) - 4, "...", 4);
    format_time(stamp, sizeof(stamp));

    if (atomic_load_explicit(&log_format, memory_order_relaxed) == CONFIG_LOG_JSON) {
        n = format_json(line, sizeof(line), stamp, name, msg);
    } else {
        flatten(msg);
        r = snprintf(line, sizeof(line), "%s %s %s\n", stamp, name, msg);
        n = r < 0 ? 0 : (size_t)r < sizeof(line) ? (size_t)r : sizeof(line) - 1;
    }
    if (n > 0)
        write_all(line, n);
}
