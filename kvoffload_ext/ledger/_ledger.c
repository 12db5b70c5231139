/* The CPU tier's block ledger in C: the hot half of kvoffload.offload.cpu_manager for the
 * policies named "lru", "arc" and "arc_classic", as the Python type kvoffload_ext.ledger._ledger.Ledger.
 *
 * Why C: the scheduler calls the ledger on every step with a few dozen hashes, and in Python the
 * per-hash work (dict probes, list moves, ref counts) costs more than everything vLLM's own manager
 * does around it. Here a request's run of hashes is one call.
 *
 * Semantics are exactly those of the Python ledger, which stays the reference and the fallback;
 * the tests check both against the textbook ledger and each other, op for op.
 *
 * Layout, per slot: the key object and its hash, prev/next links of the recency list the slot is
 * on, a list tag, a scratch mark, and the ref count (in a caller-owned array('i'), so Python sees
 * it live). Keys are found through an open-addressing table of slot ids: no Python object per
 * block. All memory comes from PyMem (tracemalloc sees it). Files: ledger_containers.h (table,
 * lists, key pools), ledger_policy.h (state and eviction), this one (arguments, methods, type).
 */
#include "ledger_policy.h"

/* A ledger the garbage collector cleared (it was in a reference cycle with one of its keys)
 * answers every call with this error instead of reading freed memory. */
#define DEAD_MESSAGE "this ledger was cleared by the garbage collector; it holds nothing"
#define ALIVE(self)                                                     \
    do {                                                                \
        if ((self)->dead) {                                             \
            PyErr_SetString(PyExc_RuntimeError, DEAD_MESSAGE);          \
            return NULL;                                                \
        }                                                               \
    } while (0)

/* ---- argument helpers --------------------------------------------------------------------- */

/* The argument as a private tuple (a list the caller passed could be emptied by a key's __hash__
 * or __eq__ while the loop reads it; the tuple holds every key) and its items' hashes. */
static PyObject *private_tuple(PyObject *arg, const char *what) {
    if (PyTuple_CheckExact(arg)) return Py_NewRef(arg);
    PyObject *t = PySequence_Tuple(arg);
    if (!t && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a sequence, not %.100s", what, Py_TYPE(arg)->tp_name);
    }
    return t;
}

/* A private tuple of the argument plus every item's hash (computed before anything changes). */
typedef struct {
    PyObject *seq;
    PyObject **items;
    Py_ssize_t n;
    Py_hash_t *hs;
    Py_hash_t small[64];
} Keys;

