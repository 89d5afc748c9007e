/* SPDX-License-Identifier: MIT */
/* Log lines to stderr, text or JSON. Any thread may log: each line is built on
 * the caller's stack and written with one write(2), so lines never interleave
 * and no lock is taken but a burst's own. */
#include "idemproxy/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#define LOG_MSG_MAX 2048                     /* longer messages are cut and end with "..." */
#define LOG_LINE_MAX (LOG_MSG_MAX * 6 + 128) /* a byte escapes into at most \u00XX (JSON) */
/* An access line keeps this much of the target, and half of it of the key. */
#define LOG_FIELD_MAX 1024

/* Set once before threads start; atomics keep a late log_setup() well defined. */
static _Atomic int log_level = LOG_LEVEL_INFO;
static _Atomic int log_format = LOG_FORMAT_TEXT;

static const char *const level_names[] = {
    [LOG_LEVEL_ERROR] = "error",
    [LOG_LEVEL_WARN] = "warn",
    [LOG_LEVEL_INFO] = "info",
    [LOG_LEVEL_DEBUG] = "debug",
};

void log_setup(enum log_level level, enum log_format format)
{
    atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
    atomic_store_explicit(&log_format, (int)format, memory_order_relaxed);
}

bool log_enabled(enum log_level level)
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

/* Appends <n> bytes of <p> to <out> (<cap> bytes, <*len> used), keeping room
 * for a NUL; what does not fit is dropped. */
static void put(char *out, size_t cap, size_t *len, const char *p, size_t n)
{
    if (*len >= cap)
        return;
    if (n > cap - 1 - *len)
        n = cap - 1 - *len;
    memcpy(out + *len, p, n);
    *len += n;
    out[*len] = '\0';
}

/* Appends <s> escaped for a text line, so that a line stays one line and its
 * fields stay apart whatever bytes a client sent: printable ASCII as is, but
 * '"' and '\\' escaped with a backslash, every other byte (controls, DEL,
 * 8-bit) as \xHH, and a space too in a <field> (a composite key is its parts
 * joined by a space: "key=src\x20id", never a second field). At most <max>
 * bytes of <s> are taken; more ends in "...". */
static void put_escaped(char *out, size_t cap, size_t *len, struct span s, size_t max, bool field)
{
    static const char hex[] = "0123456789abcdef";

    for (size_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.base[i];
        char e[4] = { '\\', (char)c, 0, 0 };

        if (c >= (field ? 0x21 : 0x20) && c < 0x7f && c != '"' && c != '\\')
            put(out, cap, len, (const char *)&c, 1);
        else if (c == '"' || c == '\\')
            put(out, cap, len, e, 2);
        else {
            e[1] = 'x';
            e[2] = hex[c >> 4];
            e[3] = hex[c & 15];
            put(out, cap, len, e, 4);
        }
    }
    if (s.len > max)
        put(out, cap, len, "...", 3);
}

/* The length of the well-formed UTF-8 sequence (RFC 3629) at <p>, <n> bytes
 * left, or 0 when there is none. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    size_t need;
    uint32_t cp;

    if (p[0] < 0x80)
        return 1;
    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        need = 2;
        cp = p[0] & 0x1f;
    } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        need = 3;
        cp = p[0] & 0x0f;
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        need = 4;
        cp = p[0] & 0x07;
    } else {
        return 0;
    }
    if (n < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if ((need == 3 && cp < 0x800) || (need == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0; /* overlong, past Unicode, or a surrogate */
    return need;
}

/* A JSON string of at most <max> bytes of <s>: well-formed UTF-8 as is
 * (jansson escapes quotes and controls), each other byte, and NUL (which many
 * JSON readers refuse as \u0000), as the text \xHH, so every line is valid
 * JSON and nothing is dropped. NULL on OOM. */
static json_t *json_span(struct span s, size_t max)
{
    static const char hex[] = "0123456789abcdef";
    char copy[LOG_MSG_MAX * 4];
    size_t len = 0;

    if (max > LOG_MSG_MAX)
        max = LOG_MSG_MAX;
    if (s.len > max)
        s.len = max;
    for (size_t i = 0; i < s.len;) {
        size_t n = s.base[i] ? utf8_len((const unsigned char *)s.base + i, s.len - i) : 0;

        if (n > 0) {
            memcpy(copy + len, s.base + i, n);
            len += n;
            i += n;
        } else {
            unsigned char c = (unsigned char)s.base[i++];

            copy[len++] = '\\';
            copy[len++] = 'x';
            copy[len++] = hex[c >> 4];
            copy[len++] = hex[c & 15];
        }
    }
    return json_stringn(copy, len);
}

