/* The event-log frame's payload, written by the loop (issue 20): `dumps(value)` gives
   bytes that `marshal.loads` reads back as `value`, what `marshal.dumps(value)` would
   give it (eventlog/frames.py: the frame format is marshal's; the writer process reads
   it with `marshal.loads`). Built by setup.py C_MODULES; `writer.py` falls back to
   `frames.dumps` without it, or when this refuses a value.

   Why not marshal itself: under callgrind marshal cost ~7.5k instructions a queue
   message, a third of it growing its output buffer (each doubling copies the frame so
   far, and a frame holds every message's bytes: a large copy, which callgrind counts a
   byte an instruction), much of the rest `w_long` a byte a call and a hashtable entry
   for every object with more than one reference. Here one pass writes the small values
   into a scratch buffer sized from the number of events, and only notes where each
   large bytes object goes; the result is allocated once at the end and every message's
   bytes are copied into it once. As marshal does, an object that may recur (a tuple or
   bytes with more than one reference: the shapes and message parts events share) is
   written with FLAG_REF the first time and as TYPE_REF after; strings and ints are
   written each time (equal values, not shared objects, on the reader's side).

   Types: None, bool, int (within int64), bytes, str, tuple and list, exact types only;
   anything else (an int or str subclass, a float, a dict, a deeper nesting than
   MAX_DEPTH) raises ValueError and the caller uses marshal. Loop thread only (the GIL
   held; no Python code runs during the call, so the value cannot change). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32
#define FLAG_REF 0x80

/* Objects that may recur (exact tuple or bytes with more than one reference), by
   address: their reference index (marshal's FLAG_REF order). */
typedef struct {
    PyObject *key;
    Py_ssize_t index;
} Entry;

/* Where a large bytes object's content goes: after `at` bytes of the scratch buffer. */
typedef struct {
    Py_ssize_t at;
    PyObject *bytes;
} Large;

#define LARGE_BYTES 256 /* from this size, copied once into the result, not the scratch */

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
    Large *large;
    Py_ssize_t nlarge, large_cap, large_bytes;
    Entry *entries;
    size_t mask, used;
    Py_ssize_t next_index;
} Out;

static size_t slot_of(size_t mask, PyObject *key) {
    uint64_t h = ((uint64_t)(uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & mask;
}

static Entry *find(Entry *entries, size_t mask, PyObject *key) {
    size_t i = slot_of(mask, key);
    for (;;) {
        Entry *e = &entries[i];
        if (e->key == key || e->key == NULL) return e;
        i = (i + 1) & mask;
    }
}

static int grow_table(Out *o) {
    size_t size = (o->mask + 1) * 2;
    Entry *fresh = PyMem_Calloc(size, sizeof(Entry));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i <= o->mask; i++) {
        if (o->entries[i].key != NULL) *find(fresh, size - 1, o->entries[i].key) = o->entries[i];
    }
    PyMem_Free(o->entries);
    o->entries = fresh;
    o->mask = size - 1;
    return 0;
}

/* Room for `n` more bytes in the scratch buffer. */
static int reserve(Out *o, Py_ssize_t n) {
    if (o->len + n <= o->cap) return 0;
    Py_ssize_t cap = o->cap * 2;
    if (cap < o->len + n) cap = o->len + n;
    char *buf = PyMem_Realloc(o->buf, (size_t)cap);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = buf;
    o->cap = cap;
    return 0;
}

static int refuse(const char *why) {
    PyErr_SetString(PyExc_ValueError, why);
    return -1;
}

static inline char *put32(char *p, int32_t x) {
    uint32_t u = (uint32_t)x;
    p[0] = (char)(u & 0xFF);
    p[1] = (char)((u >> 8) & 0xFF);
    p[2] = (char)((u >> 16) & 0xFF);
    p[3] = (char)(u >> 24);
    return p + 4;
}

static int put(Out *o, PyObject *v, int depth);

/* An exact int's value: read from its (3.11) digits when it has at most two (below
   2**60: every id, size and epoch-ms time), else through the C API. */
static inline int int_value(PyObject *v, long long *x) {
#if PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
    Py_ssize_t size = Py_SIZE(v);
    const digit *d = ((PyLongObject *)v)->ob_digit;
    if (size >= -2 && size <= 2) {
        long long magnitude = size == 0 ? 0
                              : (size == 1 || size == -1)
                                  ? (long long)d[0]
                                  : (long long)d[0] | (long long)d[1] << PyLong_SHIFT;
        *x = size < 0 ? -magnitude : magnitude;
        return 0;
    }
#endif
    int overflow = 0;
    *x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) return refuse("_frames: an int beyond int64");
    if (*x == -1 && PyErr_Occurred()) return -1;
    return 0;
}