static int keys_get(Keys *kk, PyObject *arg) {
    kk->seq = private_tuple(arg, "block hashes");
    if (!kk->seq) return -1;
    kk->n = PySequence_Fast_GET_SIZE(kk->seq);
    kk->items = PySequence_Fast_ITEMS(kk->seq);
    kk->hs = kk->n <= 64 ? kk->small : PyMem_Malloc(kk->n * sizeof(Py_hash_t));
    if (!kk->hs) {
        Py_DECREF(kk->seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < kk->n; i++) {
        Py_hash_t h = PyObject_Hash(kk->items[i]);
        if (h == -1) {
            if (kk->hs != kk->small) PyMem_Free(kk->hs);
            Py_DECREF(kk->seq);
            return -1;
        }
        kk->hs[i] = h;
    }
    return 0;
}

static void keys_free(Keys *kk) {
    if (kk->hs != kk->small) PyMem_Free(kk->hs);
    Py_DECREF(kk->seq);
}

/* ---- methods ------------------------------------------------------------------------------ */

static PyObject *L_lookup(Ledger *self, PyObject *arg) {
    ALIVE(self);
    PyObject *seq = private_tuple(arg, "block hashes");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), hits = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (; hits < n; hits++) {
        Py_hash_t h = PyObject_Hash(items[hits]);
        if (h == -1) goto fail;
        int32_t s = find(self, items[hits], h);
        if (s == ERR) goto fail;
        if (s == NIL || self->refs[s] < 0) break;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(hits);
fail:
    Py_DECREF(seq);
    return NULL;
}

/* Slots of every key, or (position, 0) of the first absent key, else (position, 1) of the first
 * refused one (pin: still being written; unpin: not pinned); change nothing. */
static PyObject *check_slots(Ledger *self, Keys *kk, int32_t *slots, int pin) {
    for (Py_ssize_t i = 0; i < kk->n; i++) {
        int32_t s = find(self, kk->items[i], kk->hs[i]);
        if (s == ERR) return NULL;
        if (s == NIL) return Py_BuildValue("(ni)", i, 0);
        slots[i] = s;
    }
    if (pin) {
        for (Py_ssize_t i = 0; i < kk->n; i++)
            if (self->refs[slots[i]] < 0) return Py_BuildValue("(ni)", i, 1);
        return Py_None; /* borrowed marker: all good */
    }
    /* unpin: a key given twice needs two pins, so release them one by one and put back what
     * was released at the first that is not pinned (nothing else runs meanwhile: no Python code) */
    for (Py_ssize_t i = 0; i < kk->n; i++) {
        if (self->refs[slots[i]] <= 0) {
            for (Py_ssize_t j = 0; j < i; j++) self->refs[slots[j]] += 1;
            return Py_BuildValue("(ni)", i, 1);
        }
        self->refs[slots[i]] -= 1;
    }
    return Py_None;
}

/* Slot ids as the native-endian int64s of a bytearray: the spec's numpy array views it
 * (np.frombuffer) instead of converting a list of Python ints one by one. */
static PyObject *slot_buffer(const int32_t *s, Py_ssize_t n) {
    PyObject *b = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (!b) return NULL;
    int64_t *out = (int64_t *)PyByteArray_AS_STRING(b);
    for (Py_ssize_t i = 0; i < n; i++) out[i] = s[i];
    return b;
}

static PyObject *slot_list(const int32_t *s, Py_ssize_t n) {
    PyObject *l = PyList_New(n);
    for (Py_ssize_t i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromLong(s[i]);
        if (!v) Py_CLEAR(l);
        else PyList_SET_ITEM(l, i, v);
    }
    return l;
}

/* One read pin more (pin: the keys' slots come back) or less (unpin: None) on every key; or
 * check_slots' (position, reason) and nothing changed. */
static PyObject *change_pins(Ledger *self, PyObject *arg, int pin) {
    ALIVE(self);
    Keys kk;
    if (keys_get(&kk, arg) < 0) return NULL;
    int32_t *slots = PyMem_Malloc((kk.n + 1) * sizeof(int32_t));
    PyObject *res = NULL;
    if (!slots) { PyErr_NoMemory(); goto done; }
    res = check_slots(self, &kk, slots, pin);
    if (res != Py_None) goto done;
    if (!pin) { /* check_slots released them */
        res = Py_NewRef(Py_None);
        goto done;
    }
    res = slot_buffer(slots, kk.n);
    if (!res) goto done;
    for (Py_ssize_t i = 0; i < kk.n; i++) self->refs[slots[i]] += 1;
done:
    PyMem_Free(slots);
    keys_free(&kk);
    return res;
}

static PyObject *L_pin(Ledger *self, PyObject *arg) { return change_pins(self, arg, 1); }

static PyObject *L_unpin(Ledger *self, PyObject *arg) { return change_pins(self, arg, 0); }

static PyObject *L_touch(Ledger *self, PyObject *arg) {
    ALIVE(self);
    Keys kk;
    if (keys_get(&kk, arg) < 0) return NULL;
    int rc = touch_run(self, kk.items, kk.hs, kk.n);
    keys_free(&kk);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *L_refresh(Ledger *self, PyObject *arg) {
    ALIVE(self);
    if (self->policy == POL_CLASSIC || self->policy == POL_PV) Py_RETURN_NONE; /* no notion of it */
    Keys kk;
    if (keys_get(&kk, arg) < 0) return NULL;
    for (Py_ssize_t i = kk.n - 1; i >= 0; i--) {
        int32_t s = find(self, kk.items[i], kk.hs[i]);
        if (s == ERR) { keys_free(&kk); return NULL; }
        if (s != NIL) l_to_tail(self->prev, self->next, &self->list[self->tag[s]], s);
    }
    keys_free(&kk);
    Py_RETURN_NONE;
}

/* The absent keys (in order, repeats kept); ARC's ghost lists see them as touches. */
static PyObject *L_store_miss(Ledger *self, PyObject *arg) {
    ALIVE(self);
    Keys kk;
    if (keys_get(&kk, arg) < 0) return NULL;
    PyObject *missing = PyList_New(0);
    Py_hash_t *mh = PyMem_Malloc((kk.n + 1) * sizeof(Py_hash_t)); /* the missing keys' hashes */
    if (!missing || !mh) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t i = 0; i < kk.n; i++) {
        int32_t s = find(self, kk.items[i], kk.hs[i]);
        if (s == ERR) goto fail;
        if (s != NIL) continue;
        mh[PyList_GET_SIZE(missing)] = kk.hs[i];
        if (PyList_Append(missing, kk.items[i]) < 0) goto fail;
    }
    if (self->policy != POL_LRU && touch_run(self, PySequence_Fast_ITEMS(missing), mh, PyList_GET_SIZE(missing)) < 0)
        goto fail;
    PyMem_Free(mh);
    keys_free(&kk);
    return missing;
fail:
    Py_XDECREF(missing);
    PyMem_Free(mh);
    keys_free(&kk);
    return NULL;
}

/* (new keys, their slots, evicted keys, evicted slots), or None when the tier cannot make room. */
static PyObject *L_prepare_store(Ledger *self, PyObject *arg) {
    ALIVE(self);
    Keys kk;
    if (keys_get(&kk, arg) < 0) return NULL;
    Py_ssize_t n = kk.n;
    PyObject *result = NULL, *new_keys = NULL, *evicted = NULL;
    Table seen = {NULL, 0, 0, 0};
    int32_t *newpos = PyMem_Malloc((n + 1) * sizeof(int32_t));
    int32_t *marked = PyMem_Malloc((n + 1) * sizeof(int32_t));
    int32_t *victims = NULL, *slots = NULL;
    Py_ssize_t nnew = 0, nmarked = 0, need = 0;
    int in_b2 = 0, ghost_hit = 0;
    if (!newpos || !marked || tbl_init(&seen, n) < 0) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) { /* first occurrences; offered residents are protected */
        int32_t d = tbl_find(&seen, kk.items, kk.hs, kk.items[i], kk.hs[i]);
        if (d == ERR) goto done;
        if (d != NIL) continue;
        tbl_put(&seen, kk.hs[i], (int32_t)i);
        int32_t s = find(self, kk.items[i], kk.hs[i]);
        if (s == ERR) goto done;
        if (s == NIL) newpos[nnew++] = (int32_t)i;
        else if (!self->mark[s]) { self->mark[s] = 1; marked[nmarked++] = s; }
        if (self->policy == POL_CLASSIC) { /* an offered ghost hit: REPLACE's B2 case, no case IV */
            int32_t hit = pool_find(&self->hits, kk.items[i], kk.hs[i]);
            if (hit == ERR) goto done;
            if (hit != NIL) {
                ghost_hit = 1;
                in_b2 |= self->hits.tag[hit] == T2;
            }
        }
    }
    if (self->policy == POL_PV && nnew) {
        nnew = pv_admit(self, kk.items, kk.hs, newpos, nnew);
        if (nnew < 0) goto done;
    }
    need = nnew - (self->nfree + (self->cap - self->allocated));
    if (need > self->cap) { result = Py_None; goto done; }
    victims = PyMem_Malloc((need > 0 ? need : 1) * sizeof(int32_t));
    if (!victims) { PyErr_NoMemory(); goto done; }
    if (need > 0) {
        int ok = pol_evict(self, (int32_t)need, victims, in_b2, ghost_hit);
        if (ok < 0) { PyErr_NoMemory(); goto done; }
        if (!ok) { result = Py_None; goto done; }
    } else {
        need = 0;
    }
    evicted = PyList_New(need);
    if (!evicted) goto done;
    for (Py_ssize_t i = 0; i < need; i++) {
        int32_t s = victims[i];
        PyList_SET_ITEM(evicted, i, self->key[s]); /* the slot's reference moves to the list */
        tbl_del(&self->index, self->khash, s);
        self->key[s] = NULL;
        self->free_stack[self->nfree++] = s;
    }
    slots = PyMem_Malloc((nnew + 1) * sizeof(int32_t));
    new_keys = PyList_New(nnew);
    if (!slots || !new_keys) goto done;
    for (Py_ssize_t i = 0; i < nnew; i++) {
        int32_t s = self->allocated < self->cap ? self->allocated++ : self->free_stack[--self->nfree];
        PyObject *k = kk.items[newpos[i]];
        slots[i] = s;
        slot_set(self, s, k, kk.hs[newpos[i]]);
        self->refs[s] = -1;
        pol_insert(self, s);
        Py_INCREF(k);
        PyList_SET_ITEM(new_keys, i, k);
    }
    {
        PyObject *slot_l = slot_buffer(slots, nnew), *vict_l = slot_list(victims, need);
        if (slot_l && vict_l) result = PyTuple_Pack(4, new_keys, slot_l, evicted, vict_l);
        Py_XDECREF(slot_l);
        Py_XDECREF(vict_l);
    }
done:
    for (Py_ssize_t i = 0; i < nmarked; i++) self->mark[marked[i]] = 0;
    if (result == Py_None) Py_INCREF(Py_None);
    Py_XDECREF(new_keys);
    Py_XDECREF(evicted);
    PyMem_Free(seen.b);
    PyMem_Free(newpos);
    PyMem_Free(marked);
    PyMem_Free(victims);
    PyMem_Free(slots);
    keys_free(&kk);
    return result;
}

