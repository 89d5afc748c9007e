/* SPDX-License-Identifier: MIT */
/* Redis Cluster's client side, the pure parts (the Redis cluster
 * specification): the hash slot of a key (CRC16-XMODEM modulo 16384, hash
 * tags honoured), the slot map a CLUSTER SLOTS reply describes, and the
 * MOVED and ASK redirections. No I/O; any thread. */
#ifndef IDEMPROXY_REDIS_CLUSTER_H
#define IDEMPROXY_REDIS_CLUSTER_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "idemproxy/redis_url.h"

#define REDIS_CLUSTER_SLOTS 16384u
#define REDIS_CLUSTER_MAX_RANGES 16384u /* a CLUSTER SLOTS reply with more is refused */

/* CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection) of
 * <len> bytes at <s>: "123456789" gives 0x31C3. */
uint16_t redis_cluster_crc16(const void *s, size_t len);

/* The hash slot of the key <key> (<len> bytes, any bytes): the CRC16 of
 * the whole key modulo 16384, or, when the key holds a '{' followed later
 * by a '}' with at least one byte between them, of the bytes between the
 * first '{' and the first '}' after it (a hash tag). */
unsigned redis_cluster_key_slot(const void *key, size_t len);

enum redis_redirect_kind {
    REDIS_REDIRECT_MOVED, /* the slot lives elsewhere for good: update the map */
    REDIS_REDIRECT_ASK,   /* this one command goes elsewhere (a slot being migrated) */
};

struct redis_redirect {
    enum redis_redirect_kind kind;
    unsigned slot;
    struct redis_addr addr; /* where to send the command */
};

/* Parses the text of an error reply, "MOVED <slot> <host>:<port>" or "ASK
 * <slot> <host>:<port>": the port follows the last ':', so that an IPv6
 * address needs no brackets ("MOVED 1 ::1:7000"), though brackets are
 * accepted and removed. A host is 1-255 bytes of 0x21-0x7E. An empty host
 * (":7000", Redis 7 when the node does not know its own address) means
 * <self_host>, the host of the node that answered (NULL: refused); "?" (an
 * unknown endpoint) is refused. Returns 0 with <ret> filled, or -EINVAL for
 * any other text, a slot over 16383, a port of 0 or over 65535, or a host
 * too long for a struct redis_addr (<ret> untouched then). */
int redis_redirect_parse(const char *s, size_t len, const char *self_host,
                         struct redis_redirect *ret);

/* One range of slots and the master that serves it. */
struct redis_slot_range {
    unsigned first, last; /* inclusive, first <= last <= 16383 */
    struct redis_addr master;
};

/* Parses a CLUSTER SLOTS reply <r>: an array of [first, last, master,
 * replica…] where each node is [host, port, id?, …] (Redis 6 and 7; extra
 * elements, metadata maps included, are ignored). Hosts are checked as
 * redis_redirect_parse() checks them, replicas' too; an empty or nil host
 * means <self_host> (the node that answered); a host of "?" (unknown
 * endpoint) makes that range unusable, so it is left out. Overlapping
 * ranges are kept as they come (the caller's map: the later wins). Returns the number of
 * ranges (0 for an empty map: a cluster with no slot assigned) with a
 * malloc'ed array in <ret> (free() it; NULL when there are none), or
 * -EPROTO for a reply of another shape (a slot over 16383, first > last,
 * a port of 0 or over 65535, a host too long, more than
 * REDIS_CLUSTER_MAX_RANGES ranges), or -ENOMEM; <ret> untouched then. */
int redis_cluster_slots_parse(const redisReply *r, const char *self_host,
                              struct redis_slot_range **ret);

#endif