static size_t format_json(char *line, size_t linelen, const char *stamp, const char *level,
                          const char *msg)
{
    json_t *obj;
    size_t n;

    obj = json_pack("{s:s, s:s, s:o}", "time", stamp, "level", level, "msg",
                    json_span(span_from_cstr(msg), LOG_MSG_MAX));
    if (!obj)
        return 0;
    n = json_dumpb(obj, line, linelen - 1, JSON_COMPACT);
    json_decref(obj);
    if (n == 0 || n > linelen - 1)
        return 0;
    line[n++] = '\n';
    return n;
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
    err |= json_object_set_new(obj, "target", json_span(a->target, LOG_FIELD_MAX));
    err |= json_object_set_new(obj, "status", json_integer(a->status));
    err |= json_object_set_new(obj, "outcome", json_string(a->outcome));
    if (a->route)
        err |= json_object_set_new(obj, "route",
                                   json_span(span_from_cstr(a->route), LOG_FIELD_MAX / 8));
    if (a->key.base)
        err |= json_object_set_new(obj, "key", json_span(a->key, LOG_FIELD_MAX / 2));
    if (a->has_upstream)
        err |= json_object_set_new(obj, "upstream_ms", json_real((double)a->upstream_us / 1000.0));
    err |= json_object_set_new(obj, "total_ms", json_real((double)a->total_us / 1000.0));
    err |= json_object_set_new(obj, "bytes", json_integer((json_int_t)a->bytes));
    if (a->unknown)
        err |= json_object_set_new(obj, "unknown", json_string(a->unknown));
    if (a->request_id)
        err |= json_object_set_new(obj, "request_id",
                                   json_span(span_from_cstr(a->request_id), LOG_FIELD_MAX / 4));
    if (a->trace_id)
        err |= json_object_set_new(obj, "trace_id", json_string(a->trace_id));
    if (a->client)
        err |= json_object_set_new(obj, "client", json_string(a->client));
    if (a->reason)
        err |= json_object_set_new(obj, "reason",
                                   json_span(span_from_cstr(a->reason), LOG_FIELD_MAX / 2));
    n = err ? 0 : json_dumpb(obj, line, linelen - 1, JSON_COMPACT | JSON_REAL_PRECISION(15));
    json_decref(obj);
    if (n == 0 || n > linelen - 1)
        return 0;
    line[n++] = '\n';
    return n;
}

void log_access(const struct log_access *a)
{
    char line[LOG_LINE_MAX], stamp[40], num[96];
    size_t n = 0;

    if (!log_enabled(LOG_LEVEL_INFO))
        return;
    format_time(stamp, sizeof(stamp));
    if (atomic_load_explicit(&log_format, memory_order_relaxed) == LOG_FORMAT_JSON) {
        n = format_access_json(line, sizeof(line), stamp, a);
    } else {
        put(line, sizeof(line), &n, stamp, strlen(stamp));
        put(line, sizeof(line), &n, " info access ", 13);
        put_escaped(line, sizeof(line), &n, a->method, LOG_FIELD_MAX / 8, true);
        put(line, sizeof(line), &n, " ", 1);
        put_escaped(line, sizeof(line), &n, a->target, LOG_FIELD_MAX, true);
        snprintf(num, sizeof(num), " %u %s", a->status, a->outcome);
        put(line, sizeof(line), &n, num, strlen(num));
        if (a->route) {
            put(line, sizeof(line), &n, " route=", 7);
            put_escaped(line, sizeof(line), &n, span_from_cstr(a->route), LOG_FIELD_MAX / 8, true);
        }
        if (a->key.base) {
            put(line, sizeof(line), &n, " key=", 5);
            put_escaped(line, sizeof(line), &n, a->key, LOG_FIELD_MAX / 2, true);
        }
        if (a->has_upstream)
            snprintf(num, sizeof(num), " upstream_ms=%llu.%03llu",
                     (unsigned long long)(a->upstream_us / 1000),
                     (unsigned long long)(a->upstream_us % 1000));
        else
            snprintf(num, sizeof(num), " upstream_ms=-");
        put(line, sizeof(line), &n, num, strlen(num));
        snprintf(num, sizeof(num), " total_ms=%llu.%03llu bytes=%zu%s%s",
                 (unsigned long long)(a->total_us / 1000), (unsigned long long)(a->total_us % 1000),
                 a->bytes, a->unknown ? " unknown=" : "", a->unknown ? a->unknown : "");
        put(line, sizeof(line), &n, num, strlen(num));
        if (a->request_id) {
            put(line, sizeof(line), &n, " request_id=", 12);
            put_escaped(line, sizeof(line), &n, span_from_cstr(a->request_id), LOG_FIELD_MAX / 4,
                        true);
        }
        if (a->trace_id) {
            put(line, sizeof(line), &n, " trace_id=", 10);
            put(line, sizeof(line), &n, a->trace_id, strlen(a->trace_id));
        }
        if (a->client) {
            put(line, sizeof(line), &n, " client=", 8);
            put_escaped(line, sizeof(line), &n, span_from_cstr(a->client), 64, true);
        }
        if (a->reason) {
            put(line, sizeof(line), &n, " reason=\"", 9);
            put_escaped(line, sizeof(line), &n, span_from_cstr(a->reason), LOG_FIELD_MAX / 2,
                        false);
            put(line, sizeof(line), &n, "\"", 1);
        }
        put(line, sizeof(line), &n, "\n", 1);
    }
    if (n > 0)
        write_all(line, n);
}

