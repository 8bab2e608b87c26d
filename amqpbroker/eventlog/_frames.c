/* The event-log frame's payload, written by the loop (issue 20): `dumps(value)` gives
   bytes that `marshal.loads` reads back as `value`, what `marshal.dumps(value)` would
   give it (eventlog/frames.py: the frame format is marshal's; the writer process reads
   it with `marshal.loads`). Built by setup.py C_MODULES; `writer.py` falls back to
   `frames.dumps` without it, or when this refuses a value.

   Why not marshal itself: under callgrind marshal cost ~7.5k instructions a queue
   message, a third of it growing its output buffer (each doubling copies the frame so
   far; a frame holds every message's bytes), the rest `w_long` byte by byte and a
   hashtable entry for every object referenced more than once, shared or not. Here two
   passes: the first sizes the output and counts which objects recur in it; the second
   writes into bytes of that size, each message's bytes copied once, and marks only the
   objects that recur (marshal's FLAG_REF, then TYPE_REF for their later occurrences).

   Types: None, bool, int (within int64), bytes, str, tuple and list, exact types only;
   anything else (an int or str subclass, a float, a dict, a deeper nesting than
   MAX_DEPTH) raises ValueError and the caller uses marshal. Loop thread only (the GIL
   held; no Python code runs between the passes, so the value cannot change). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32
#define FLAG_REF 0x80

/* Objects that may recur (tuple, bytes, str with more than one reference), by address:
   how often the value holds them and, once written, their reference index. */
typedef struct {
    PyObject *key;
    Py_ssize_t count;
    Py_ssize_t index; /* -1 until written with FLAG_REF */
} Entry;

typedef struct {
    Entry *entries;
    size_t mask;
    size_t used;
    Py_ssize_t next_index;
} Table;

static size_t slot_of(const Table *t, PyObject *key) {
    uint64_t h = ((uint64_t)(uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & t->mask;
}

static Entry *find(const Table *t, PyObject *key) {
    size_t i = slot_of(t, key);
    for (;;) {
        Entry *e = &t->entries[i];
        if (e->key == key || e->key == NULL) return e;
        i = (i + 1) & t->mask;
    }
}

static int grow(Table *t) {
    size_t size = (t->mask + 1) * 2;
    Entry *old = t->entries;
    size_t old_size = t->mask + 1;
    Entry *fresh = PyMem_Calloc(size, sizeof(Entry));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->entries = fresh;
    t->mask = size - 1;
    for (size_t i = 0; i < old_size; i++) {
        if (old[i].key != NULL) *find(t, old[i].key) = old[i];
    }
    PyMem_Free(old);
    return 0;
}

static int shared(PyObject *v) { return Py_REFCNT(v) > 1; }

static int refuse(const char *why) {
    PyErr_SetString(PyExc_ValueError, why);
    return -1;
}

/* The magnitude's 15-bit digits (marshal's TYPE_LONG) of an int outside int32. */
static int digits_of(long long x, uint16_t out[5]) {
    unsigned long long u = x < 0 ? 0ull - (unsigned long long)x : (unsigned long long)x;
    int n = 0;
    while (u) {
        out[n++] = (uint16_t)(u & 0x7FFF);
        u >>= 15;
    }
    return n;
}

/* Pass 1: the bytes `v` takes (a recurring object's later occurrences 5, a reference),
   counting the occurrences of what may recur; -1 with an exception. */
static Py_ssize_t measure(PyObject *v, Table *t, int depth) {
    if (v == Py_None || v == Py_True || v == Py_False) return 1;
    PyTypeObject *type = Py_TYPE(v);
    if (type == &PyLong_Type) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) return refuse("_frames: an int beyond int64");
        if (x == -1 && PyErr_Occurred()) return -1;
        if (x >= INT32_MIN && x <= INT32_MAX) return 5;
        uint16_t d[5];
        return 5 + 2 * digits_of(x, d);
    }
    if (type != &PyTuple_Type && type != &PyBytes_Type && type != &PyUnicode_Type &&
        type != &PyList_Type)
        return refuse("_frames: a type marshal is left to");
    if (depth >= MAX_DEPTH) return refuse("_frames: nested too deep");
    if (type != &PyList_Type && shared(v)) {
        Entry *e = find(t, v);
        if (e->key == v) {
            e->count++;
            return 5;
        }
        e->key = v;
        e->count = 1;
        e->index = -1;
        if (++t->used * 2 > t->mask + 1 && grow(t) < 0) return -1;
    }
    Py_ssize_t size;
    if (type == &PyBytes_Type) {
        size = PyBytes_GET_SIZE(v);
        if (size > INT32_MAX) return refuse("_frames: bytes too long");
        return 5 + size;
    }
    if (type == &PyUnicode_Type) {
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(v) < 0) return -1;
#endif
        if (PyUnicode_IS_ASCII(v)) {
            size = PyUnicode_GET_LENGTH(v);
            if (size > INT32_MAX) return refuse("_frames: str too long");
            return (size < 256 ? 2 : 5) + size;
        }
        /* UTF-8 (kept in the object for pass 2); a lone surrogate raises
           UnicodeEncodeError, a ValueError: marshal writes it (surrogatepass). */
        if (PyUnicode_AsUTF8AndSize(v, &size) == NULL) return -1;
        if (size > INT32_MAX) return refuse("_frames: str too long");
        return 5 + size;
    }
    Py_ssize_t n = Py_SIZE(v);
    if (n > INT32_MAX) return refuse("_frames: too many items");
    PyObject **items = type == &PyTuple_Type ? ((PyTupleObject *)v)->ob_item
                                             : ((PyListObject *)v)->ob_item;
    size = (type == &PyTuple_Type && n < 256) ? 2 : 5;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t item = measure(items[i], t, depth + 1);
        if (item < 0) return -1;
        size += item;
    }
    return size;
}

