/* SPDX-License-Identifier: MIT */
/* The options checked against each other, once every one is set. Pure. */
#ifndef IDEMPROXY_CONFIG_CHECK_H
#define IDEMPROXY_CONFIG_CHECK_H

#include "idemproxy/config.h"

/* Checks <cfg> as a whole: --upstream given, the top level's route settings
 * (config_check_route()), TLS options only with a TLS URL and a client
 * certificate whole, --redis-wait-replicas with a Redis URL and a WAIT
 * shorter than --store-timeout. Returns 0, or -EINVAL with one line in
 * <err> naming the option. */
int config_check_options(const struct config *cfg, char *err, size_t errlen);

/* Checks the settings <rs> of a route (or the top level's) against each
 * other and the process's <cfg> (a TTL above max-ttl, a max-response the
 * memory store cannot hold twice). Returns 0, or -EINVAL with one line in
 * <why>. */
int config_check_route(const struct config *cfg, const struct route_settings *rs, char *why,
                       size_t whylen);

#endif
