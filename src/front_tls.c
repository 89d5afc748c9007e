/* SPDX-License-Identifier: MIT */
/* The listener's certificate and key as GnuTLS takes them from a callback
 * at each handshake, replaced whole on SIGHUP; and the first-byte look at
 * new HTTPS connections. */
#include "idemproxy/front_tls.h"

#include <arpa/inet.h>
#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "idemproxy/config.h"
#include "idemproxy/log.h"
#include "idemproxy/loop.h"
#include "idemproxy/tls_files.h"

#define PEM_MAX (1u << 20)
#define CHAIN_MAX 16u

/* One certificate chain with its key. A pair is never freed before the
 * process stops: a handshake that began with it may still be using it, and
 * reloads are few. */
struct pair {
    gnutls_pcert_st certs[CHAIN_MAX];
    unsigned ncerts;
    gnutls_privkey_t key;
    struct pair *older;
};

static _Atomic(struct pair *) current;
static struct pair *loaded; /* main thread: every pair, newest first */

/* The whole of the file <path>, at most PEM_MAX bytes, into <d> (freed with
 * wipe()). Returns 0 or a negative errno. */
static int read_file(const char *path, gnutls_datum_t *d)
{
    FILE *fp = fopen(path, "re");
    struct stat sb;
    int err;

    d->data = NULL;
    d->size = 0;
    if (!fp)
        return -errno;
    err = fstat(fileno(fp), &sb) < 0 ? -errno : sb.st_size > PEM_MAX ? -E2BIG : 0;
    if (err == 0 && !(d->data = malloc((size_t)sb.st_size + 1)))
        err = -ENOMEM;
    if (err == 0) {
        d->size = (unsigned)fread(d->data, 1, (size_t)sb.st_size, fp);
        err = ferror(fp) ? -EIO : 0;
    }
    fclose(fp);
    return err;
}

static void wipe(gnutls_datum_t *d)
{
    if (d->data)
        explicit_bzero(d->data, d->size);
    free(d->data);
    d->data = NULL;
}

static void pair_free(struct pair *p)
{
    for (unsigned i = 0; i < p->ncerts; i++)
        gnutls_pcert_deinit(&p->certs[i]);
    if (p->key)
        gnutls_privkey_deinit(p->key);
    free(p);
}

/* Whether <p>'s key is its certificate's, as GnuTLS read them. */
static bool same_key(const struct pair *p)
{
    gnutls_pubkey_t pub = NULL;
    gnutls_datum_t a = { 0 }, b = { 0 };
    bool same = gnutls_pubkey_init(&pub) == 0 &&
                gnutls_pubkey_import_privkey(pub, p->key, 0, 0) == 0 &&
                gnutls_pubkey_export2(pub, GNUTLS_X509_FMT_DER, &a) == 0 &&
                gnutls_pubkey_export2(p->certs[0].pubkey, GNUTLS_X509_FMT_DER, &b) == 0 &&
                a.size == b.size && memcmp(a.data, b.data, a.size) == 0;

    gnutls_free(a.data);
    gnutls_free(b.data);
    if (pub)
        gnutls_pubkey_deinit(pub);
    return same;
}

/* The pair of cfg's files: checked with OpenSSL first (the same check as at
 * start: readable, parsed, the key the certificate's), then imported. */
static int pair_load(const struct config *cfg, struct pair **ret, char *why, size_t why_len)
{
    struct tls_files tf = { .cert_file = cfg->tls_cert_file,
                            .key_file = cfg->tls_key_file,
                            .cert_opt = "--tls-cert-file",
                            .key_opt = "--tls-key-file" };
    gnutls_datum_t cert = { 0 }, key = { 0 };
    struct pair *p;
    int err, g = 0;

    if ((err = tls_files_check(&tf, true, why, why_len)) < 0)
        return err;
    if (!(p = calloc(1, sizeof(*p))))
        return -ENOMEM;
    p->ncerts = CHAIN_MAX;
    if ((err = read_file(cfg->tls_cert_file, &cert)) == 0)
        err = read_file(cfg->tls_key_file, &key);
    if (err == 0 && (g = gnutls_pcert_list_import_x509_raw(p->certs, &p->ncerts, &cert,
                                                           GNUTLS_X509_FMT_PEM, 0)) < 0)
        p->ncerts = 0;
    if (err == 0 && g == 0 && (g = gnutls_privkey_init(&p->key)) == 0)
        g = gnutls_privkey_import_x509_raw(p->key, &key, GNUTLS_X509_FMT_PEM, NULL, 0);
    wipe(&cert);
    wipe(&key);
    if (err == 0 && g == 0 && p->ncerts && !same_key(p))
        g = GNUTLS_E_CERTIFICATE_KEY_MISMATCH; /* the files changed between the two reads */
    if (err < 0 || g < 0) {
        snprintf(why, why_len, "--tls-cert-file %s, --tls-key-file %s: %s", cfg->tls_cert_file,
                 cfg->tls_key_file, err < 0 ? strerror(-err) : gnutls_strerror(g));
        pair_free(p);
        return -EINVAL;
    }
    *ret = p;
    return 0;
}

