/* SPDX-License-Identifier: MIT */
/* The YAML configuration file of doc/configuration.md, Configuration file
 * (libyaml): its top level sets the options of doc/configuration.md (Options)
 * by their flag names, its `routes` the routes of route.h. Every problem is
 * reported as "FILE:LINE:COLUMN: message", one per line, all of them at once
 * (as nginx -t does). Pure but for reading the file; used by
 * config_file_load(), at start and on SIGHUP. */
#ifndef IDEMPROXY_CONFIG_FILE_H
#define IDEMPROXY_CONFIG_FILE_H

#include "idemproxy/common.h"

#define CONFIG_FILE_MAX_BYTES (1u << 20) /* a larger file is refused: it is a mistake */

struct config;
struct config_file;
struct route_table;

/* Reads and parses the YAML file <path> (one document, at most
 * CONFIG_FILE_MAX_BYTES). Returns 0 with the parsed file in <ret>, or
 * -EINVAL (or -ENOMEM) with one line appended to <err>: "PATH:LINE:COLUMN:
 * message" for YAML that does not parse, "PATH: message" for a file that
 * cannot be read. */
int config_file_read(const char *path, struct config_file **ret, char *err, size_t errlen);

/* Applies the top-level options of <f> to <cfg> (loaded with its defaults;
 * the environment and flags come after). Returns 0, or -EINVAL with every
 * problem appended to <err>, one line each: an unknown key, a value of the
 * wrong type or a bad value, a duplicate key. */
int config_file_apply(const struct config_file *f, struct config *cfg, char *err, size_t errlen);

/* Builds the route table of <f> (NULL: no file, only the default route) over
 * the final top-level settings <cfg>: each route's settings start as a copy
 * of <cfg>'s and take the route's own on top; the default route takes the
 * top-level `key` and `errors`. Returns 0 with the table (one reference) in
 * <ret>, or -EINVAL with every problem appended to <err>, or -ENOMEM. */
int config_file_routes(const struct config_file *f, const struct config *cfg,
                       struct route_table **ret, char *err, size_t errlen);

/* Loads the whole configuration into <cfg> (zeroed): the defaults, then
 * the file (--config or IDEMPROXY_CONFIG: its top level), then the
 * environment <envp> (a NULL-terminated "NAME=value" array, as environ), then
 * the flags <argv>[1..argc-1]; checks the result and builds the route table
 * (the file's routes over the final top-level settings, and the default
 * route) into <ret_routes> (one reference; NULL: built, checked and dropped).
 * Returns 0, or -EINVAL with the problems written to <err>, one per line: a
 * flag or an environment variable stops at its first problem, with a line
 * naming the option; the file's problems are all reported, each as
 * "FILE:LINE:COLUMN: message". On any return the caller calls config_done().
 * With --help or --version it returns 0 with show_help/show_version set,
 * no routes, and skips every check. */
int config_file_load(struct config *cfg, struct route_table **ret_routes, int argc,
                     char *const argv[], char *const envp[], char *err, size_t errlen);

/* Frees <f>. NULL-safe. */
void config_file_free(struct config_file *f);

#endif