static int put_int(Out *o, PyObject *v) {
    long long x;
    if (int_value(v, &x) < 0) return -1;
    if (reserve(o, 15) < 0) return -1;
    char *p = o->buf + o->len;
    if (x >= INT32_MIN && x <= INT32_MAX) {
        *p = 'i';
        put32(p + 1, (int32_t)x);
        o->len += 5;
        return 0;
    }
    /* marshal's TYPE_LONG: the digit count (negative for a negative int), then the
       magnitude's 15-bit digits, least significant first */
    unsigned long long u = x < 0 ? 0ull - (unsigned long long)x : (unsigned long long)x;
    char *d = p + 5;
    int n = 0;
    while (u) {
        d[0] = (char)(u & 0xFF);
        d[1] = (char)((u >> 8) & 0x7F);
        d += 2;
        n++;
        u >>= 15;
    }
    *p = 'l';
    put32(p + 1, x < 0 ? -n : n);
    o->len += 5 + 2 * n;
    return 0;
}

static Py_NO_INLINE int put_bytes(Out *o, PyObject *v, char flag) {
    Py_ssize_t size = PyBytes_GET_SIZE(v);
    if (size > INT32_MAX) return refuse("_frames: bytes too long");
    Py_ssize_t inline_size = size < LARGE_BYTES ? size : 0;
    if (reserve(o, 5 + inline_size) < 0) return -1;
    char *p = o->buf + o->len;
    *p = (char)('s' | flag);
    put32(p + 1, (int32_t)size);
    o->len += 5;
    if (inline_size) {
        memcpy(p + 5, PyBytes_AS_STRING(v), (size_t)size);
        o->len += size;
    } else if (size) {
        if (o->nlarge == o->large_cap) {
            Py_ssize_t cap = o->large_cap ? o->large_cap * 2 : 64;
            Large *large = PyMem_Realloc(o->large, (size_t)cap * sizeof(Large));
            if (large == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            o->large = large;
            o->large_cap = cap;
        }
        o->large[o->nlarge].at = o->len;
        o->large[o->nlarge].bytes = v;
        o->nlarge++;
        o->large_bytes += size;
    }
    return 0;
}

static Py_NO_INLINE int put_str(Out *o, PyObject *v) {
    Py_ssize_t size;
    const char *data;
    char code;
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(v) < 0) return -1;
#endif
    if (PyUnicode_IS_ASCII(v)) {
        size = PyUnicode_GET_LENGTH(v);
        data = (const char *)PyUnicode_1BYTE_DATA(v);
        code = size < 256 ? 'z' : 'a';
    } else {
        /* a lone surrogate raises UnicodeEncodeError, a ValueError: marshal writes it */
        data = PyUnicode_AsUTF8AndSize(v, &size);
        if (data == NULL) return -1;
        code = 'u';
    }
    if (size > INT32_MAX) return refuse("_frames: str too long");
    if (reserve(o, 5 + size) < 0) return -1;
    char *p = o->buf + o->len;
    *p++ = code;
    if (code == 'z')
        *p++ = (char)size;
    else
        p = put32(p, (int32_t)size);
    memcpy(p, data, (size_t)size);
    o->len = p + size - o->buf;
    return 0;
}