static void forget(Ledger *self, int32_t s) {
    pol_remove(self, s);
    slot_clear(self, s);
    self->refs[s] = 0;
    self->free_stack[self->nfree++] = s;
}

/* The keys whose slot has ref count `want` (each once, in order): each is then released to ref
 * count 0, or forgotten. */
static PyObject *settle(Ledger *self, PyObject *arg, int32_t want, int forget_them) {
    ALIVE(self);
    Keys kk;
    if (keys_get(&kk, arg) < 0) return NULL;
    PyObject *out = PyList_New(kk.n); /* room for every key; its length is set to those settled */
    if (!out) goto fail;
    Py_ssize_t got = 0;
    for (Py_ssize_t i = 0; i < kk.n; i++) {
        int32_t s = find(self, kk.items[i], kk.hs[i]);
        if (s == ERR) goto fail;
        if (s == NIL || self->refs[s] != want) continue;
        PyList_SET_ITEM(out, got++, Py_NewRef(kk.items[i]));
        if (forget_them) forget(self, s);
        else self->refs[s] = 0;
    }
    Py_SET_SIZE(out, got); /* the unused tail is NULL, as a new list's is */
    keys_free(&kk);
    return out;
fail:
    Py_XDECREF(out);
    keys_free(&kk);
    return NULL;
}

