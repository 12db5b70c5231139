/* The CPU tier's block ledger in C: the slot table of kvoffload.offload.native_ledger for the
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
 * lists, key pools), ledger_state.h (the state), ledger_policy.h (eviction), ledger_keys.h (arguments),
 * ledger_stores.h (the store path), ledger_lifecycle.h (inspection, the object's life), this one
 * (lookups, pins, recency, one-key queries and the type).
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

#include "ledger_keys.h"

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
    int rc = touch_run(self, kk.items, kk.hs, kk.n, 0, NULL);
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

#include "ledger_stores.h"

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

#include "ledger_lifecycle.h"

static PyMethodDef L_methods[] = {
    {"lookup", (PyCFunction)L_lookup, METH_O, "Length of the leading run of ready keys."},
    {"pin", (PyCFunction)L_pin, METH_O, "Slots of ready keys, each read-pinned; or (position, 0 absent / 1 pending)."},
    {"unpin", (PyCFunction)L_unpin, METH_O, "Release one read pin per key; or (position, 0 absent / 1 not pinned)."},
    {"touch", (PyCFunction)L_touch, METH_O, "A use of each key, keys[0] ending most recent."},
    {"refresh", (PyCFunction)L_refresh, METH_O, "Recency without reuse, keys[0] ending most recent."},
    {"store_miss", (PyCFunction)L_store_miss, METH_O, "The absent keys; ARC's ghosts see them as touches."},
    {"prepare_store", (PyCFunction)(void (*)(void))L_prepare_store, METH_FASTCALL,
     "prepare_store(keys, shown=None, victim_slots=True) -> (new, slots, evicted, evicted_slots) or None."},
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