static void put_in_place(struct pair *p)
{
    p->older = loaded;
    loaded = p;
    atomic_store_explicit(&current, p, memory_order_release);
}

int front_tls_start(const struct config *cfg, char *why, size_t why_len)
{
    struct pair *p;
    int err;

    if (!cfg->tls_cert_file)
        return 0;
    if ((err = pair_load(cfg, &p, why, why_len)) < 0)
        return err;
    put_in_place(p);
    return 0;
}

int front_tls_reload(const struct config *cfg, char *why, size_t why_len)
{
    struct pair *p;
    int err;

    if (!cfg->tls_cert_file || !front_tls_on())
        return 0;
    if ((err = pair_load(cfg, &p, why, why_len)) < 0)
        return err;
    put_in_place(p);
    return 1;
}

bool front_tls_on(void) { return atomic_load_explicit(&current, memory_order_acquire) != NULL; }

/* Each handshake takes the pair in place when it begins. */
static int on_cert(gnutls_session_t session, const gnutls_datum_t *req_ca_rdn, int nreqs,
                   const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
                   gnutls_pcert_st **pcert, unsigned int *pcert_length, gnutls_privkey_t *privkey)
{
    struct pair *p = atomic_load_explicit(&current, memory_order_acquire);

    (void)session;
    (void)req_ca_rdn;
    (void)nreqs;
    (void)pk_algos;
    (void)pk_algos_length;
    if (!p)
        return -1;
    *pcert = p->certs;
    *pcert_length = p->ncerts;
    *privkey = p->key;
    return 0;
}

void *front_tls_callback(void)
{
    gnutls_certificate_retrieve_function2 *fn = on_cert;

    return (void *)(uintptr_t)fn;
}

void front_tls_stop(void)
{
    atomic_store_explicit(&current, NULL, memory_order_release);
    while (loaded) {
        struct pair *p = loaded;

        loaded = p->older;
        pair_free(p);
    }
}

/* ---- plain HTTP on the HTTPS listener ---- */

#define SAID_SLOTS 64u
#define SAID_MS 10000u

/* The client addresses said lately: one line per address per SAID_MS. */
static struct {
    pthread_mutex_t mu;
    struct {
        char addr[INET6_ADDRSTRLEN];
        uint64_t at_ms;
    } slot[SAID_SLOTS];
    unsigned next;
} said = { .mu = PTHREAD_MUTEX_INITIALIZER };

/* Whether <addr> is to be said now (and from now on counted as said). */
static bool say_now(const char *addr)
{
    uint64_t now = now_ms();
    bool say = true;

    pthread_mutex_lock(&said.mu);
    for (unsigned i = 0; i < SAID_SLOTS; i++) {
        if (strcmp(said.slot[i].addr, addr) != 0)
            continue;
        say = now - said.slot[i].at_ms >= SAID_MS;
        if (say)
            said.slot[i].at_ms = now;
        pthread_mutex_unlock(&said.mu);
        return say;
    }
    snprintf(said.slot[said.next].addr, sizeof(said.slot[0].addr), "%s", addr);
    said.slot[said.next].at_ms = now;
    said.next = (said.next + 1) % SAID_SLOTS;
    pthread_mutex_unlock(&said.mu);
    return say;
}

static void peer_text(int fd, char *out, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    const void *a = NULL;

    snprintf(out, len, "an unknown address");
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) < 0)
        return;
    if (ss.ss_family == AF_INET)
        a = &((const struct sockaddr_in *)(const void *)&ss)->sin_addr;
    else if (ss.ss_family == AF_INET6)
        a = &((const struct sockaddr_in6 *)(const void *)&ss)->sin6_addr;
    if (a)
        (void)inet_ntop(ss.ss_family, a, out, (socklen_t)len);
}

bool front_tls_sniff(int fd)
{
    unsigned char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    char addr[INET6_ADDRSTRLEN];

    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return false;
    /* A TLS record of a handshake (22), or an SSL 2 hello (its high bit):
     * anything else, "GET " or "POST" above all, is not TLS. */
    if (n != 1 || b == 22 || (b & 0x80))
        return true;
    peer_text(fd, addr, sizeof(addr));
    if (say_now(addr))
        log_warn("a client at %s sent plain HTTP (or another protocol) to the HTTPS listener: it "
                 "must use https:// (the connection is closed; said once per address per 10 s)",
                 addr);
    return true;
}