/* Keys whose pending store this finishes; a failed store forgets them. */
static PyObject *L_complete_store(Ledger *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "complete_store(keys, success=True) takes 1 or 2 arguments, not %zd", nargs);
        return NULL;
    }
    int success = nargs == 2 ? PyObject_IsTrue(args[1]) : 1;
    if (success < 0) return NULL;
    return settle(self, args[0], -1, !success);
}

/* Forget ready, unpinned blocks; returns the keys dropped. */
static PyObject *L_drop(Ledger *self, PyObject *arg) {
    return settle(self, arg, 0, 1);
}

/* Re-admit ready blocks at known slots, sorted by slot by the caller; only while empty. Each slot
 * is converted once (a slot's __index__ may answer differently each time), slots and keys must
 * be distinct, and a refused restore changes nothing. */
static PyObject *L_restore(Ledger *self, PyObject *args) {
    ALIVE(self);
    PyObject *karg, *sarg;
    if (!PyArg_ParseTuple(args, "OO", &karg, &sarg)) return NULL;
    if (self->index.used || self->allocated) {
        PyErr_SetString(PyExc_ValueError, "restore() needs an empty ledger");
        return NULL;
    }
    Keys kk;
    if (keys_get(&kk, karg) < 0) return NULL;
    PyObject *sseq = private_tuple(sarg, "slots");
    if (!sseq) { keys_free(&kk); return NULL; }
    Py_ssize_t n = kk.n;
    int32_t top = 0;
    int32_t *slot = PyMem_Malloc((n + 1) * sizeof(int32_t));
    Table seen = {NULL, 0, 0, 0};
    if (!slot || tbl_init(&seen, n) < 0) { PyErr_NoMemory(); goto fail; }
    if (PyTuple_GET_SIZE(sseq) != n) {
        PyErr_SetString(PyExc_ValueError, "restore(): one slot per key");
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long s = PyLong_AsLong(PyTuple_GET_ITEM(sseq, i));
        if (s == -1 && PyErr_Occurred()) goto fail;
        if (s < 0 || s >= self->cap) {
            PyErr_Format(PyExc_ValueError, "restore(): slot %ld is out of range 0..%d", s, self->cap - 1);
            goto fail;
        }
        slot[i] = (int32_t)s;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* keys compare here: Python code, before anything changes */
        int32_t d = tbl_find(&seen, kk.items, kk.hs, kk.items[i], kk.hs[i]);
        if (d == ERR) goto fail;
        if (d != NIL) {
            PyErr_Format(PyExc_ValueError, "restore(): key at position %zd is given twice", i);
            goto fail;
        }
        tbl_put(&seen, kk.hs[i], (int32_t)i);
    }
    if (self->index.used || self->allocated) { /* a key's __eq__ called into the ledger */
        PyErr_SetString(PyExc_RuntimeError, "restore(): the ledger changed while the keys were compared");
        goto fail;
    }
    Py_ssize_t twice = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (self->mark[slot[i]]) { twice = i; break; }
        self->mark[slot[i]] = 1;
    }
    if (twice >= 0) {
        for (Py_ssize_t i = 0; i < n; i++) self->mark[slot[i]] = 0;
        PyErr_Format(PyExc_ValueError, "restore(): slot %d is given twice", slot[twice]);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (slot[i] + 1 > top) top = slot[i] + 1;
    for (int32_t s = top - 1; s >= 0; s--) /* lowest free slot popped first */
        if (!self->mark[s]) self->free_stack[self->nfree++] = s;
    self->allocated = top;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t s = slot[i];
        self->mark[s] = 0;
        slot_set(self, s, kk.items[i], kk.hs[i]);
        self->refs[s] = 0;
        pol_insert(self, s);
    }
    PyMem_Free(slot);
    PyMem_Free(seen.b);
    Py_DECREF(sseq);
    keys_free(&kk);
    Py_RETURN_NONE;
