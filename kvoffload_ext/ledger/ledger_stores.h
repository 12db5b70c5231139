/* The native ledger's store path: store misses shown to the policy, slots allocated (evicting
 * as needed), stores completed or forgotten, and blocks restored at known slots. Included by
 * _ledger.c. */
#ifndef LEDGER_STORES_H
#define LEDGER_STORES_H

/* Show the policy the keys at positions pos[0..m) (absent, in order, repeats kept): ARC's ghost
 * lists see them as touches. `shown`: NULL, a set (positions whose key is in it are skipped;
 * those shown are added after the pass, so a key repeated in one run is shown at each repeat,
 * as store_miss does) or a list (the caller's first: those shown are appended). `missing` (a
 * list, or NULL) receives the keys shown. `ghostly` (per position, or NULL): set to 0 where the
 * touch found no ghost, so inserting the key need not look again. */
static int show_misses(Ledger *self, Keys *kk, const int32_t *pos, Py_ssize_t m, PyObject *shown, PyObject *missing,
                       int32_t *ghostly) {
    PyObject *small_k[64];
    Py_hash_t small_h[64];
    int32_t small_p[64];
    uint8_t small_g[64];
    int big = m > 64;
    PyObject **mk = big ? PyMem_Malloc(m * sizeof(PyObject *)) : small_k; /* borrowed from kk's tuple */
    Py_hash_t *mh = big ? PyMem_Malloc(m * sizeof(Py_hash_t)) : small_h;
    int32_t *mp = big ? PyMem_Malloc(m * sizeof(int32_t)) : small_p;
    uint8_t *no_ghost = big ? PyMem_Calloc(m, 1) : memset(small_g, 0, sizeof(small_g));
    Py_ssize_t got = 0;
    int rc = -1, is_set = shown && PySet_Check(shown);
    if (!mk || !mh || !mp || !no_ghost) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t j = 0; j < m; j++) {
        PyObject *k = kk->items[pos[j]];
        if (is_set) {
            int seen = PySet_Contains(shown, k);
            if (seen < 0) goto done;
            if (seen) continue;
        }
        if (missing && PyList_Append(missing, k) < 0) goto done;
        mk[got] = k;
        mp[got] = pos[j];
        mh[got++] = kk->hs[pos[j]];
    }
    for (Py_ssize_t j = 0; shown && j < got; j++)
        if ((is_set ? PySet_Add(shown, mk[j]) : PyList_Append(shown, mk[j])) < 0) goto done;
    if (self->policy != POL_LRU && touch_run(self, mk, mh, got, 1, no_ghost) < 0) goto done;
    for (Py_ssize_t j = 0; ghostly && j < got; j++)
        if (no_ghost[j]) ghostly[mp[j]] = 0;
    rc = 0;
done:
    if (big) {
        PyMem_Free(mk);
        PyMem_Free(mh);
        PyMem_Free(mp);
        PyMem_Free(no_ghost);
    }
    return rc;
}

/* The absent keys (in order, repeats kept); ARC's ghost lists see them as touches. */
static PyObject *L_store_miss(Ledger *self, PyObject *arg) {
    ALIVE(self);
    Keys kk;
    if (keys_get(&kk, arg) < 0) return NULL;
    PyObject *missing = PyList_New(0);
    int32_t *pos = PyMem_Malloc((kk.n + 1) * sizeof(int32_t));
    Py_ssize_t m = 0;
    if (!missing || !pos) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t i = 0; i < kk.n; i++) {
        int32_t s = find(self, kk.items[i], kk.hs[i]);
        if (s == ERR) goto fail;
        if (s == NIL) pos[m++] = (int32_t)i;
    }
    if (show_misses(self, &kk, pos, m, NULL, missing, NULL) < 0) goto fail;
    PyMem_Free(pos);
    keys_free(&kk);
    return missing;
fail:
    Py_XDECREF(missing);
    PyMem_Free(pos);
    keys_free(&kk);
    return NULL;
}

/* (new keys, their slots, evicted keys, evicted slots), or None when the tier cannot make room.
 * prepare_store(keys, shown, victim_slots): first the absent keys are shown to the policy, as
 * store_miss would (vLLM's route: each once per request; see show_misses for `shown`), in the
 * same pass; victim_slots=False: the evicted slots are not listed (nobody demotes them). */