static inline char *put32(char *p, int32_t x) {
    uint32_t u = (uint32_t)x;
    p[0] = (char)(u & 0xFF);
    p[1] = (char)((u >> 8) & 0xFF);
    p[2] = (char)((u >> 16) & 0xFF);
    p[3] = (char)(u >> 24);
    return p + 4;
}

/* Pass 2: `v` written at `p` (which pass 1 sized); where it ends. */
static char *emit(PyObject *v, Table *t, char *p) {
    if (v == Py_None) {
        *p = 'N';
        return p + 1;
    }
    if (v == Py_True || v == Py_False) {
        *p = v == Py_True ? 'T' : 'F';
        return p + 1;
    }
    PyTypeObject *type = Py_TYPE(v);
    if (type == &PyLong_Type) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x >= INT32_MIN && x <= INT32_MAX) {
            *p = 'i';
            return put32(p + 1, (int32_t)x);
        }
        uint16_t d[5];
        int n = digits_of(x, d);
        *p = 'l';
        p = put32(p + 1, x < 0 ? -n : n);
        for (int i = 0; i < n; i++) {
            *p++ = (char)(d[i] & 0xFF);
            *p++ = (char)(d[i] >> 8);
        }
        return p;
    }
    char flag = 0;
    if (type != &PyList_Type && shared(v)) {
        Entry *e = find(t, v);
        if (e->index >= 0) {
            *p = 'r';
            return put32(p + 1, (int32_t)e->index);
        }
        if (e->count > 1) {
            e->index = t->next_index++;
            flag = (char)FLAG_REF;
        }
    }
    if (type == &PyBytes_Type) {
        Py_ssize_t size = PyBytes_GET_SIZE(v);
        *p = (char)('s' | flag);
        p = put32(p + 1, (int32_t)size);
        memcpy(p, PyBytes_AS_STRING(v), (size_t)size);
        return p + size;
    }
    if (type == &PyUnicode_Type) {
        Py_ssize_t size;
        const char *data;
        if (PyUnicode_IS_ASCII(v)) {
            size = PyUnicode_GET_LENGTH(v);
            data = (const char *)PyUnicode_1BYTE_DATA(v);
            if (size < 256) {
                *p++ = (char)('z' | flag);
                *p++ = (char)size;
            } else {
                *p = (char)('a' | flag);
                p = put32(p + 1, (int32_t)size);
            }
        } else {
            data = PyUnicode_AsUTF8AndSize(v, &size); /* cached by pass 1 */
            *p = (char)('u' | flag);
            p = put32(p + 1, (int32_t)size);
        }
        memcpy(p, data, (size_t)size);
        return p + size;
    }
    Py_ssize_t n = Py_SIZE(v);
    PyObject **items;
    if (type == &PyTuple_Type) {
        items = ((PyTupleObject *)v)->ob_item;
        if (n < 256) {
            *p++ = (char)(')' | flag);
            *p++ = (char)n;
        } else {
            *p = (char)('(' | flag);
            p = put32(p + 1, (int32_t)n);
        }
    } else {
        items = ((PyListObject *)v)->ob_item;
        *p = '[';
        p = put32(p + 1, (int32_t)n);
    }
    for (Py_ssize_t i = 0; i < n; i++) p = emit(items[i], t, p);
    return p;
}

static PyObject *m_dumps(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "_frames.dumps takes one value");
        return NULL;
    }
    Table t = {NULL, 255, 0, 0};
    t.entries = PyMem_Calloc(t.mask + 1, sizeof(Entry));
    if (t.entries == NULL) return PyErr_NoMemory();
    PyObject *result = NULL;
    Py_ssize_t size = measure(args[0], &t, 0);
    if (size >= 0) {
        result = PyBytes_FromStringAndSize(NULL, size);
        if (result != NULL) {
            char *end = emit(args[0], &t, PyBytes_AS_STRING(result));
            if (end != PyBytes_AS_STRING(result) + size) { /* never: the passes agree */
                Py_CLEAR(result);
                PyErr_SetString(PyExc_SystemError, "_frames: the passes disagree");
            }
        }
    }
    PyMem_Free(t.entries);
    return result;
}

static PyMethodDef methods[] = {
    {"dumps", (PyCFunction)(void (*)(void))m_dumps, METH_FASTCALL,
     "dumps(value) -> bytes that marshal.loads reads as value; ValueError: use marshal."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_frames",
    "The event-log frame's payload in marshal's format, sized first (issue 20, "
    "eventlog/writer.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