fail:
    PyMem_Free(slot);
    PyMem_Free(seen.b);
    Py_DECREF(sseq);
    keys_free(&kk);
    return NULL;
}

/* ---- single-key queries (vLLM asks one key at a time) ------------------------------------- */

static int32_t find_one(Ledger *self, PyObject *k) {
    if (self->dead) {
        PyErr_SetString(PyExc_RuntimeError, DEAD_MESSAGE);
        return ERR;
    }
    Py_hash_t h = PyObject_Hash(k);
    return h == -1 ? ERR : find(self, k, h);
}

static PyObject *L_slot_of(Ledger *self, PyObject *k) {
    int32_t s = find_one(self, k);
    if (s == ERR) return NULL;
    if (s == NIL) Py_RETURN_NONE;
    return PyLong_FromLong(s);
}

static PyObject *L_is_ready(Ledger *self, PyObject *k) {
    int32_t s = find_one(self, k);
    if (s == ERR) return NULL;
    return PyBool_FromLong(s != NIL && self->refs[s] >= 0);
}

static PyObject *L_is_pending(Ledger *self, PyObject *k) {
    int32_t s = find_one(self, k);
    if (s == ERR) return NULL;
    return PyBool_FromLong(s != NIL && self->refs[s] < 0);
}

static int L_contains(Ledger *self, PyObject *k) {
    int32_t s = find_one(self, k);
    return s == ERR ? -1 : s != NIL;
}

static PyObject *L_hash_at(Ledger *self, PyObject *arg) {
    ALIVE(self);
    long s = PyLong_AsLong(arg);
    if (s == -1 && PyErr_Occurred()) return NULL;
    if (s < 0 || s >= self->cap) {
        PyErr_Format(PyExc_IndexError, "slot %ld is out of range 0..%d", s, self->cap - 1);
        return NULL;
    }
    PyObject *k = self->key[s] ? self->key[s] : Py_None;
    Py_INCREF(k);
    return k;
}

