/* SPDX-License-Identifier: MIT */
/* The admin listener, on its own MHD thread: /healthz (200 while the process
 * serves), /readyz (200 only while the store answers), /metrics (Prometheus
 * text), all open, and GET/DELETE /keys/<key> (see admin_keys.h), which reads
 * stored answers and deletes keys: with --admin-token-file only for a request
 * with "Authorization: Bearer <token>" (401 problem otherwise), without it only
 * on a loopback admin address (403 problem otherwise). */
#ifndef IDEMPROXY_ADMIN_H
#define IDEMPROXY_ADMIN_H

#include "idemproxy/common.h"

struct admin;
struct config;
struct store;

/* Listens on cfg->admin_listen. <st> (borrowed, may be NULL when enforcement
 * is off: then always ready). Returns 0 with it in <ret>, or a negative errno. */
int admin_start(const struct config *cfg, struct store *st, struct admin **ret);

/* True when cfg->admin_listen is a loopback address (127.0.0.0/8, ::1): the
 * only place /keys is served without --admin-token-file. */
bool admin_is_loopback(const struct config *cfg);

/* Stops and frees. NULL-safe. */
void admin_stop(struct admin *a);

#endif
