/* The ledger's eviction policies (included by _ledger.c, one translation unit; their shared
 * state is ledger_state.h): LRU, ARC as vLLM ships it, and ARC as Megiddo & Modha specify it
 * (classic). The semantics are those of kvoffload/offload/{lru,arc}.py and
 * policies/arc_classic.py driven by the Python CPUOffloadingManager, the reference the tests
 * compare against op for op. */
#ifndef KVOFFLOAD_LEDGER_POLICY_H
#define KVOFFLOAD_LEDGER_POLICY_H
#include "ledger_state.h"

static void ghost_forget(Ledger *self, int32_t g) {
    Pool *p = &self->ghosts;
    l_unlink(p->prev, p->next, &self->ghost[p->tag[g]], g);
    pool_del(p, g);
}

/* Remember the key of slot s on ghost list `which` (B1 = T1, B2 = T2); the vLLM variant keeps
 * each list within the capacity, classic ARC bounds its directory when it evicts. */
static int ghost_add(Ledger *self, int which, int32_t s) {
    Pool *p = &self->ghosts;
    int32_t g = pool_add(p, self->key[s], self->khash[s], which);
    if (g < 0) return -1;
    l_append(p->prev, p->next, &self->ghost[which], g);
    if (self->policy == POL_ARC)
        while (self->ghost[which].size > self->cap) ghost_forget(self, self->ghost[which].head);
    return 0;
}

/* ---- slots and policy --------------------------------------------------------------------- */

#include "ledger_pv_policy.h" /* prefix_value's policy: its insert, touch, eviction and admission */

/* A new block joins T1, or T2 for classic ARC when it was a ghost hit; it stops being a ghost.
 * maybe_ghost=0: the caller knows the key is no ghost (it looked, and nothing made it one since). */
static void pol_insert(Ledger *self, int32_t s, int maybe_ghost) {
    if (self->policy == POL_PV) {
        self->tag[s] = T1; /* "in the policy"; the order is the heap's */
        pv_insert(self, s);
        return;
    }
    int which = T1;
    if (self->policy != POL_LRU) {
        PyObject *k = self->key[s];
        Py_hash_t h = self->khash[s];
        if (self->policy == POL_CLASSIC) {
            int32_t hit = pool_find(&self->hits, k, h);
            if (hit >= 0) {
                which = T2;
                pool_del(&self->hits, hit);
            }
        }
        int32_t g = maybe_ghost ? pool_find(&self->ghosts, k, h) : NIL;
        if (g >= 0) ghost_forget(self, g);
        /* Comparing keys the index already compared cannot fail; never leave an error set. */
        if (PyErr_Occurred()) PyErr_Clear();
    }
    self->tag[s] = (int8_t)which;
    l_append(self->prev, self->next, &self->list[which], s);
}

static inline void pol_remove(Ledger *self, int32_t s) {
    if (self->policy == POL_PV) {
        if (self->pv->pos[s] != NIL) pv_heap_del(self->pv, s);
        self->tag[s] = FREE_TAG;
        return;
    }
    l_unlink(self->prev, self->next, &self->list[self->tag[s]], s);
    self->tag[s] = FREE_TAG;
}

/* A touch of a key known to be absent: only the ghost lists react (see pol_touch). 1 when the
 * key is a ghost, 0 when it is not, -1 on an error. */
static int pol_touch_absent(Ledger *self, PyObject *k, Py_hash_t h) {
    if (self->policy == POL_LRU) return 0;
    int32_t g = pool_find(&self->ghosts, k, h);
    if (g == ERR) return -1;
    if (g == NIL) return 0;
    int which = self->ghosts.tag[g];
    if (self->policy == POL_CLASSIC) {
        int32_t hit = pool_find(&self->hits, k, h);
        if (hit == ERR) return -1;
        if (hit != NIL) return 1;
        if (pool_add(&self->hits, k, h, which) < 0) {
            PyErr_NoMemory();
            return -1;
        }
    } else {
        l_to_tail(self->ghosts.prev, self->ghosts.next, &self->ghost[which], g);
    }
    double b1 = (double)self->ghost[T1].size, b2 = (double)self->ghost[T2].size;
    if (which == T1) {
        double delta = b2 / b1 > 1.0 ? b2 / b1 : 1.0;
        self->target = self->target + delta < (double)self->cap ? self->target + delta : (double)self->cap;
    } else {
        double delta = b1 / b2 > 1.0 ? b1 / b2 : 1.0;
        self->target = self->target - delta > 0.0 ? self->target - delta : 0.0;
    }
    return 1;
}

/* One touched key. A ready T1 block moves to T2 (ARC); a ghost moves ARC's target: B1 up, B2
 * down. The vLLM variant re-ranks the ghost; classic ARC records the hit until the block is
 * stored again (then it joins T2) and adapts once per hit. */
static int pol_touch(Ledger *self, PyObject *k, Py_hash_t h) {
    int32_t s = find(self, k, h);
    if (s == ERR) return -1;
    if (s == NIL) return pol_touch_absent(self, k, h);
    if (self->policy != POL_LRU && self->tag[s] == T1 && self->refs[s] >= 0) {
        l_unlink(self->prev, self->next, &self->list[T1], s);
        self->tag[s] = T2;
        l_append(self->prev, self->next, &self->list[T2], s);
    } else {
        l_to_tail(self->prev, self->next, &self->list[self->tag[s]], s);
    }
    return 0;
}

