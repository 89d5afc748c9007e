/* SPDX-License-Identifier: MIT */
/* The admin listener, on its own MHD thread: /healthz (200 while the process
 * serves), /readyz (200 only while the store answers), /metrics (Prometheus
 * text), and GET/DELETE /keys/<key> (see admin_keys.h). */
#ifndef IDEMPROXY_ADMIN_H
#define IDEMPROXY_ADMIN_H

#include "idemproxy/common.h"

struct admin;
struct config;
struct store;

/* Listens on cfg->admin_listen. <st> (borrowed, may be NULL when enforcement
 * is off: then always ready). Returns 0 with it in <ret>, or a negative errno. */
int admin_start(const struct config *cfg, struct store *st, struct admin **ret);

/* Stops and frees. NULL-safe. */
void admin_stop(struct admin *a);

#endif
