/* SPDX-License-Identifier: MIT */
/* The admin listener, on its own MHD thread: /healthz (200 while the process
 * serves), /readyz (200 while the proxy serves its routes as configured:
 * the store answers, or --on-store-error passthrough lets requests through
 * without it ("degraded"); 503 once draining), /metrics (Prometheus
 * text), all open, and GET/DELETE /keys/<key> (see admin_keys.h), which reads
 * stored answers and deletes keys: with --admin-token-file only for a request
 * with "Authorization: Bearer <token>" (401 problem otherwise), without it only
 * on a loopback admin address (403 problem otherwise). Every error is a
 * problem+json answer (admin_keys.h). */
#ifndef IDEMPROXY_ADMIN_H
#define IDEMPROXY_ADMIN_H

#include "idemproxy/common.h"

struct admin;
struct config;
struct store;

/* Listens on cfg->admin_listen. <st> (borrowed, may be NULL when enforcement
 * is off: then always ready; answers go to it and come from it in clear).
 * Returns 0 with it in <ret>, or a negative errno. */
int admin_start(const struct config *cfg, struct store *st, struct admin **ret);

/* True when cfg->admin_listen is a loopback address (127.0.0.0/8, ::1): the
 * only place /keys is served without --admin-token-file. */
bool admin_is_loopback(const struct config *cfg);

enum admin_access {
    ADMIN_ACCESS_ALLOWED,
    ADMIN_ACCESS_UNAUTHORIZED, /* 401: the token is required and was not given */
    ADMIN_ACCESS_FORBIDDEN,    /* 403: no token configured, and not a loopback address */
};

/* Whether a /keys request may be served: with <token> (--admin-token-file's
 * secret) only when <authorization> (its Authorization header, NULL when
 * absent) is "Bearer <token>" (scheme case-insensitive, compared in constant
 * time); without one only when <loopback>. */
enum admin_access admin_keys_access(const char *token, bool loopback, const char *authorization);

/* Main thread: readiness follows <cfg>'s --on-store-error from now on (at
 * start and after a reload). */
void admin_follow(struct admin *a, const struct config *cfg);

/* Main thread, on SIGTERM: /readyz answers 503 from now on, so that load
 * balancers stop sending while the listener still accepts (--drain-delay). */
void admin_drain(struct admin *a);

/* Stops and frees. NULL-safe. */
void admin_stop(struct admin *a);

#endif