static PyObject *L_busy(Ledger *self, PyObject *unused) {
    ALIVE(self);
    Py_ssize_t reading = 0, writing = 0;
    for (int32_t s = 0; s < self->allocated; s++) {
        reading += self->refs[s] > 0;
        writing += self->refs[s] < 0;
    }
    return Py_BuildValue("(nn)", reading, writing);
}

/* ---- inspection (tests, debugging) -------------------------------------------------------- */

static PyObject *L_items(Ledger *self, PyObject *unused) {
    ALIVE(self);
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (int32_t s = 0; s < self->allocated; s++) {
        if (!self->key[s]) continue;
        PyObject *t = Py_BuildValue("(Oi)", self->key[s], s);
        if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_DECREF(out); return NULL; }
        Py_DECREF(t);
    }
    return out;
}

/* 1 or 2 from a Python int, else -1 with ValueError naming `what`. */
static int list_id(PyObject *arg, const char *what) {
    long which = PyLong_AsLong(arg);
    if (which == T1 || which == T2) return (int)which;
    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: got %ld, use 1 or 2", what, which);
    return -1;
}

static PyObject *L_order(Ledger *self, PyObject *arg) {
    ALIVE(self);
    int which = list_id(arg, "list (1 = T1 or LRU, 2 = T2)");
    if (which < 0) return NULL;
    PyObject *out = PyList_New(0);
    for (int32_t s = self->list[which].head; out && s != NIL; s = self->next[s]) {
        PyObject *v = PyLong_FromLong(s);
        if (!v || PyList_Append(out, v) < 0) Py_CLEAR(out);
        Py_XDECREF(v);
    }
    return out;
}

static PyObject *L_ghosts(Ledger *self, PyObject *arg) {
    ALIVE(self);
    int which = list_id(arg, "ghost list (1 = B1, 2 = B2)");
    if (which < 0) return NULL;
    PyObject *out = PyList_New(0);
    for (int32_t g = self->ghost[which].head; out && g != NIL; g = self->ghosts.next[g])
        if (PyList_Append(out, self->ghosts.key[g]) < 0) Py_CLEAR(out);
    return out;
}

static PyObject *L_ghost_hits(Ledger *self, PyObject *unused) {
    ALIVE(self);
    PyObject *out = PyList_New(0);
    for (int32_t g = 0; out && g < self->hits.allocated; g++) {
        if (!self->hits.key[g]) continue;
        PyObject *t = Py_BuildValue("(Oi)", self->hits.key[g], (int)self->hits.tag[g]);
        if (!t || PyList_Append(out, t) < 0) Py_CLEAR(out);
        Py_XDECREF(t);
    }
    return out;
}

static PyObject *L_get_target(Ledger *self, void *c) { return PyFloat_FromDouble(self->target); }
static PyObject *L_get_used(Ledger *self, void *c) { return PyLong_FromSsize_t(self->index.used); }
static PyObject *L_get_free(Ledger *self, void *c) { return PyLong_FromLong(self->nfree + self->cap - self->allocated); }
static PyObject *L_get_sizes(Ledger *self, void *c) {
    return Py_BuildValue("(nn)", self->list[T1].size, self->list[T2].size);
}

/* ---- type --------------------------------------------------------------------------------- */

