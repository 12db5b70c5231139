/* Containers of the native ledger (included by _ledger.c, one translation unit): an
 * open-addressing table of node ids keyed by Python objects, intrusive doubly linked lists over
 * int32 links, and growable pools of keys that are not blocks (ARC's ghosts, classic ARC's
 * ghost hits). Nothing here knows about slots, ref counts or policies. */
#ifndef KVOFFLOAD_LEDGER_CONTAINERS_H
#define KVOFFLOAD_LEDGER_CONTAINERS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NIL (-1)
#define ERR (-2)
enum { FREE_TAG = 0, T1 = 1, T2 = 2 };

/* A bucket: the node id (NIL when empty) and the top 32 bits of its key's mixed hash, so a probe
 * and a deletion's shifts read the bucket array alone, not the nodes' hash array. */
typedef struct {
    int32_t node;
    uint32_t mix;
} Bucket;

typedef struct {
    Bucket *b;
    int bits;
    Py_ssize_t used;
    /* bumped by every put, delete and growth: a key's __eq__ that changes the table (it runs
     * Python code in the middle of a probe) is caught, as dict catches it */
    uint64_t version;
} Table;

typedef struct {
    int32_t head, tail;
    Py_ssize_t size;
} List;

/* Keys that are not blocks (ghosts, ghost hits): growable nodes, a table, a free stack. */
typedef struct {
    int32_t nodes, allocated, nfree;
    PyObject **key;
    Py_hash_t *hash;
    int32_t *prev, *next, *free;
    int8_t *tag;
    Table index;
} Pool;

/* ---- open-addressing table ---------------------------------------------------------------- */

static inline uint32_t mix_of(Py_hash_t h) {
    return (uint32_t)(((uint64_t)h * 0x9E3779B97F4A7C15ULL) >> 32);
}

/* The home bucket: the mix's top bits (a table has at most 2^32 buckets). */
static inline uint64_t home(const Table *t, uint32_t mix) {
    return (uint64_t)mix >> (32 - t->bits);
}

static int tbl_bits(Py_ssize_t entries) {
    int bits = 3;
    while (((Py_ssize_t)1 << bits) < 2 * entries) bits++;
    return bits;
}

static void tbl_clear(Table *t, Bucket *b, int bits) {
    memset(b, 0xff, ((size_t)1 << bits) * sizeof(Bucket));
    t->b = b;
    t->bits = bits;
    t->used = 0;
    t->version = 0;
}

static int tbl_init(Table *t, Py_ssize_t entries) {
    int bits = tbl_bits(entries);
    Bucket *b = PyMem_Malloc(((size_t)1 << bits) * sizeof(Bucket));
    if (b == NULL) return -1;
    tbl_clear(t, b, bits);
    return 0;
}

/* tbl_init in a caller's buffer of `room` buckets when they are enough (a short-lived table on
 * the stack); 1 when it is used (nothing to free), 0 when the table was allocated, -1 on failure. */
static int tbl_init_in(Table *t, Py_ssize_t entries, Bucket *buf, size_t room) {
    int bits = tbl_bits(entries);
    if (((size_t)1 << bits) > room) return tbl_init(t, entries);
    tbl_clear(t, buf, bits);
    return 1;
}

/* Node holding key k (hash h), NIL when absent, ERR when comparing raised or changed the table.
 * The stored key is held across its comparison (its __eq__ may remove it), and nothing read
 * before the comparison (the buckets, the key array) is used after it if the table changed. */
static int32_t tbl_find(const Table *t, PyObject *const *keys, const Py_hash_t *hs, PyObject *k, Py_hash_t h) {
    uint32_t mix = mix_of(h);
    uint64_t mask = ((uint64_t)1 << t->bits) - 1, i = home(t, mix);
    for (;;) {
        Bucket e = t->b[i];
        if (e.node == NIL) return NIL;
        if (e.mix == mix && hs[e.node] == h) {
            PyObject *o = keys[e.node];
            if (o == k) return e.node;
            uint64_t version = t->version;
            Py_INCREF(o);
            int eq = PyObject_RichCompareBool(o, k, Py_EQ);
            Py_DECREF(o);
            if (eq < 0) return ERR;
            if (t->version != version) {
                PyErr_SetString(PyExc_RuntimeError, "the ledger changed while a key was being compared (a key's __eq__ "
                                "called into the ledger); block keys must compare without side effects");
                return ERR;
            }
            if (eq) return e.node;
        }
        i = (i + 1) & mask;
    }
}

/* Bucket e into the first free bucket of its probe run. */
static void tbl_place(Table *t, Bucket e) {
    uint64_t mask = ((uint64_t)1 << t->bits) - 1, i = home(t, e.mix);
    while (t->b[i].node != NIL) i = (i + 1) & mask;
    t->b[i] = e;
    t->used++;
}

