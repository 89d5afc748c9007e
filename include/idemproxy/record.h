/* SPDX-License-Identifier: MIT */
/* A response as captured from the upstream, stored, and replayed: status,
 * ordered headers (repeats kept) and body. Refcounted: the upstream thread
 * builds it, then the store, the front end and replays share it read-only. */
#ifndef IDEMPROXY_RECORD_H
#define IDEMPROXY_RECORD_H

#include <stdatomic.h>

#include "idemproxy/buf.h"
#include "idemproxy/common.h"

#define RECORD_MAX_HEADERS 256 /* a stored record never holds more */

struct record_header {
    char *name;  /* owned, NUL-terminated */
    char *value; /* owned, NUL-terminated */
};

struct record {
    atomic_int refs; /* record_ref()/record_unref() only */
    unsigned status;
    bool too_large; /* the marker of a response over --max-response: no headers, no body */
    bool sealed;    /* encrypted at rest (seal.h): status 0, no headers, the body seal_record()'s */
    struct record_header *headers; /* owned array of nheaders */
    size_t nheaders, headers_cap;
    struct buf body; /* owned */
};

/* Returns a new empty record (status 0, refs 1) whose body may grow to
 * <max_body> bytes, or NULL on OOM. */
struct record *record_new(size_t max_body);

/* A marker stored instead of an answer of <status> larger than the proxy
 * keeps (too_large set, no body): the request ran, and must not run again.
 * NULL on OOM. */
struct record *record_new_too_large(unsigned status);

/* Adds a reference to <rec> and returns it. NULL-safe. */
struct record *record_ref(struct record *rec);

/* Drops a reference; the last one frees the record. NULL-safe. */
void record_unref(struct record *rec);

/* Appends the header <name>: <value> (copied). Returns 0, -E2BIG past
 * RECORD_MAX_HEADERS, or -ENOMEM. */
int record_add_header(struct record *rec, struct span name, struct span value);

/* The value of the first header named <name> (case-insensitive), or NULL. */
const char *record_header_get(const struct record *rec, const char *name);

/* What an upstream's storage header (doc/configuration.md, The API steers
 * storage) asks of its answer. */
enum record_storage {
    RECORD_STORAGE_DEFAULT,  /* no such header: as the route says */
    RECORD_STORAGE_NO_STORE, /* "no-store": not kept; the lock is released */
    RECORD_STORAGE_TTL,      /* "ttl=S": kept S seconds (the caller caps them) */
    RECORD_STORAGE_INVALID,  /* anything else: ignored */
};

/* Parses a storage header's value <v>: "no-store", or "ttl=" and a positive
 * whole number of seconds, whose milliseconds go to <ret_ttl_ms> (a number
 * too large for them saturates at UINT64_MAX); the words in any case,
 * spaces and tabs around them skipped. */
enum record_storage record_storage_parse(struct span v, uint64_t *ret_ttl_ms);

/* Removes every header of <rec> named <name> (case-insensitive) and returns
 * what it asks, as record_storage_parse(); more than one is
 * RECORD_STORAGE_INVALID. The first one's value, cut to <len> - 1 bytes,
 * goes to <ret_value> (for the log); "" when there is none. */
enum record_storage record_take_storage(struct record *rec, const char *name, uint64_t *ret_ttl_ms,
                                        char *ret_value, size_t len);

/* Adds a Date header of now to <rec> unless it has one: a stored answer
 * needs its original Date, which every replay carries. An answer over
 * RECORD_MAX_HEADERS goes without. */
void record_ensure_date(struct record *rec);

/* Removes from <rec> the hop-by-hop headers, every header named in its
 * Connection headers, and Content-Length, keeping the order of the rest. */
void record_filter_hop_by_hop(struct record *rec);

/* The heap bytes <rec> holds (struct, header array and strings, body
 * capacity), each allocation counted with RECORD_MALLOC_OVERHEAD: what a
 * store keeping it pays. */
size_t record_mem_bytes(const struct record *rec);

#define RECORD_MALLOC_OVERHEAD 16 /* glibc: an 8-byte chunk header, 16-byte alignment */

/* Encodes status, flags and headers of <rec> (not the body) as a
 * length-prefixed binary block appended to <ret>. Returns 0 or -ENOMEM/-E2BIG. */
int record_encode_head(const struct record *rec, struct buf *ret);

/* Decodes a record from the head block <head> (made by record_encode_head)
 * and the body bytes <body> (copied). Returns 0 with a new record (refs 1) in
 * <ret>, -EPROTO if <head> is malformed or truncated, or -ENOMEM. */
int record_decode(struct span head, struct span body, struct record **ret);

#endif