static int L_init(Ledger *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"capacity", "policy", "refs", NULL};
    int cap, policy;
    PyObject *refs;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiO", kw, &cap, &policy, &refs)) return -1;
    if (cap < 1 || policy < POL_LRU || policy > POL_PV) {
        PyErr_Format(PyExc_ValueError, "Ledger(capacity=%d, policy=%d): capacity >= 1, policy 1 (LRU), 2 (ARC), "
                     "3 (classic ARC) or 4 (prefix_value)", cap, policy);
        return -1;
    }
    if (PyObject_GetBuffer(refs, &self->refs_buf, PyBUF_WRITABLE | PyBUF_FORMAT) < 0) return -1;
    if (self->refs_buf.itemsize != 4 || self->refs_buf.len < (Py_ssize_t)cap * 4 || strcmp(self->refs_buf.format, "i") != 0) {
        PyBuffer_Release(&self->refs_buf);
        self->refs_buf.obj = NULL;
        PyErr_Format(PyExc_ValueError, "refs must be a writable array('i') of at least %d items", cap);
        return -1;
    }
    self->refs = self->refs_buf.buf;
    self->cap = cap;
    self->policy = policy;
    size_t n = (size_t)cap;
    self->key = PyMem_Calloc(n, sizeof(PyObject *));
    self->khash = PyMem_Malloc(n * sizeof(Py_hash_t));
    self->prev = PyMem_Malloc(n * sizeof(int32_t));
    self->next = PyMem_Malloc(n * sizeof(int32_t));
    self->tag = PyMem_Calloc(n, 1);
    self->mark = PyMem_Calloc(n, 1);
    self->free_stack = PyMem_Malloc(n * sizeof(int32_t));
    self->vbuf1 = policy != POL_LRU ? PyMem_Malloc(n * sizeof(int32_t)) : NULL;
    self->vbuf2 = policy != POL_LRU ? PyMem_Malloc(n * sizeof(int32_t)) : NULL;
    if (!self->key || !self->khash || !self->prev || !self->next || !self->tag || !self->mark || !self->free_stack
        || (policy != POL_LRU && (!self->vbuf1 || !self->vbuf2)) || tbl_init(&self->index, cap) < 0
        || pool_init(&self->ghosts) < 0 || pool_init(&self->hits) < 0
        || (policy == POL_PV && (!(self->pv = pv_new(cap)) || !pv_complete(self->pv)))) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        self->list[i] = (List){NIL, NIL, 0};
        self->ghost[i] = (List){NIL, NIL, 0};
    }
    return 0;
}

/* Built whole in tp_new (no separate __init__): no Ledger exists that a method could reach
 * before its arrays do. */