/* A run of touched keys: the head ends most recent (LRU, ARC), or the tail (classic ARC, which
 * replays references in order). `absent`: keys known to be absent (store misses), so only the
 * ghost lists react and the index is not searched again; then `no_ghost` (or NULL) gets 1 at
 * each i whose key turned out to be no ghost. */
static int touch_run(Ledger *self, PyObject *const *items, const Py_hash_t *hs, Py_ssize_t n, int absent,
                     uint8_t *no_ghost) {
    if (self->policy == POL_PV) return pv_touch(self, items, hs, n);
    int (*one)(Ledger *, PyObject *, Py_hash_t) = absent ? pol_touch_absent : pol_touch;
    int forward = self->policy == POL_CLASSIC;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = forward ? j : n - 1 - j;
        int r = one(self, items[i], hs[i]);
        if (r < 0) return -1;
        if (no_ghost && absent && r == 0) no_ghost[i] = 1;
    }
    return 0;
}

/* Up to `want` evictable slots of list l (ref count 0, not marked), least recent first. */
static int32_t collect(Ledger *self, int which, int32_t want, int32_t *out) {
    int32_t got = 0;
    for (int32_t s = self->list[which].head; s != NIL && got < want; s = self->next[s])
        if (self->refs[s] == 0 && !self->mark[s]) out[got++] = s;
    return got;
}

static int32_t first_evictable(Ledger *self, int which) {
    int32_t s;
    return collect(self, which, 1, &s) ? s : NIL;
}

/* Classic ARC's REPLACE, with case IV's directory bounds unless the request is a ghost hit. */
static int classic_evict(Ledger *self, int32_t n, int32_t *out, int in_b2, int ghost_hit) {
    int32_t found = collect(self, T1, n, self->vbuf1);
    if (found < n) found += collect(self, T2, n - found, self->vbuf2);
    if (found < n) return 0;
    int32_t got = 0;
    while (got < n) {
        if (!ghost_hit) {
            Py_ssize_t t1 = self->list[T1].size, b1 = self->ghost[T1].size;
            if (t1 + b1 >= self->cap) {
                if (b1) {
                    ghost_forget(self, self->ghost[T1].head);
                } else {
                    int32_t s = first_evictable(self, T1);
                    if (s != NIL) { /* dropped outright, not remembered */
                        pol_remove(self, s);
                        out[got++] = s;
                        continue;
                    }
                }
            } else if (t1 + self->list[T2].size + b1 + self->ghost[T2].size >= 2 * (Py_ssize_t)self->cap
                       && self->ghost[T2].size) {
                ghost_forget(self, self->ghost[T2].head);
            }
        }
        double t1 = (double)self->list[T1].size;
        int first = (t1 >= 1 && ((in_b2 && t1 == self->target) || t1 > self->target)) ? T1 : T2;
        int which = first;
        int32_t s = first_evictable(self, first);
        if (s == NIL) {
            which = first == T1 ? T2 : T1;
            s = first_evictable(self, which);
        }
        pol_remove(self, s);
        if (ghost_add(self, which, s) < 0) return -1;
        out[got++] = s;
    }
    return 1;
}

/* Pick n victims into `out` (removed from the lists, ghosts recorded), or return 0 and change
 * nothing. -1 on a memory error. */
static int pol_evict(Ledger *self, int32_t n, int32_t *out, int in_b2, int ghost_hit) {
    if (self->policy == POL_LRU) {
        if (collect(self, T1, n, out) < n) return 0;
        for (int32_t i = 0; i < n; i++) pol_remove(self, out[i]);
        return 1;
    }
    if (self->policy == POL_PV) return pv_evict(self, n, out);
    if (self->policy == POL_CLASSIC) return classic_evict(self, n, out, in_b2, ghost_hit);
    int32_t t1 = (int32_t)self->list[T1].size;
    int64_t pref = (int64_t)t1 - (int64_t)self->target + 1;
    int32_t want1 = pref <= 0 ? 0 : (pref < n ? (int32_t)pref : n);
    int32_t *c1 = self->vbuf1, *c2 = self->vbuf2;
    int32_t k1 = want1 ? collect(self, T1, want1, c1) : 0, n1 = k1;
    int32_t n2 = n > k1 ? collect(self, T2, n - k1, c2) : 0;
    if (k1 + n2 < n) {
        n1 = collect(self, T1, n - n2, c1);
        if (n1 + n2 < n) return 0;
    }
    for (int32_t i = 0; i < n1; i++) pol_remove(self, c1[i]);
    for (int32_t i = 0; i < n2; i++) pol_remove(self, c2[i]);
    for (int32_t i = 0; i < n1; i++)
        if (ghost_add(self, T1, c1[i]) < 0) return -1;
    for (int32_t i = 0; i < n2; i++)
        if (ghost_add(self, T2, c2[i]) < 0) return -1;
    int32_t o = 0; /* preferred T1 victims, then T2, then T1 fallbacks */
    for (int32_t i = 0; i < k1; i++) out[o++] = c1[i];
    for (int32_t i = 0; i < n2; i++) out[o++] = c2[i];
    for (int32_t i = k1; i < n1; i++) out[o++] = c1[i];
    return 1;
}

static void slot_set(Ledger *self, int32_t s, PyObject *k, Py_hash_t h) {
    Py_INCREF(k);
    self->key[s] = k;
    self->khash[s] = h;
    tbl_put(&self->index, h, s);
}

static void slot_clear(Ledger *self, int32_t s) {
    tbl_del(&self->index, self->khash, s);
    Py_CLEAR(self->key[s]);
}

#endif
