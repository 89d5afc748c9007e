/* SPDX-License-Identifier: MIT */
/* The listener's TLS (--tls-cert-file, --tls-key-file): the certificate
 * chain and key in GnuTLS's form, handed to each handshake by a callback, so
 * that SIGHUP can put a new pair in place for new connections while kept
 * connections go on with theirs (doc/operations.md, Reloading TLS files);
 * and a look at each new connection's first byte, so that plain HTTP sent
 * to the HTTPS listener is said in the log, not only dropped. */
#ifndef IDEMPROXY_FRONT_TLS_H
#define IDEMPROXY_FRONT_TLS_H

#include "idemproxy/common.h"

struct config;

/* Main thread, before the listeners start: loads cfg's pair (nothing
 * without --tls-cert-file). Returns 0, or -EINVAL with one line in <why>
 * (the option, the file and the reason). */
int front_tls_start(const struct config *cfg, char *why, size_t why_len);

/* Main thread, on SIGHUP: reads cfg's pair again and, when it loads and its
 * key is the certificate's, puts it in place for the handshakes that begin
 * from now on. Returns 1 when it did, 0 without TLS, or -EINVAL with <why>
 * (the old pair stays). */
int front_tls_reload(const struct config *cfg, char *why, size_t why_len);

/* Whether a pair is loaded. */
bool front_tls_on(void);

/* The handshake callback for MHD_OPTION_HTTPS_CERT_CALLBACK (a
 * gnutls_certificate_retrieve_function2), as an opaque pointer. */
void *front_tls_callback(void);

/* Main thread, after the listeners stopped: frees every pair loaded. */
void front_tls_stop(void);

/* Loop thread: looks, without taking them, at the first bytes the client
 * of <fd> sent. Returns false while none came; true once they did (or the
 * connection ended): when they are not a TLS record, the client spoke
 * plain HTTP to the HTTPS listener, which is said in one warn line per
 * client address per 10 s. */
bool front_tls_sniff(int fd);

#endif
