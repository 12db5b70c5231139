/* prefix_value in C (included by ledger_policy.h): the semantics of
 * policies/prefix_value.py, which stays the reference the tests compare against op for op.
 * Kinds are small ids, the GreedyDual order an indexed min-heap of slots keyed by (priority,
 * sequence), the history a key pool in FIFO order with its fields in parallel arrays. One
 * difference: "the same request" compares the hashes of chain ends, the Python one the keys. */
#ifndef KVOFFLOAD_LEDGER_PREFIX_VALUE_H
#define KVOFFLOAD_LEDGER_PREFIX_VALUE_H
#include "ledger_containers.h"

#define PV_KINDS 30
#define PV_DEFAULT_KIND 23 /* seen once, body, new chain, > 32 new blocks: nothing known */
#define PV_GRID 64.0 /* values on a 1/64 grid: equal kinds tie, recency decides */

typedef struct {
    /* per slot */
    int8_t *kind;
    int32_t *sight, *depth, *pos; /* pos: index in heap, NIL when not in it */
    Py_hash_t *end;
    uint8_t *has_end;
    double *prio;
    uint64_t *seq, *epoch; /* epoch: the touch call of the last sighting */
    int32_t *heap, hsize;
    /* history: a key pool (tag = kind) in FIFO order; fields per pool node */
    Pool hist;
    List order;
    int32_t *hsight, *hdepth, hnodes;
    uint64_t *hepoch;
    Py_hash_t *hend;
    uint8_t *hhas_end;
    Py_ssize_t hist_size;
    double wins[PV_KINDS], trials[PV_KINDS];
    Py_ssize_t outcomes;
    double level, threshold, prior_a, prior_b;
    uint64_t seqc, epochc;
} PV;

/* Python: _kind(sightings, from_end, new_chain, new_blocks). */
static inline int pv_kind(int32_t sightings, Py_ssize_t from_end, int new_chain, Py_ssize_t new_blocks) {
    int fe = from_end == 0 ? 0 : (from_end < 4 ? 1 : 2);
    if (sightings > 1) return 24 + ((sightings < 4 ? sightings : 4) - 2) * 2 + (fe == 0);
    int nb = new_blocks <= 2 ? 0 : (new_blocks <= 8 ? 1 : (new_blocks <= 32 ? 2 : 3));
    return fe * 8 + new_chain * 4 + nb;
}

static inline double pv_value(const PV *pv, int kind) {
    return (pv->wins[kind] + pv->prior_a) / (pv->trials[kind] + pv->prior_a + pv->prior_b);
}

static void pv_outcome(PV *pv, int kind, int reused) {
    pv->trials[kind] += 1.0;
    if (reused) pv->wins[kind] += 1.0;
    if (++pv->outcomes >= pv->hist_size) {
        pv->outcomes = 0;
        for (int k = 0; k < PV_KINDS; k++) {
            pv->wins[k] *= 0.5;
            pv->trials[k] *= 0.5;
        }
    }
}

/* ---- the heap ------------------------------------------------------------------------------ */

/* Python's heap order: (priority, epoch, -depth, sequence). */
static inline int pv_less(const PV *pv, int32_t a, int32_t b) {
    if (pv->prio[a] != pv->prio[b]) return pv->prio[a] < pv->prio[b];
    if (pv->epoch[a] != pv->epoch[b]) return pv->epoch[a] < pv->epoch[b];
    if (pv->depth[a] != pv->depth[b]) return pv->depth[a] > pv->depth[b];
    return pv->seq[a] < pv->seq[b];
}

static inline void pv_place(PV *pv, int32_t i, int32_t s) {
    pv->heap[i] = s;
    pv->pos[s] = i;
}

static void pv_up(PV *pv, int32_t i) {
    int32_t s = pv->heap[i];
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (!pv_less(pv, s, pv->heap[parent])) break;
        pv_place(pv, i, pv->heap[parent]);
        i = parent;
    }
    pv_place(pv, i, s);
}

static void pv_down(PV *pv, int32_t i) {
    int32_t s = pv->heap[i], n = pv->hsize;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pv_less(pv, pv->heap[c + 1], pv->heap[c])) c++;
        if (!pv_less(pv, pv->heap[c], s)) break;
        pv_place(pv, i, pv->heap[c]);
        i = c;
    }
    pv_place(pv, i, s);
}

static void pv_heap_add(PV *pv, int32_t s) {
    pv->pos[s] = pv->hsize;
    pv->heap[pv->hsize++] = s;
    pv_up(pv, pv->hsize - 1);
}

static void pv_heap_del(PV *pv, int32_t s) {
    int32_t i = pv->pos[s], last = pv->heap[--pv->hsize];
    pv->pos[s] = NIL;
    if (i == pv->hsize) return;
    pv_place(pv, i, last);
    pv_up(pv, i);
    pv_down(pv, pv->pos[last]);
}

/* Python: _push. A fresh priority and sequence; the slot moves within the heap or joins it. */
static void pv_push(PV *pv, int32_t s) {
    pv->prio[s] = pv->level + (double)(int64_t)(pv_value(pv, pv->kind[s]) * PV_GRID) / PV_GRID;
    pv->seq[s] = ++pv->seqc;
    if (pv->pos[s] == NIL) {
        pv_heap_add(pv, s);
    } else {
        pv_up(pv, pv->pos[s]);
        pv_down(pv, pv->pos[s]);
    }
}

