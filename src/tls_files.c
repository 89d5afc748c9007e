/* SPDX-License-Identifier: MIT */
/* PEM files into an OpenSSL context, and every failure named: the option,
 * the file and OpenSSL's first reason. */
#include "idemproxy/tls_files.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>

/* <opt>: <what> <file>: OpenSSL's first queued reason; the queue is emptied. */
static int fail(char *why, size_t why_len, const char *opt, const char *what, const char *file)
{
    unsigned long e = ERR_get_error();
    char reason[200] = "unknown error";

    if (e)
        ERR_error_string_n(e, reason, sizeof(reason));
    ERR_clear_error();
    snprintf(why, why_len, "%s: %s %s: %s", opt, what, file, reason);
    return -EINVAL;
}

int tls_files_load(SSL_CTX *ctx, const struct tls_files *f, char *why, size_t why_len)
{
    if (f->ca_file) {
        if (SSL_CTX_load_verify_locations(ctx, f->ca_file, NULL) != 1)
            return fail(why, why_len, f->ca_opt, "cannot load the CA file", f->ca_file);
    } else if (f->system_cas && SSL_CTX_set_default_verify_paths(ctx) != 1) {
        return fail(why, why_len, f->ca_opt, "cannot load the system's CA store", "");
    }
    if (!f->cert_file != !f->key_file) {
        snprintf(why, why_len, "%s: a certificate needs both %s and %s",
                 f->cert_file ? f->cert_opt : f->key_opt, f->cert_opt, f->key_opt);
        return -EINVAL;
    }
    if (!f->cert_file)
        return 0;
    if (SSL_CTX_use_certificate_chain_file(ctx, f->cert_file) != 1)
        return fail(why, why_len, f->cert_opt, "cannot load the certificate", f->cert_file);
    if (SSL_CTX_use_PrivateKey_file(ctx, f->key_file, SSL_FILETYPE_PEM) != 1 &&
        ERR_GET_REASON(ERR_peek_error()) != X509_R_KEY_VALUES_MISMATCH)
        return fail(why, why_len, f->key_opt, "cannot load the key", f->key_file);
    if (SSL_CTX_check_private_key(ctx) != 1) {
        ERR_clear_error();
        snprintf(why, why_len, "%s: the key %s is not the key of the certificate %s (%s)",
                 f->key_opt, f->key_file, f->cert_file, f->cert_opt);
        return -EINVAL;
    }
    return 0;
}

int tls_files_check(const struct tls_files *f, bool server, char *why, size_t why_len)
{
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    int r;

    if (!ctx) {
        snprintf(why, why_len, "%s: out of memory", f->cert_opt ? f->cert_opt : f->ca_opt);
        return -ENOMEM;
    }
    r = tls_files_load(ctx, f, why, why_len);
    SSL_CTX_free(ctx);
    return r;
}
