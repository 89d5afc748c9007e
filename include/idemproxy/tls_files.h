/* SPDX-License-Identifier: MIT */
/* The PEM files of a TLS end, loaded into an OpenSSL context or checked at
 * start: the CAs that verify the peer, and a certificate (its chain) with
 * its key. Shared by Redis's TLS, the upstream's and the listener's check.
 * Any thread. */
#ifndef IDEMPROXY_TLS_FILES_H
#define IDEMPROXY_TLS_FILES_H

#include "idemproxy/common.h"

typedef struct ssl_ctx_st SSL_CTX;

struct tls_files {
    const char *ca_file;   /* the CAs that verify the peer, NULL: see <system_cas> */
    const char *cert_file; /* a certificate (PEM, its chain after it), NULL: none */
    const char *key_file;  /* its key (PEM) */
    bool system_cas;       /* with no <ca_file>: the system's CA store (a client) */
    /* The options that named the files, for the messages: "--redis-tls-ca-file"... */
    const char *ca_opt, *cert_opt, *key_opt;
};

/* Loads <f> into <ctx>: the CAs (or the system's, or none), then the
 * certificate and its key, checked to match. Returns 0, or -EINVAL with one
 * line in <why> naming the option, the file and OpenSSL's reason (a file
 * that cannot be read or parsed, a key of another certificate, half a
 * pair). */
int tls_files_load(SSL_CTX *ctx, const struct tls_files *f, char *why, size_t why_len);

/* tls_files_load() into a throwaway context of a client (<server> false) or
 * a server: the files as the process will use them, checked at start. */
int tls_files_check(const struct tls_files *f, bool server, char *why, size_t why_len);

#endif
