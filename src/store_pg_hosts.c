/* SPDX-License-Identifier: MIT */
/* The PostgreSQL store's host names, looked up off the loops: libpq looks a
 * host name up inside PQconnectPoll(), which would hold a loop thread for
 * as long as the resolver takes. So each name of the URL is looked up on
 * the pool (at start, then every second), and a lane's connect names the
 * addresses found (libpq's hostaddr) beside the names (still what TLS
 * checks the certificate against). A lookup that fails keeps the address
 * found last; a host never found is left out of the connect. */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "idemproxy/pg_url.h"
#include "idemproxy/resolve.h"
#include "store_pg_impl.h"

void store_pg_look_up(struct store_pg *st)
{
    struct pg_url_hosts h;
    char found[PG_URL_MAX_HOSTS][INET6_ADDRSTRLEN], why[400] = "";

    if (!st->names || pg_url_hosts(st->url, &h) < 0)
        return;
    for (unsigned i = 0; i < h.n; i++) {
        int r;

        found[i][0] = '\0';
        if (!pg_url_host_is_name(h.host[i]))
            continue;
        r = resolve_host_text(h.host[i], found[i], sizeof(found[i]));
        if (r != 0 && !why[0])
            snprintf(why, sizeof(why), "the host name %.255s does not resolve: %.100s", h.host[i],
                     gai_strerror(r));
    }
    pthread_mutex_lock(&st->addr_mu);
    for (unsigned i = 0; i < h.n; i++) {
        if (found[i][0])
            memcpy(st->addrs[i], found[i], sizeof(st->addrs[i]));
    }
    snprintf(st->resolve_why, sizeof(st->resolve_why), "%s", why);
    pthread_mutex_unlock(&st->addr_mu);
}

/* Appends <s> to the list <out> (<len> bytes), a comma before all but the first. */
static void list_add(char *out, size_t len, bool first, const char *s)
{
    size_t used = strlen(out);

    snprintf(out + used, len - used, "%s%s", first ? "" : ",", s);
}

int store_pg_target(struct store_pg *st, unsigned rotate, struct pg_target *t, char *why,
                    size_t why_len)
{
    struct pg_url_hosts h;
    unsigned n = 0;

    t->host[0] = t->hostaddr[0] = t->port[0] = '\0';
    if (pg_url_hosts(st->url, &h) < 0 || h.hostaddr || (!st->names && rotate % h.n == 0))
        return 0; /* the URL as it is: nothing to look up, nor to reorder */
    pthread_mutex_lock(&st->addr_mu);
    for (unsigned k = 0; k < h.n; k++) {
        unsigned i = (k + rotate) % h.n; /* from the host after the one that hung */
        bool name = pg_url_host_is_name(h.host[i]);

        if (name && !st->addrs[i][0])
            continue; /* never found: left out */
        list_add(t->host, sizeof(t->host), n == 0, h.host[i]);
        list_add(t->hostaddr, sizeof(t->hostaddr), n == 0, name ? st->addrs[i] : "");
        list_add(t->port, sizeof(t->port), n == 0, h.port[i]);
        n++;
    }
    if (n == 0)
        snprintf(why, why_len, "%s",
                 st->resolve_why[0] ? st->resolve_why : "no host name resolves yet");
    pthread_mutex_unlock(&st->addr_mu);
    return n ? 1 : -ENXIO;
}

bool store_pg_has_names(const char *url)
{
    struct pg_url_hosts h;

    if (pg_url_hosts(url, &h) < 0 || h.hostaddr)
        return false;
    for (unsigned i = 0; i < h.n; i++) {
        if (pg_url_host_is_name(h.host[i]))
            return true;
    }
    return false;
}