static PyObject *L_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Ledger *self = (Ledger *)type->tp_alloc(type, 0); /* zeroed: dealloc copes with a partial one */
    if (!self) return NULL;
    if (L_init(self, args, kwds) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* Frees every array and drops every key, marking the ledger dead first (a key's __del__ may call
 * back into it); safe twice. */
static void L_release(Ledger *self) {
    self->dead = 1;
    PyObject **keys = self->key;
    int32_t cap = self->cap;
    self->key = NULL;
    if (keys)
        for (int32_t s = 0; s < cap; s++) Py_CLEAR(keys[s]);
    PyMem_Free(keys);
    PyMem_Free(self->khash);
    PyMem_Free(self->prev);
    PyMem_Free(self->next);
    PyMem_Free(self->tag);
    PyMem_Free(self->mark);
    PyMem_Free(self->free_stack);
    PyMem_Free(self->vbuf1);
    PyMem_Free(self->vbuf2);
    PyMem_Free(self->index.b);
    self->khash = NULL;
    self->prev = self->next = self->free_stack = self->vbuf1 = self->vbuf2 = NULL;
    self->tag = NULL;
    self->mark = NULL;
    self->index.b = NULL;
    pool_free(&self->ghosts);
    pool_free(&self->hits);
    PV *pv = self->pv;
    self->pv = NULL;
    pv_free(pv);
    if (self->refs_buf.obj) PyBuffer_Release(&self->refs_buf);
    self->refs_buf.obj = NULL;
    self->refs = NULL;
}

/* The garbage collector sees the keys (a key may refer to its ledger: a cycle) and the refs
 * array. */
static int L_traverse(Ledger *self, visitproc visit, void *arg) {
    for (int32_t s = 0; self->key && s < self->cap; s++) Py_VISIT(self->key[s]);
    int rc = pool_traverse(&self->ghosts, visit, arg);
    if (!rc) rc = pool_traverse(&self->hits, visit, arg);
    if (!rc && self->pv) rc = pool_traverse(&self->pv->hist, visit, arg);
    if (!rc) Py_VISIT(self->refs_buf.obj);
    return rc;
}

static int L_clear(Ledger *self) {
    L_release(self);
    return 0;
}

static void L_dealloc(Ledger *self) {
    PyObject_GC_UnTrack(self);
    L_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef L_methods[] = {
    {"lookup", (PyCFunction)L_lookup, METH_O, "Length of the leading run of ready keys."},
    {"pin", (PyCFunction)L_pin, METH_O, "Slots of ready keys, each read-pinned; or (position, 0 absent / 1 pending)."},
    {"unpin", (PyCFunction)L_unpin, METH_O, "Release one read pin per key; or (position, 0 absent / 1 not pinned)."},
    {"touch", (PyCFunction)L_touch, METH_O, "A use of each key, keys[0] ending most recent."},
    {"refresh", (PyCFunction)L_refresh, METH_O, "Recency without reuse, keys[0] ending most recent."},
    {"store_miss", (PyCFunction)L_store_miss, METH_O, "The absent keys; ARC's ghosts see them as touches."},
    {"prepare_store", (PyCFunction)L_prepare_store, METH_O, "(new, slots, evicted, evicted_slots) or None."},
    {"complete_store", (PyCFunction)(void (*)(void))L_complete_store, METH_FASTCALL, "complete_store(keys, success=True) -> keys finished."},
    {"drop", (PyCFunction)L_drop, METH_O, "Forget ready unpinned keys; returns those dropped."},
    {"restore", (PyCFunction)L_restore, METH_VARARGS, "restore(keys, slots): re-admit ready blocks, slots ascending."},
    {"slot_of", (PyCFunction)L_slot_of, METH_O, "Slot of a key, or None."},
    {"is_ready", (PyCFunction)L_is_ready, METH_O, "Present and written."},
    {"is_pending", (PyCFunction)L_is_pending, METH_O, "Present and still being written."},
    {"hash_at", (PyCFunction)L_hash_at, METH_O, "Key stored at a slot, or None."},
    {"busy", (PyCFunction)L_busy, METH_NOARGS, "(slots being read, slots being written)."},
    {"items", (PyCFunction)L_items, METH_NOARGS, "[(key, slot)] in slot order."},
    {"order", (PyCFunction)L_order, METH_O, "Slots of list 1 (T1 / LRU) or 2 (T2), least recent first."},
    {"ghosts", (PyCFunction)L_ghosts, METH_O, "Keys of ghost list 1 (B1) or 2 (B2), oldest first."},
    {"ghost_hits", (PyCFunction)L_ghost_hits, METH_NOARGS, "Classic ARC: [(key, 1 B1 / 2 B2)] hit while ghosts."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef L_getset[] = {
    {"target_t1_size", (getter)L_get_target, NULL, "ARC's target size of T1.", NULL},
    {"num_used", (getter)L_get_used, NULL, "Slots holding a block.", NULL},
    {"num_free", (getter)L_get_free, NULL, "Slots free.", NULL},
    {"sizes", (getter)L_get_sizes, NULL, "(|T1|, |T2|); LRU keeps everything in T1.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods L_as_seq = {.sq_contains = (objobjproc)L_contains};

static PyTypeObject LedgerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvoffload_ext.ledger._ledger.Ledger",
    .tp_basicsize = sizeof(Ledger),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)L_traverse,
    .tp_clear = (inquiry)L_clear,
    .tp_doc = "Ledger(capacity, policy, refs): one tier's slots, ref counts and LRU (1) / ARC (2) / classic ARC (3) / prefix_value (4) order.",
    .tp_new = L_new,
    .tp_dealloc = (destructor)L_dealloc,
    .tp_methods = L_methods,
    .tp_getset = L_getset,
    .tp_as_sequence = &L_as_seq,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvoffload_ext.ledger._ledger", "The native block ledger.", -1, NULL};

PyMODINIT_FUNC PyInit__ledger(void) {
    if (PyType_Ready(&LedgerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&LedgerType);
    if (PyModule_AddObject(m, "Ledger", (PyObject *)&LedgerType) < 0) {
        Py_DECREF(&LedgerType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "LRU", POL_LRU) < 0 || PyModule_AddIntConstant(m, "ARC", POL_ARC) < 0
        || PyModule_AddIntConstant(m, "CLASSIC_ARC", POL_CLASSIC) < 0
        || PyModule_AddIntConstant(m, "PREFIX_VALUE", POL_PV) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
