/* The native ledger's prefix_value policy: how a slot enters its heap, how a run of keys is
 * touched, which slots it evicts and which offered blocks it admits (its state and heap are in
 * ledger_prefix_value.h). Included by ledger_policy.h. */
#ifndef KVOFFLOAD_LEDGER_PV_POLICY_H
#define KVOFFLOAD_LEDGER_PV_POLICY_H
#include "ledger_state.h"

/* ---- prefix_value (state and heap in ledger_prefix_value.h) -------------------------------- */

/* A new block takes the kind, sightings and chain end of its last sighting (Python: insert). */
static void pv_insert(Ledger *self, int32_t s) {
    PV *pv = self->pv;
    int32_t g = pool_find(&pv->hist, self->key[s], self->khash[s]);
    if (g == ERR) { /* comparing keys the index already compared cannot fail */
        PyErr_Clear();
        g = NIL;
    }
    if (g != NIL) {
        pv->kind[s] = pv->hist.tag[g];
        pv->sight[s] = pv->hsight[g];
        pv->depth[s] = pv->hdepth[g];
        pv->end[s] = pv->hend[g];
        pv->has_end[s] = pv->hhas_end[g];
        pv->epoch[s] = pv->hepoch[g];
        pv_hist_del(pv, g);
    } else {
        pv->kind[s] = PV_DEFAULT_KIND;
        pv->sight[s] = 1;
        pv->depth[s] = 0;
        pv->end[s] = 0;
        pv->has_end[s] = 0;
        pv->epoch[s] = pv->epochc;
    }
    pv_push(pv, s);
}

/* One touch call: the request's chain (or a suffix of it) in prefix order (Python: touch). */
static int pv_touch(Ledger *self, PyObject *const *items, const Py_hash_t *hs, Py_ssize_t n) {
    if (n == 0) return 0;
    PV *pv = self->pv;
    Py_hash_t end = hs[n - 1];
    uint64_t epoch = ++pv->epochc;
    Py_ssize_t known = 0;
    while (known < n) {
        int32_t s = find(self, items[known], hs[known]);
        if (s == ERR) return -1;
        if (s == NIL) {
            int32_t g = pool_find(&pv->hist, items[known], hs[known]);
            if (g == ERR) return -1;
            if (g == NIL) break;
        }
        known++;
    }
    int new_chain = known <= 1;
    Py_ssize_t new_blocks = n - known;
    for (Py_ssize_t i = n - 1; i >= 0; i--) { /* tail first: the head ends highest among equals */
        int32_t s = find(self, items[i], hs[i]);
        if (s == ERR) return -1;
        if (s != NIL) {
            if ((pv->has_end[s] && pv->end[s] == end) || self->refs[s] < 0) continue;
            pv_outcome(pv, pv->kind[s], 1);
            if (pv->sight[s] < (1 << 30)) pv->sight[s]++;
            pv->kind[s] = (int8_t)pv_kind(pv->sight[s], n - 1 - i, new_chain, new_blocks);
            pv->end[s] = end;
            pv->has_end[s] = 1;
            pv->depth[s] = (int32_t)i;
            pv->epoch[s] = epoch;
            pv_push(pv, s);
            continue;
        }
        int32_t g = pool_find(&pv->hist, items[i], hs[i]);
        if (g == ERR) return -1;
        if (g != NIL && pv->hhas_end[g] && pv->hend[g] == end) continue; /* this request's later call */
        int32_t sight = 1;
        if (g != NIL) {
            sight = pv->hsight[g] < (1 << 30) ? pv->hsight[g] + 1 : pv->hsight[g];
            pv_outcome(pv, pv->hist.tag[g], 1);
        }
        int kind = pv_kind(sight, n - 1 - i, new_chain, new_blocks);
        if (pv_remember(pv, items[i], hs[i], g, kind, sight, 1, end, (int32_t)i, epoch) < 0) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* GreedyDual's victims: the lowest priorities that are evictable, or 0 and nothing changed. */
static int pv_evict(Ledger *self, int32_t n, int32_t *out) {
    PV *pv = self->pv;
    int32_t got = 0, skipped = 0, *skip = self->vbuf1;
    while (pv->hsize && got < n) {
        int32_t s = pv->heap[0];
        pv_heap_del(pv, s);
        if (self->refs[s] != 0 || self->mark[s]) skip[skipped++] = s;
        else out[got++] = s;
    }
    for (int32_t i = 0; i < skipped; i++) pv_heap_add(pv, skip[i]);
    if (got < n) {
        for (int32_t i = 0; i < got; i++) pv_heap_add(pv, out[i]);
        return 0;
    }
    for (int32_t i = 0; i < got; i++) {
        int32_t s = out[i];
        if (pv->prio[s] > pv->level) pv->level = pv->prio[s];
        self->tag[s] = FREE_TAG;
        if (pv_remember(pv, self->key[s], self->khash[s], NIL, pv->kind[s], pv->sight[s], pv->has_end[s], pv->end[s],
                        pv->depth[s], pv->epoch[s]) < 0)
            return -1;
    }
    return 1;
}

/* Of the absent keys at newpos, those worth a slot (Python: admitted); -1 when comparing raised. */
static Py_ssize_t pv_admit(Ledger *self, PyObject *const *items, const Py_hash_t *hs, int32_t *newpos, Py_ssize_t nnew) {
    PV *pv = self->pv;
    if (self->index.used < self->cap) return nnew; /* room to spare: storing displaces nothing */
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < nnew; i++) {
        int32_t j = newpos[i];
        int32_t g = pool_find(&pv->hist, items[j], hs[j]);
        if (g == ERR) return -1;
        int kind = g == NIL ? PV_DEFAULT_KIND : pv->hist.tag[g];
        if (pv_value(pv, kind) >= pv->threshold) newpos[kept++] = j;
    }
    return kept;
}

#endif
