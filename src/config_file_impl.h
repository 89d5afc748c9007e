/* SPDX-License-Identifier: MIT */
/* What the configuration file's parts share: config_file.c (the file, the
 * top level, the routes) and config_reconcile.c (a route's reconcile:
 * block): the loaded document, where problems go, and the walks over its
 * nodes. Not an interface: the rest of the program sees config_file.h. */
#ifndef IDEMPROXY_CONFIG_FILE_IMPL_H
#define IDEMPROXY_CONFIG_FILE_IMPL_H

#include <yaml.h>

#include "idemproxy/config_file.h"

struct reconcile_config;

struct config_file {
    char *path;           /* owned */
    yaml_document_t *doc; /* owned, loaded */
};

/* Where the problems go: <err>, one line each. */
struct errs {
    const struct config_file *f;
    char *err;
    size_t errlen;
    unsigned n;
    bool oom;
};

/* Adds a problem at <at> (NULL: the file's). */
void cfile_errs_add(struct errs *e, const yaml_node_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Says at <k> that <key> is not one of the <n> <names> of <what> ("route",
 * "scope.jwt"): "did you mean" the nearest when one is near, else the list. */
void cfile_unknown_key(struct errs *e, const yaml_node_t *k, const char *what, const char *key,
                       const char *const *names, size_t n);

yaml_node_t *cfile_node(const struct config_file *f, int id);

/* The text of scalar <n>; NULL for a YAML null (an empty, "~" or "null"
 * plain scalar), or a scalar holding a NUL byte, which no option takes. */
const char *cfile_scalar(const yaml_node_t *n);

/* "a mapping", "a list", "a value" or "null", for messages. */
const char *cfile_type_name(const yaml_node_t *n);

/* Calls <fn> for each pair of mapping <map>, after checking that its key is
 * a scalar seen once. <what> names the mapping in messages. */
typedef void pair_fn(struct errs *e, const char *key, yaml_node_t *k, yaml_node_t *v, void *ctx);
void cfile_each_pair(struct errs *e, yaml_node_t *map, const char *what, pair_fn *fn, void *ctx);

/* The items of <v>, a scalar or a list of scalars, into <items> (at most
 * CONFIG_MAX_LIST). Returns the count, or -1 with the problem reported. */
int cfile_items_of(struct errs *e, const char *key, yaml_node_t *v, const char **items,
                   bool *ret_is_list);

/* A copy of <s>; NULL (and e->oom) when out of memory. */
char *cfile_dup_or_oom(struct errs *e, const char *s);

/* A route's reconcile: block <v> (config_reconcile.c) into a new config in
 * <ret> (NULL with the problems reported). */
void cfile_reconcile(struct errs *e, yaml_node_t *v, struct reconcile_config **ret);

#endif