static int put(Out *o, PyObject *v, int depth) {
    if (v == Py_None || v == Py_True || v == Py_False) {
        if (reserve(o, 1) < 0) return -1;
        o->buf[o->len++] = v == Py_None ? 'N' : v == Py_True ? 'T' : 'F';
        return 0;
    }
    PyTypeObject *type = Py_TYPE(v);
    if (type == &PyLong_Type) return put_int(o, v);
    if (type == &PyUnicode_Type) return put_str(o, v);
    if (type != &PyTuple_Type && type != &PyBytes_Type && type != &PyList_Type)
        return refuse("_frames: a type marshal is left to");
    char flag = 0;
    if (type != &PyList_Type && Py_REFCNT(v) > 1) {
        Entry *e = find(o->entries, o->mask, v);
        if (e->key == v) {
            if (reserve(o, 5) < 0) return -1;
            o->buf[o->len] = 'r';
            put32(o->buf + o->len + 1, (int32_t)e->index);
            o->len += 5;
            return 0;
        }
        e->key = v;
        e->index = o->next_index++;
        flag = (char)FLAG_REF;
        if (++o->used * 2 > o->mask + 1 && grow_table(o) < 0) return -1;
    }
    if (type == &PyBytes_Type) return put_bytes(o, v, flag);
    if (depth >= MAX_DEPTH) return refuse("_frames: nested too deep");
    Py_ssize_t n = Py_SIZE(v);
    if (n > INT32_MAX) return refuse("_frames: too many items");
    if (reserve(o, 5) < 0) return -1;
    char *p = o->buf + o->len;
    PyObject **items;
    if (type == &PyTuple_Type) {
        items = ((PyTupleObject *)v)->ob_item;
        if (n < 256) {
            p[0] = (char)(')' | flag);
            p[1] = (char)n;
            o->len += 2;
        } else {
            p[0] = (char)('(' | flag);
            put32(p + 1, (int32_t)n);
            o->len += 5;
        }
    } else {
        items = ((PyListObject *)v)->ob_item;
        p[0] = '[';
        put32(p + 1, (int32_t)n);
        o->len += 5;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        if (item == Py_None) { /* most of an event's items: no call (~80 instructions) */
            if (reserve(o, 1) < 0) return -1;
            o->buf[o->len++] = 'N';
        } else if (Py_TYPE(item) == &PyLong_Type) {
            if (put_int(o, item) < 0) return -1;
        } else {
            if (Py_REFCNT(item) > 1 &&
                (Py_TYPE(item) == &PyTuple_Type || Py_TYPE(item) == &PyBytes_Type)) {
                Entry *e = find(o->entries, o->mask, item);
                if (e->key == item) { /* written before in this frame (a shape, a
                                         message part): its reference, no call */
                    if (reserve(o, 5) < 0) return -1;
                    o->buf[o->len] = 'r';
                    put32(o->buf + o->len + 1, (int32_t)e->index);
                    o->len += 5;
                    continue;
                }
            }
            if (put(o, item, depth + 1) < 0) return -1;
        }
    }
    return 0;
}

/* How many events the value holds, for the first sizes: a frame is (first_seq, now_ms,
   events). */
static Py_ssize_t events_in(PyObject *v) {
    if (Py_TYPE(v) == &PyTuple_Type && PyTuple_GET_SIZE(v) == 3 &&
        Py_TYPE(PyTuple_GET_ITEM(v, 2)) == &PyList_Type)
        return PyList_GET_SIZE(PyTuple_GET_ITEM(v, 2));
    return 0;
}

static PyObject *m_dumps(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "_frames.dumps takes one value");
        return NULL;
    }
    Py_ssize_t events = events_in(args[0]);
    if (events > (1 << 20)) events = 1 << 20;
    Out o = {0};
    o.cap = 256 + 96 * events; /* an event's small values: ~40-70 bytes */
    size_t slots = 64;
    while (slots < (size_t)events) slots *= 2; /* ~1 message part an event or less */
    o.mask = slots - 1;
    o.buf = PyMem_Malloc((size_t)o.cap);
    o.entries = PyMem_Calloc(slots, sizeof(Entry));
    PyObject *result = NULL;
    if (o.buf == NULL || o.entries == NULL) {
        PyErr_NoMemory();
    } else if (put(&o, args[0], 0) == 0) {
        result = PyBytes_FromStringAndSize(NULL, o.len + o.large_bytes);
        if (result != NULL) {
            char *dst = PyBytes_AS_STRING(result);
            Py_ssize_t from = 0;
            for (Py_ssize_t i = 0; i < o.nlarge; i++) {
                Large *large = &o.large[i];
                memcpy(dst, o.buf + from, (size_t)(large->at - from));
                dst += large->at - from;
                from = large->at;
                Py_ssize_t size = PyBytes_GET_SIZE(large->bytes);
                memcpy(dst, PyBytes_AS_STRING(large->bytes), (size_t)size);
                dst += size;
            }
            memcpy(dst, o.buf + from, (size_t)(o.len - from));
        }
    }
    PyMem_Free(o.buf);
    PyMem_Free(o.large);
    PyMem_Free(o.entries);
    return result;
}

static PyMethodDef methods[] = {
    {"dumps", (PyCFunction)(void (*)(void))m_dumps, METH_FASTCALL,
     "dumps(value) -> bytes that marshal.loads reads as value; ValueError: use marshal."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_frames",
    "The event-log frame's payload in marshal's format, in one pass (issue 20, "
    "eventlog/writer.py).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__frames(void) { return PyModule_Create(&module); }
