/* SPDX-License-Identifier: MIT */
/* Host names into socket addresses: the one place that calls getaddrinfo().
 * One address family at a time, IPv4 first: a server listens on IPv4 more
 * often than not, "localhost" may list ::1 first, and asked for both at
 * once glibc sorts what it finds with the help of a netlink socket, which
 * the systemd unit's RestrictAddressFamilies does not allow. Blocking for a
 * name: call it off the event loops (an address literal never waits). */
#ifndef IDEMPROXY_RESOLVE_H
#define IDEMPROXY_RESOLVE_H

#include <sys/socket.h>

#include "idemproxy/common.h"

struct resolve_addr {
    struct sockaddr_storage sa;
    socklen_t len;
};

enum {
    RESOLVE_NUMERIC = 1 << 0, /* an address literal only: never a name lookup */
    RESOLVE_IPV6 = 1 << 1,    /* IPv6 addresses only (a bracketed [literal]) */
};

/* Looks <host> up for TCP on <port> (decimal digits; NULL: port 0), as
 * <flags> (RESOLVE_*) say, into at most <max> addresses of <ret>, IPv4 ones
 * first. Returns how many were found; with none, <ret_gai> (may be NULL)
 * gets the first getaddrinfo() error (0: no error, and no address). */
unsigned resolve_host(const char *host, const char *port, int flags, struct resolve_addr *ret,
                      unsigned max, int *ret_gai);

/* Writes the first address of <host> (IPv4 first) as numeric text into
 * <out> (<len> bytes). Returns 0, or the getaddrinfo() error. */
int resolve_host_text(const char *host, char *out, size_t len);

#endif