static void tbl_put(Table *t, Py_hash_t h, int32_t node) {
    tbl_place(t, (Bucket){node, mix_of(h)});
    t->version++;
}

static void tbl_del(Table *t, const Py_hash_t *hs, int32_t node) {
    uint64_t mask = ((uint64_t)1 << t->bits) - 1, i = home(t, mix_of(hs[node]));
    while (t->b[i].node != node) i = (i + 1) & mask;
    uint64_t j = i;
    for (;;) { /* shift back every entry whose probe run crosses the hole */
        j = (j + 1) & mask;
        Bucket e = t->b[j];
        if (e.node == NIL) break;
        uint64_t k = home(t, e.mix);
        int stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        t->b[i] = e;
        i = j;
    }
    t->b[i].node = NIL;
    t->used--;
    t->version++;
}

static int tbl_grow(Table *t) {
    Table bigger;
    if (tbl_init(&bigger, t->used * 2 + 8) < 0) return -1;
    size_t n = (size_t)1 << t->bits;
    for (size_t i = 0; i < n; i++)
        if (t->b[i].node != NIL) tbl_place(&bigger, t->b[i]);
    PyMem_Free(t->b);
    bigger.version = t->version + 1;
    *t = bigger;
    return 0;
}

/* ---- intrusive lists ---------------------------------------------------------------------- */

static inline void l_append(int32_t *prev, int32_t *next, List *l, int32_t s) {
    prev[s] = l->tail;
    next[s] = NIL;
    if (l->tail != NIL) next[l->tail] = s; else l->head = s;
    l->tail = s;
    l->size++;
}

static inline void l_unlink(int32_t *prev, int32_t *next, List *l, int32_t s) {
    int32_t p = prev[s], n = next[s];
    if (p != NIL) next[p] = n; else l->head = n;
    if (n != NIL) prev[n] = p; else l->tail = p;
    l->size--;
}

static inline void l_to_tail(int32_t *prev, int32_t *next, List *l, int32_t s) {
    if (l->tail == s) return;
    l_unlink(prev, next, l, s);
    l_append(prev, next, l, s);
}

/* ---- key pools: ghosts (ARC) and ghost hits (classic ARC) ------------------------------ */

static int pool_init(Pool *p) {
    memset(p, 0, sizeof(*p));
    return tbl_init(&p->index, 32);
}

/* Frees everything and leaves the pool empty and unusable (all pointers NULL): safe twice. */
static void pool_free(Pool *p) {
    for (int32_t g = 0; p->key && g < p->allocated; g++) Py_CLEAR(p->key[g]);
    PyMem_Free(p->key);
    PyMem_Free(p->hash);
    PyMem_Free(p->prev);
    PyMem_Free(p->next);
    PyMem_Free(p->free);
    PyMem_Free(p->tag);
    PyMem_Free(p->index.b);
    memset(p, 0, sizeof(*p));
}

static int pool_traverse(Pool *p, visitproc visit, void *arg) {
    for (int32_t g = 0; p->key && g < p->allocated; g++) Py_VISIT(p->key[g]);
    return 0;
}

#define GROW(field, type)                                              \
    do {                                                               \
        type *grown = PyMem_Realloc(p->field, n * sizeof(type));       \
        if (!grown) return -1;                                         \
        p->field = grown;                                              \
    } while (0)

static int pool_reserve(Pool *p) {
    if (p->nfree || p->allocated < p->nodes) return 0;
    int32_t n = p->nodes ? p->nodes * 2 : 64;
    GROW(key, PyObject *);
    GROW(hash, Py_hash_t);
    GROW(prev, int32_t);
    GROW(next, int32_t);
    GROW(free, int32_t);
    GROW(tag, int8_t);
    p->nodes = n;
    return 0;
}

static inline int32_t pool_find(Pool *p, PyObject *k, Py_hash_t h) {
    return p->index.used ? tbl_find(&p->index, p->key, p->hash, k, h) : NIL;
}

/* A new node for key k tagged `tag`, or -1 on a memory error. */
static int32_t pool_add(Pool *p, PyObject *k, Py_hash_t h, int tag) {
    if (pool_reserve(p) < 0) return -1;
    if ((p->index.used + 1) * 2 > ((Py_ssize_t)1 << p->index.bits) && tbl_grow(&p->index) < 0) return -1;
    int32_t g = p->nfree ? p->free[--p->nfree] : p->allocated++;
    Py_INCREF(k);
    p->key[g] = k;
    p->hash[g] = h;
    p->tag[g] = (int8_t)tag;
    tbl_put(&p->index, h, g);
    return g;
}

static void pool_del(Pool *p, int32_t g) {
    tbl_del(&p->index, p->hash, g);
    Py_CLEAR(p->key[g]);
    p->tag[g] = FREE_TAG;
    p->free[p->nfree++] = g;
}

#endif
