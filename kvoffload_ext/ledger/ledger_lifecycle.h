/* The native ledger's inspection (tests, debugging) and its life as a Python object: built
 * whole in tp_new, released once, seen by the garbage collector. Included by _ledger.c. */
#ifndef LEDGER_LIFECYCLE_H
#define LEDGER_LIFECYCLE_H

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


#endif
