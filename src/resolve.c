/* SPDX-License-Identifier: MIT */
/* Host names into socket addresses (resolve.h). Any thread; blocks for a name. */
#include "idemproxy/resolve.h"

#include <netdb.h>
#include <string.h>

unsigned resolve_host(const char *host, const char *port, int flags, struct resolve_addr *ret,
                      unsigned max, int *ret_gai)
{
    static const int families[] = { AF_INET, AF_INET6 };
    unsigned n = 0;
    int gai = 0;

    for (size_t f = (flags & RESOLVE_IPV6) ? 1 : 0; f < ARRAY_SIZE(families) && n < max; f++) {
        struct addrinfo hints = {
            .ai_family = families[f],
            .ai_socktype = SOCK_STREAM,
            .ai_flags = AI_NUMERICSERV | ((flags & RESOLVE_NUMERIC) ? AI_NUMERICHOST : 0),
        };
        struct addrinfo *res = NULL;
        int r = getaddrinfo(host, port, &hints, &res);

        for (const struct addrinfo *a = r == 0 ? res : NULL; a && n < max; a = a->ai_next) {
            if (a->ai_addrlen > sizeof(ret[n].sa))
                continue;
            memcpy(&ret[n].sa, a->ai_addr, a->ai_addrlen);
            ret[n++].len = a->ai_addrlen;
        }
        if (r != 0 && !gai)
            gai = r;
        if (res)
            freeaddrinfo(res);
    }
    if (ret_gai)
        *ret_gai = n ? 0 : gai;
    return n;
}

int resolve_host_text(const char *host, char *out, size_t len)
{
    struct resolve_addr a;
    int gai = 0;

    if (resolve_host(host, NULL, 0, &a, 1, &gai) == 0)
        return gai ? gai : EAI_NONAME;
    return getnameinfo((const struct sockaddr *)&a.sa, a.len, out, (socklen_t)len, NULL, 0,
                       NI_NUMERICHOST);
}