/* ---- the history ----------------------------------------------------------------------------- */

static int pv_hist_reserve(PV *pv) {
    if (pv->hist.nodes <= pv->hnodes) return 0;
    size_t n = (size_t)pv->hist.nodes;
    int32_t *a = PyMem_Realloc(pv->hsight, n * sizeof(int32_t));
    if (a) pv->hsight = a;
    int32_t *b = PyMem_Realloc(pv->hdepth, n * sizeof(int32_t));
    if (b) pv->hdepth = b;
    Py_hash_t *c = PyMem_Realloc(pv->hend, n * sizeof(Py_hash_t));
    if (c) pv->hend = c;
    uint8_t *d = PyMem_Realloc(pv->hhas_end, n);
    if (d) pv->hhas_end = d;
    uint64_t *e = PyMem_Realloc(pv->hepoch, n * sizeof(uint64_t));
    if (e) pv->hepoch = e;
    if (!a || !b || !c || !d || !e) return -1;
    pv->hnodes = pv->hist.nodes;
    return 0;
}

static void pv_hist_del(PV *pv, int32_t g) {
    l_unlink(pv->hist.prev, pv->hist.next, &pv->order, g);
    pool_del(&pv->hist, g);
}

/* Python: _remember. Key k's last sighting, newest in the FIFO; the oldest beyond the bound
 * leave as failed experiments. g: its node when the caller found one, else NIL. */
static int pv_remember(PV *pv, PyObject *k, Py_hash_t h, int32_t g, int kind, int32_t sight, int has_end,
                       Py_hash_t end, int32_t depth, uint64_t epoch) {
    if (g == NIL) {
        g = pool_add(&pv->hist, k, h, kind);
        if (g < 0 || pv_hist_reserve(pv) < 0) return -1;
        l_append(pv->hist.prev, pv->hist.next, &pv->order, g);
    } else {
        pv->hist.tag[g] = (int8_t)kind;
        l_to_tail(pv->hist.prev, pv->hist.next, &pv->order, g);
    }
    pv->hsight[g] = sight;
    pv->hdepth[g] = depth;
    pv->hend[g] = end;
    pv->hhas_end[g] = (uint8_t)has_end;
    pv->hepoch[g] = epoch;
    while (pv->order.size > pv->hist_size) {
        int32_t old = pv->order.head;
        pv_outcome(pv, pv->hist.tag[old], 0);
        pv_hist_del(pv, old);
    }
    return 0;
}

/* ---- life cycle ------------------------------------------------------------------------------ */

static PV *pv_new(int32_t cap) {
    PV *pv = PyMem_Calloc(1, sizeof(PV));
    if (!pv) return NULL;
    size_t n = (size_t)cap;
    pv->kind = PyMem_Calloc(n, 1);
    pv->sight = PyMem_Calloc(n, sizeof(int32_t));
    pv->depth = PyMem_Calloc(n, sizeof(int32_t));
    pv->pos = PyMem_Malloc(n * sizeof(int32_t));
    pv->end = PyMem_Calloc(n, sizeof(Py_hash_t));
    pv->has_end = PyMem_Calloc(n, 1);
    pv->prio = PyMem_Calloc(n, sizeof(double));
    pv->seq = PyMem_Calloc(n, sizeof(uint64_t));
    pv->epoch = PyMem_Calloc(n, sizeof(uint64_t));
    pv->heap = PyMem_Malloc(n * sizeof(int32_t));
    pv->hist_size = 2 * (Py_ssize_t)cap > 1024 ? 2 * (Py_ssize_t)cap : 1024; /* history_factor 2 */
    pv->threshold = 0.2;
    pv->prior_a = 1.0;
    pv->prior_b = 3.0;
    pv->order = (List){NIL, NIL, 0};
    if (!pv->kind || !pv->sight || !pv->depth || !pv->pos || !pv->end || !pv->has_end || !pv->prio || !pv->seq
        || !pv->epoch || !pv->heap || pool_init(&pv->hist) < 0)
        return pv; /* the caller sees a missing array and frees */
    for (int32_t s = 0; s < cap; s++) pv->pos[s] = NIL;
    return pv;
}

static int pv_complete(const PV *pv) {
    return pv->kind && pv->sight && pv->depth && pv->pos && pv->end && pv->has_end && pv->prio && pv->seq
           && pv->epoch && pv->heap && pv->hist.index.b;
}

static void pv_free(PV *pv) {
    if (!pv) return;
    PyMem_Free(pv->kind);
    PyMem_Free(pv->sight);
    PyMem_Free(pv->depth);
    PyMem_Free(pv->pos);
    PyMem_Free(pv->end);
    PyMem_Free(pv->has_end);
    PyMem_Free(pv->prio);
    PyMem_Free(pv->seq);
    PyMem_Free(pv->epoch);
    PyMem_Free(pv->heap);
    pool_free(&pv->hist);
    PyMem_Free(pv->hsight);
    PyMem_Free(pv->hdepth);
    PyMem_Free(pv->hend);
    PyMem_Free(pv->hhas_end);
    PyMem_Free(pv->hepoch);
    PyMem_Free(pv);
}

#endif
