/* The native ledger's store path: store misses shown to the policy, slots allocated (evicting
 * as needed), stores completed or forgotten, and blocks restored at known slots. Included by
 * _ledger.c. */
#ifndef LEDGER_STORES_H
#define LEDGER_STORES_H

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


#endif