void log_write(enum log_level level, const char *fmt, ...)
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

    if (atomic_load_explicit(&log_format, memory_order_relaxed) == LOG_FORMAT_JSON) {
        n = format_json(line, sizeof(line), stamp, name, msg);
    } else {
        n = 0;
        put(line, sizeof(line), &n, stamp, strlen(stamp));
        put(line, sizeof(line), &n, " ", 1);
        put(line, sizeof(line), &n, name, strlen(name));
        put(line, sizeof(line), &n, " ", 1);
        put_escaped(line, sizeof(line), &n, span_from_cstr(msg), LOG_MSG_MAX, false);
        put(line, sizeof(line), &n, "\n", 1);
    }
    if (n > 0)
        write_all(line, n);
}

/* ---- bursts ---- */

static pthread_mutex_t bursts_mu = PTHREAD_MUTEX_INITIALIZER;
static struct log_burst *bursts; /* every burst admitted once, for the tick */

static uint64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u + 1; /* never 0 */
}

/* Writes the count of <b>'s window; its lock is held. */
static void burst_summary(struct log_burst *b, uint64_t now_ms)
{
    unsigned secs = (unsigned)((now_ms - b->since_ms + 500) / 1000);

    log_warn("%s (%s): %u more in the last %u s", b->subject, b->kind, b->more, secs ? secs : 1);
    b->more = 0;
}

bool log_burst_admit_at(struct log_burst *b, const char *kind, uint64_t now_ms)
{
    bool write;

    pthread_mutex_lock(&b->mu);
    if (!b->listed) {
        pthread_mutex_lock(&bursts_mu);
        b->next = bursts;
        bursts = b;
        pthread_mutex_unlock(&bursts_mu);
        b->listed = true;
    }
    write = !b->since_ms || now_ms - b->since_ms >= LOG_BURST_MS || strcmp(kind, b->kind) != 0;
    if (write) {
        if (b->more)
            burst_summary(b, now_ms);
        b->since_ms = now_ms;
        snprintf(b->kind, sizeof(b->kind), "%s", kind);
    } else {
        b->more++;
    }
    pthread_mutex_unlock(&b->mu);
    return write;
}

bool log_burst_admit(struct log_burst *b, const char *kind)
{
    return log_burst_admit_at(b, kind, mono_ms());
}

void log_burst_tick_at(uint64_t now_ms)
{
    struct log_burst *b;

    pthread_mutex_lock(&bursts_mu);
    b = bursts;
    pthread_mutex_unlock(&bursts_mu);
    /* Bursts are only ever added at the head: the list from <b> on is fixed. */
    for (; b; b = b->next) {
        pthread_mutex_lock(&b->mu);
        if (b->since_ms && now_ms - b->since_ms >= LOG_BURST_MS) {
            if (b->more) {
                burst_summary(b, now_ms);
                b->since_ms = now_ms; /* still failing: the next count, 10 s from now */
            } else {
                b->since_ms = 0; /* quiet: the next failure is written in full */
            }
        }
        pthread_mutex_unlock(&b->mu);
    }
}

void log_burst_tick(void) { log_burst_tick_at(mono_ms()); }
