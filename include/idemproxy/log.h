/* SPDX-License-Identifier: MIT */
/* Log lines, text or JSON, to stderr; the only writer to stderr. Thread-safe:
 * each line is written with one write(). */
#ifndef IDEMPROXY_LOG_H
#define IDEMPROXY_LOG_H

#include "idemproxy/config.h"

/* Sets the format and the most verbose level written. Call once, before threads start. */
void log_setup(enum config_log_level level, enum config_log_format format);

/* True when a message at <level> would be written. */
bool log_enabled(enum config_log_level level);

/* Writes one line: time, level, message (in JSON: {"time","level","msg"}). */
void log_write(enum config_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The level is tested before the arguments are formatted. */
#define LOG(level, ...)                                                                            \
    do {                                                                                           \
        if (log_enabled(level))                                                                    \
            log_write(level, __VA_ARGS__);                                                         \
    } while (0)

#define log_error(...) LOG(CONFIG_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) LOG(CONFIG_LOG_WARN, __VA_ARGS__)
#define log_info(...) LOG(CONFIG_LOG_INFO, __VA_ARGS__)
#define log_debug(...) LOG(CONFIG_LOG_DEBUG, __VA_ARGS__)

#endif
