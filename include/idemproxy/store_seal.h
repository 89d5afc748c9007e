/* SPDX-License-Identifier: MIT */
/* Encryption at rest as a store filter: a store that wraps any other, so
 * that answers are sealed (seal.h) on their way in (complete, resolve) and
 * opened on their way out (acquire, inspect, find_resource), and everything
 * above the store sees answers in clear. The other operations pass through
 * unchanged, on the wrapped store's threads. See doc/configuration.md,
 * "Encryption at rest". */
#ifndef IDEMPROXY_STORE_SEAL_H
#define IDEMPROXY_STORE_SEAL_H

#include "idemproxy/common.h"

struct seal_keys;
struct store;

/* Wraps <inner> (taken over: freed with the filter, also when this fails)
 * so that answers are sealed under the first of <keys> (taken over; NULL:
 * answers are kept in clear, and a sealed one found does not open).
 *
 * A stored answer that does not open (another key, a changed byte, a clear
 * answer while answers are sealed, or the memory to open it) is never
 * passed up as an answer: acquire gets STORE_UNREADABLE, with why in its
 * result, and inspect lists the record without it, saying why
 * (store_info.unreadable). An answer that cannot be sealed is never stored
 * in clear: a bare too-large marker of its status takes its place, which
 * does not open either, so its duplicates are refused and it never runs
 * twice. The trace context of a lock (store_lock.trace) is an id, not a
 * secret: it is kept in clear and comes back as it went in, with an answer
 * that does not open too. Returns 0 with the filter in <ret>, or -ENOMEM. */
int store_seal_new(struct store *inner, struct seal_keys *keys, struct store **ret);

#endif
