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
/* An access line keeps this much of the target, and half of it of the key. */
#define LOG_FIELD_MAX 1024

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

/* A JSON string of at most <max> bytes of <s>; bytes that are not UTF-8
 * become '?'. Returns NULL on OOM. */
static json_t *json_span(struct span s, size_t max)
{
    char copy[LOG_FIELD_MAX];
    json_t *v;

    if (s.len > max)
        s.len = max;
    v = json_stringn(s.base ? s.base : "", s.len);
    if (v || s.len > sizeof(copy) - 1)
        return v;
    memcpy(copy, s.base, s.len);
    copy[s.len] = '\0';
    for (size_t i = 0; i < s.len; i++) {
        if ((unsigned char)copy[i] >= 0x80 || copy[i] == '\0')
            copy[i] = '?';
    }
    return json_stringn(copy, s.len);
}

static size_t format_access_json(char *line, size_t linelen, const char *stamp,
                                 const struct log_access *a)
{
    json_t *obj = json_object();
    int err = 0;
    size_t n;

    if (!obj)
        return 0;
    err |= json_object_set_new(obj, "time", json_string(stamp));
    err |= json_object_set_new(obj, "level", json_string("info"));
    err |= json_object_set_new(obj, "msg", json_string("access"));
    err |= json_object_set_new(obj, "method", json_span(a->method, LOG_FIELD_MAX / 8));
    err |= json_object_set_new(obj, "target", json_span(a->target, LOG_FIELD_MAX - 1));
    err |= json_object_set_new(obj, "status", json_integer(a->status));
    err |= json_object_set_new(obj, "outcome", json_string(a->outcome));
    if (a->key.base)
        err |= json_object_set_new(obj, "key", json_span(a->key, LOG_FIELD_MAX / 2));
    if (a->has_upstream)
        err |= json_object_set_new(obj, "upstream_ms", json_real((double)a->upstream_us / 1000.0));
    err |= json_object_set_new(obj, "total_ms", json_real((double)a->total_us / 1000.0));
    err |= json_object_set_new(obj, "bytes", json_integer((json_int_t)a->bytes));
    n = err ? 0 : json_dumpb(obj, line, linelen - 1, JSON_COMPACT | JSON_REAL_PRECISION(15));
    json_decref(obj);
    if (n == 0 || n > linelen - 1)
        return 0;
    line[n++] = '\n';
    return n;
}

void log_access(const struct log_access *a)
{
    char msg[LOG_MSG_MAX], line[LOG_LINE_MAX], stamp[40], key[LOG_FIELD_MAX + 8], up[32];
    size_t n;
    int r;

    if (!log_enabled(CONFIG_LOG_INFO))
        return;
    format_time(stamp, sizeof(stamp));
    if (atomic_load_explicit(&log_format, memory_order_relaxed) == CONFIG_LOG_JSON) {
        n = format_access_json(line, sizeof(line), stamp, a);
    } else {
        key[0] = '\0';
        if (a->key.base)
            snprintf(key, sizeof(key), " key=%.*s",
                     (int)(a->key.len < LOG_FIELD_MAX / 2 ? a->key.len : LOG_FIELD_MAX / 2),
                     a->key.base);
        if (a->has_upstream)
            snprintf(up, sizeof(up), "%llu.%03llu", (unsigned long long)(a->upstream_us / 1000),
                     (unsigned long long)(a->upstream_us % 1000));
        else
            snprintf(up, sizeof(up), "-");
        r = snprintf(msg, sizeof(msg),
                     "access %.*s %.*s %u %s%s upstream_ms=%s total_ms=%llu.%03llu "
                     "bytes=%zu",
                     (int)(a->method.len < 64 ? a->method.len : 64),
                     a->method.base ? a->method.base : "",
                     (int)(a->target.len < LOG_FIELD_MAX ? a->target.len : LOG_FIELD_MAX),
                     a->target.base ? a->target.base : "", a->status, a->outcome, key, up,
                     (unsigned long long)(a->total_us / 1000),
                     (unsigned long long)(a->total_us % 1000), a->bytes);
        if (r < 0)
            return;
        if ((size_t)r >= sizeof(msg))
            memcpy(msg + sizeof(msg) - 4, "...", 4);
        flatten(msg);
        r = snprintf(line, sizeof(line), "%s info %s\n", stamp, msg);
        n = r < 0 ? 0 : (size_t)r < sizeof(line) ? (size_t)r : sizeof(line) - 1;
    }
    if (n > 0)
        write_all(line, n);
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
