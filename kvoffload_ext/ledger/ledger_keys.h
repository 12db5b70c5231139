/* The native ledger's argument helpers: a run of keys as a private tuple with every hash
 * computed first, and slots handed back as a buffer numpy views or a list. Included by _ledger.c. */
#ifndef LEDGER_KEYS_H
#define LEDGER_KEYS_H

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

#endif