static PyObject *L_prepare_store(Ledger *self, PyObject *const *args, Py_ssize_t nargs) {
    ALIVE(self);
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "prepare_store(keys, shown=None, victim_slots=True) takes 1 to 3 arguments, "
                     "not %zd", nargs);
        return NULL;
    }
    PyObject *shown = nargs >= 2 && args[1] != Py_None ? args[1] : NULL;
    int victim_slots = nargs == 3 ? PyObject_IsTrue(args[2]) : 1;
    if (victim_slots < 0) return NULL;
    if (shown && !PySet_Check(shown) && !PyList_Check(shown)) {
        PyErr_Format(PyExc_TypeError, "prepare_store(): shown must be a set, a list or None, not %.100s",
                     Py_TYPE(shown)->tp_name);
        return NULL;
    }
    Keys kk;
    if (keys_get(&kk, args[0]) < 0) return NULL;
    Py_ssize_t n = kk.n;
    PyObject *result = NULL, *new_keys = NULL, *evicted = NULL;
    Table seen = {NULL, 0, 0, 0};
    /* Six arrays of n and the repeats' table: on the stack for a usual run (vLLM stores a few
     * chunks per call). */
    int32_t small[6 * 64];
    Bucket seen_room[128];
    int32_t *scratch = n <= 64 ? small : PyMem_Malloc(6 * (n + 1) * sizeof(int32_t));
    int32_t *newpos = scratch, *marked = NULL, *at = NULL, *firsts = NULL, *misses = NULL, *ghostly = NULL;
    int32_t *victims = NULL, *slots = NULL;
    Py_ssize_t nnew = 0, nmarked = 0, nfirst = 0, nmiss = 0, need = 0;
    int in_b2 = 0, ghost_hit = 0;
    if (!scratch || tbl_init_in(&seen, n, seen_room, 128) < 0) { PyErr_NoMemory(); goto done; }
    Py_ssize_t stride = n <= 64 ? 64 : n + 1;
    marked = newpos + stride;
    at = marked + stride;          /* the slot found at each position */
    firsts = at + stride;          /* positions of first occurrences */
    misses = firsts + stride;      /* positions of absent keys */
    ghostly = misses + stride;     /* 0: known to be no ghost (a shown miss) */
    for (Py_ssize_t i = 0; i < n; i++) ghostly[i] = 1;
    for (Py_ssize_t i = 0; i < n; i++) { /* first occurrences; offered residents are protected */
        int32_t d = tbl_find(&seen, kk.items, kk.hs, kk.items[i], kk.hs[i]);
        if (d == ERR) goto done;
        if (d != NIL) {
            if ((at[i] = at[d]) == NIL) misses[nmiss++] = (int32_t)i;
            continue;
        }
        tbl_put(&seen, kk.hs[i], (int32_t)i);
        firsts[nfirst++] = (int32_t)i;
        int32_t s = at[i] = find(self, kk.items[i], kk.hs[i]);
        if (s == ERR) goto done;
        if (s == NIL) {
            newpos[nnew++] = misses[nmiss++] = (int32_t)i;
        } else if (!self->mark[s]) {
            self->mark[s] = 1;
            marked[nmarked++] = s;
        }
    }
    if (shown && nmiss && show_misses(self, &kk, misses, nmiss, shown, NULL, ghostly) < 0) goto done;
    for (Py_ssize_t j = 0; self->policy == POL_CLASSIC && j < nfirst; j++) {
        /* an offered ghost hit: REPLACE's B2 case, no case IV */
        int32_t hit = pool_find(&self->hits, kk.items[firsts[j]], kk.hs[firsts[j]]);
        if (hit == ERR) goto done;
        if (hit != NIL) {
            ghost_hit = 1;
            in_b2 |= self->hits.tag[hit] == T2;
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
        pol_insert(self, s, ghostly[newpos[i]]);
        Py_INCREF(k);
        PyList_SET_ITEM(new_keys, i, k);
    }
    {
        PyObject *slot_l = slot_buffer(slots, nnew), *vict_l = slot_list(victims, victim_slots ? need : 0);
        if (slot_l && vict_l) result = PyTuple_Pack(4, new_keys, slot_l, evicted, vict_l);
        Py_XDECREF(slot_l);
        Py_XDECREF(vict_l);
    }
done:
    for (Py_ssize_t i = 0; i < nmarked; i++) self->mark[marked[i]] = 0;
    if (result == Py_None) Py_INCREF(Py_None);
    Py_XDECREF(new_keys);
    Py_XDECREF(evicted);
    if (seen.b != seen_room) PyMem_Free(seen.b);
    if (scratch != small) PyMem_Free(scratch);
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
        pol_insert(self, s, 1);
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
