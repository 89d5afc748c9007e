/* SPDX-License-Identifier: MIT */
/* The key inspection and purge paths of the admin listener:
 *   GET    /keys/<key>[?body=1]     every stored record of <key>, across scopes (JSON)
 *   DELETE /keys/<key>?scope=<hash> removes one, so its request may run again */
#ifndef IDEMPROXY_ADMIN_KEYS_H
#define IDEMPROXY_ADMIN_KEYS_H

#include <microhttpd.h>

#include "idemproxy/common.h"

#define ADMIN_KEYS_PATH "/keys/"

struct store;

/* Answers <method> on the raw request target <target> (as the client sent
 * it: its path, once percent-decoded here, starts with ADMIN_KEYS_PATH) for
 * the store <st> (NULL when enforcement is off) whose keys start with
 * <prefix>. Access control is the caller's (admin.c). Runs on the admin
 * thread and waits, bounded, for the store. Returns what MHD_queue_response()
 * returns. */
enum MHD_Result admin_keys_serve(struct MHD_Connection *conn, struct store *st, const char *prefix,
                                 const char *target, const char *method);

#endif
