/* SPDX-License-Identifier: MIT */
/* The one intrusive list: a struct list_node embedded in what is listed, a
 * struct list with a sentinel, doubly linked and circular, so that append,
 * remove and splice are O(1) and allocate nothing. An unlinked node has NULL
 * links. Not thread-safe: whoever owns the list locks it. A list holds
 * pointers to itself: it is initialised in place (list_init()) and never
 * copied by value (move its nodes with list_splice()). */
#ifndef IDEMPROXY_LIST_H
#define IDEMPROXY_LIST_H

#include "idemproxy/common.h"

struct list_node {
    struct list_node *prev, *next; /* NULL, NULL: not in a list */
};

struct list {
    struct list_node head; /* the sentinel: head.next is the first node */
};

/* The struct of type <type> whose member <member> is the node <n>. */
#define list_entry(n, type, member) ((type *)(void *)((char *)(n)-offsetof(type, member)))

/* Each node of <l> in order, as <n>; the current node may be removed. */
#define list_for_each_safe(l, n, tmp)                                                              \
    for ((n) = (l)->head.next, (tmp) = (n)->next; (n) != &(l)->head; (n) = (tmp), (tmp) = (n)->next)

static inline void list_init(struct list *l) { l->head.prev = l->head.next = &l->head; }

static inline bool list_is_empty(const struct list *l) { return l->head.next == &l->head; }

static inline bool list_is_linked(const struct list_node *n) { return n->next != NULL; }

/* The first node of <l>, or NULL when it is empty. */
static inline struct list_node *list_first(const struct list *l)
{
    return list_is_empty(l) ? NULL : l->head.next;
}

/* The last node of <l>, or NULL when it is empty. */
static inline struct list_node *list_last(const struct list *l)
{
    return list_is_empty(l) ? NULL : l->head.prev;
}

/* The node after <n> in <l>, or NULL when <n> is the last. */
static inline struct list_node *list_next(const struct list *l, const struct list_node *n)
{
    return n->next == &l->head ? NULL : n->next;
}

/* Appends the unlinked node <n> to <l>. */
static inline void list_append(struct list *l, struct list_node *n)
{
    n->prev = l->head.prev;
    n->next = &l->head;
    l->head.prev->next = n;
    l->head.prev = n;
}

/* Puts the unlinked node <n> first in <l>. */
static inline void list_prepend(struct list *l, struct list_node *n)
{
    n->next = l->head.next;
    n->prev = &l->head;
    l->head.next->prev = n;
    l->head.next = n;
}

/* Takes <n> out of its list; nothing when it is not in one. */
static inline void list_remove(struct list_node *n)
{
    if (!n->next)
        return;
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = NULL;
}

/* Moves every node of <from>, in order, to the end of <to>; <from> is empty. */
static inline void list_splice(struct list *to, struct list *from)
{
    if (list_is_empty(from))
        return;
    from->head.next->prev = to->head.prev;
    to->head.prev->next = from->head.next;
    from->head.prev->next = &to->head;
    to->head.prev = from->head.prev;
    list_init(from);
}

#endif
