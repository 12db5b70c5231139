/* The native ledger's state (included by ledger_policy.h and ledger_pv_policy.h, one
 * translation unit): the Ledger object's fields, per slot and per policy, and how a key is found.
 * Every policy reads it; none of it chooses a victim. */
#ifndef KVOFFLOAD_LEDGER_STATE_H
#define KVOFFLOAD_LEDGER_STATE_H
#include "ledger_containers.h"
#include "ledger_prefix_value.h"

enum { POL_LRU = 1, POL_ARC = 2, POL_CLASSIC = 3, POL_PV = 4 };

typedef struct {
    PyObject_HEAD
    int policy;
    int32_t cap;
    PyObject **key;
    Py_hash_t *khash;
    int32_t *prev, *next;
    int8_t *tag;
    uint8_t *mark;
    int32_t *free_stack;
    int32_t nfree, allocated;
    Py_buffer refs_buf;
    int32_t *refs;
    Table index;
    List list[3];
    /* ARC: target size of T1 (classic: p); ghosts B1/B2; classic ARC's pending ghost hits */
    double target;
    Pool ghosts, hits;
    List ghost[3];
    /* eviction scratch */
    int32_t *vbuf1, *vbuf2;
    PV *pv; /* prefix_value's state (POL_PV only) */
    int dead; /* cleared by the garbage collector: every method refuses */
} Ledger;

/* The slot holding key k (hash h), NIL when absent, ERR when comparing raised. */
static inline int32_t find(Ledger *self, PyObject *k, Py_hash_t h) {
    return tbl_find(&self->index, self->key, self->khash, k, h);
}

#endif
