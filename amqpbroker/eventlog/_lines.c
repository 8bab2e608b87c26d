/* The event-log writer process's common B-170 line in C (issue 20, `child.py`).

   `lines(first_seq, events, info, messages, shapes, message_info, cache_message,
   cache_shape, fallback)` returns the UTF-8 bytes that
   `ChildWriter._format(first_seq, events).encode()` returns, doing its loop in C: for
   every event, the same steps in the same order (`_message_info` when the event carries
   bytes the process has not read, then the shape's texts from `shapes` or `_cache_shape`,
   then the message's from `messages` or `_cache_message`: so a step that raises leaves
   the caches and the log records as `_format` leaves them) and the same line, `{"ts":`
   ts `,"seq":` seq `,` five cached texts, the count. It only concatenates: every text is
   made (and JSON-escaped) by the Python methods it is given, so escaping stays in one
   place. A text with no UTF-8 (a lone surrogate) raises UnicodeEncodeError once every
   event's steps are done, as `.encode()` of `_format`'s whole text does.

   Any event that is not the common shape (an exact 5-tuple whose part is an exact 5-tuple
   with data not None, and extra None, a `sent`'s 8-tuple with only target_queues, or a
   `returned`'s with only an exact-int delay_ms) goes
   to `fallback(seq, [event])` (`_format` itself), before any of its steps is done here:
   the rare events, and any odd value a bug might send, get `_format`'s text or its
   exception, whatever they are. A value is written as an f-string writes it
   (`PyObject_Format` with an empty spec), exact ints and strs directly.

   The texts of a frame's shapes are found by the identity of the shape (and of a `sent`'s
   target queues) while the frame lasts, as `_format`'s `by_id` does: a shape equal to
   another one has the same texts (`_cache_shape` is a function of the key), so this gives
   the same lines. References are owned while used: a callback may clear a cache.

   `keep_memory()`, called once at the process's start, tunes glibc's malloc for the
   writer process's pattern (see its comment below); it lives here because this is the
   writer process's one C module.

   Built with the compiled build only (setup.py C_MODULES); without it `child.py` runs
   `_format`. The tests build it from this source in every tier and compare it with
   `_format` byte for byte. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
    /* The first text with no UTF-8: raised when the frame is done (see above). */
    PyObject *error_type, *error_value, *error_tb;
} Buf;

static int grow(Buf *b, Py_ssize_t need) {
    Py_ssize_t cap = b->cap ? b->cap : (Py_ssize_t)1 << 16;
    if (need > PY_SSIZE_T_MAX - b->len) {
        PyErr_NoMemory();
        return -1;
    }
    while (cap < b->len + need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int put(Buf *b, const char *s, Py_ssize_t n) {
    if (b->cap - b->len < n && grow(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

#define PUT_LITERAL(b, s) put((b), (s), (Py_ssize_t)sizeof(s) - 1)

static int put_ll(Buf *b, long long v) {
    char tmp[24];
    char *p = tmp + sizeof tmp;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--p = '-';
    return put(b, p, tmp + sizeof tmp - p);
}

/* A str's UTF-8 (what `.encode()` gives; one it cannot encode is kept for the end). */
static int put_str(Buf *b, PyObject *s) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (u != NULL)
        return put(b, u, n);
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
        return -1;
    if (b->error_type == NULL)
        PyErr_Fetch(&b->error_type, &b->error_value, &b->error_tb);
    else
        PyErr_Clear();
    return 0;
}

/* `value` as an f-string's `{value}` writes it. */
static int put_obj(Buf *b, PyObject *value) {
    if (PyUnicode_CheckExact(value))
        return put_str(b, value);
    if (PyLong_CheckExact(value)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow && !(v == -1 && PyErr_Occurred()))
            return put_ll(b, v);
        PyErr_Clear();
    }
    PyObject *text = PyObject_Format(value, NULL);
    if (text == NULL)
        return -1;
    int rc = put_str(b, text);
    Py_DECREF(text);
    return rc;
}

/* A text triple from a cache or a callback: an exact 3-tuple (a new reference), else an
   error (`_format` would fail on it too: it indexes three items). */
static PyObject *triple(PyObject *value) {
    if (value != NULL && !(PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) == 3)) {
        PyErr_SetString(PyExc_TypeError, "event-log texts: a 3-tuple expected");
        Py_DECREF(value);
        return NULL;
    }
    return value;
}

#define SLOTS 16

typedef struct {
    PyObject *shape;   /* owned */
    PyObject *targets; /* owned; NULL: not a `sent` with target queues */
    PyObject *delay;   /* owned; NULL: not a `returned` with delay_ms */
    PyObject *texts;   /* owned */
} Slot;

typedef struct {
    PyObject *info, *messages, *shapes;
    PyObject *message_info, *cache_message, *cache_shape, *fallback;
    Slot slots[SLOTS];
    int used;
    Buf out;
    int owns_kept; /* `out` is `kept` */
} Frame;

/* The texts of `shape` (with a `sent`'s `targets` or a `returned`'s `delay`, or NULL: at
   most one of them), a new reference. */
static PyObject *shape_texts(Frame *f, PyObject *shape, PyObject *targets, PyObject *delay) {
    for (int k = 0; k < f->used; k++) {
        Slot *s = &f->slots[k];
        if (s->shape == shape && s->targets == targets && s->delay == delay) {
            Py_INCREF(s->texts);
            return s->texts;
        }
    }
    PyObject *key;
    if (targets != NULL) {
        key = PyTuple_Pack(2, shape, targets);
    } else if (delay != NULL) {
        key = PyTuple_Pack(3, shape, Py_None, delay);
    } else {
        key = shape;
        Py_INCREF(key);
    }
    if (key == NULL)
        return NULL;
    PyObject *texts = PyDict_GetItemWithError(f->shapes, key);
    if (texts != NULL) {
        Py_INCREF(texts);
    } else if (!PyErr_Occurred()) {
        texts = PyObject_CallFunctionObjArgs(f->cache_shape, key, shape,
                                             targets == NULL ? Py_None : targets,
                                             delay == NULL ? Py_None : delay, NULL);
    }
    Py_DECREF(key);
    texts = triple(texts);
    if (texts != NULL && f->used < SLOTS) {
        Slot *s = &f->slots[f->used++];
        Py_INCREF(shape);
        Py_XINCREF(targets);
        Py_XINCREF(delay);
        Py_INCREF(texts);
        s->shape = shape;
        s->targets = targets;
        s->delay = delay;
        s->texts = texts;
    }
    return texts;
}

/* `fallback(seq, [event])`'s text: an event that is not the common line. */
static int slow(Frame *f, long long seq, PyObject *event) {
    PyObject *seq_obj = PyLong_FromLongLong(seq);
    if (seq_obj == NULL)
        return -1;
    PyObject *single = PyList_New(1);
    if (single == NULL) {
        Py_DECREF(seq_obj);
        return -1;
    }
    Py_INCREF(event);
    PyList_SET_ITEM(single, 0, event);
    PyObject *text = PyObject_CallFunctionObjArgs(f->fallback, seq_obj, single, NULL);
    Py_DECREF(seq_obj);
    Py_DECREF(single);
    if (text == NULL)
        return -1;
    int rc = -1;
    if (PyUnicode_Check(text))
        rc = put_str(&f->out, text);
    else
        PyErr_SetString(PyExc_TypeError, "event-log fallback: a str expected");
    Py_DECREF(text);
    return rc;
}

/* One event's line, or the fallback's text for it. */
static int one(Frame *f, long long seq, PyObject *event) {
    PyObject *shape, *ts, *part, *count, *extra, *data, *msg_id, *targets = NULL, *delay = NULL;
    if (!PyTuple_CheckExact(event) || PyTuple_GET_SIZE(event) != 5)
        return slow(f, seq, event);
    shape = PyTuple_GET_ITEM(event, 0);
    ts = PyTuple_GET_ITEM(event, 1);
    part = PyTuple_GET_ITEM(event, 2);
    count = PyTuple_GET_ITEM(event, 3);
    extra = PyTuple_GET_ITEM(event, 4);
    if (!PyTuple_CheckExact(part) || PyTuple_GET_SIZE(part) != 5)
        return slow(f, seq, event);
    data = PyTuple_GET_ITEM(part, 4);
    if (data == Py_None)
        return slow(f, seq, event);
    if (extra != Py_None) {
        if (!PyTuple_CheckExact(extra) || PyTuple_GET_SIZE(extra) != 8)
            return slow(f, seq, event);
        /* a `sent`'s target queues alone, or a `returned`'s int delay alone */
        Py_ssize_t only = 2;
        targets = PyTuple_GET_ITEM(extra, 2);
        if (targets == Py_None) {
            targets = NULL;
            only = 4;
            delay = PyTuple_GET_ITEM(extra, 4);
            if (!PyLong_CheckExact(delay))
                return slow(f, seq, event);
        }
        for (Py_ssize_t j = 0; j < 8; j++) {
            if (j != only && PyTuple_GET_ITEM(extra, j) != Py_None)
                return slow(f, seq, event);
        }
    }
    msg_id = PyTuple_GET_ITEM(part, 0);
    if (PyBytes_CheckExact(data)) {
        int known = PyDict_Contains(f->info, msg_id);
        if (known < 0)
            return -1;
        if (!known) {
            PyObject *r = PyObject_CallFunctionObjArgs(
                f->message_info, msg_id, data, PyTuple_GET_ITEM(part, 2), NULL);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
        }
    }
    PyObject *texts = shape_texts(f, shape, targets, delay);
    if (texts == NULL)
        return -1;
    PyObject *message = PyDict_GetItemWithError(f->messages, msg_id);
    if (message != NULL) {
        Py_INCREF(message);
    } else if (!PyErr_Occurred()) {
        message = PyObject_Call(f->cache_message, part, NULL);
    }
    message = triple(message);
    if (message == NULL) {
        Py_DECREF(texts);
        return -1;
    }
    Buf *b = &f->out;
    int rc = (PUT_LITERAL(b, "{\"ts\":") < 0 || put_obj(b, ts) < 0 ||
              PUT_LITERAL(b, ",\"seq\":") < 0 || put_ll(b, seq) < 0 || PUT_LITERAL(b, ",") < 0 ||
              put_obj(b, PyTuple_GET_ITEM(texts, 0)) < 0 ||
              put_obj(b, PyTuple_GET_ITEM(message, 0)) < 0 ||
              put_obj(b, PyTuple_GET_ITEM(texts, 1)) < 0 ||
              put_obj(b, PyTuple_GET_ITEM(message, 1)) < 0 ||
              PUT_LITERAL(b, "\"delivery_count\":") < 0 ||
              (count == Py_None ? PUT_LITERAL(b, "null") : put_obj(b, count)) < 0 ||
              PUT_LITERAL(b, ",") < 0 || put_obj(b, PyTuple_GET_ITEM(texts, 2)) < 0 ||
              put_obj(b, PyTuple_GET_ITEM(message, 2)) < 0)
                 ? -1
                 : 0;
    Py_DECREF(texts);
    Py_DECREF(message);
    return rc;
}

/* The output buffer, kept from frame to frame (a frame's lines are megabytes: a fresh
   buffer each time cost page faults); one a larger frame left is freed. A call made
   while another runs (a callback's) gets its own. */
#define KEEP_BYTES ((Py_ssize_t)16 << 20)
static Buf kept;
static int kept_busy;

static void release(Frame *f) {
    for (int k = 0; k < f->used; k++) {
        Py_DECREF(f->slots[k].shape);
        Py_XDECREF(f->slots[k].targets);
        Py_XDECREF(f->slots[k].delay);
        Py_DECREF(f->slots[k].texts);
    }
    f->used = 0;
    Py_CLEAR(f->out.error_type);
    Py_CLEAR(f->out.error_value);
    Py_CLEAR(f->out.error_tb);
    if (f->owns_kept) {
        kept = f->out;
        kept.len = 0;
        kept_busy = 0;
        if (kept.cap > KEEP_BYTES) {
            PyMem_Free(kept.data);
            kept.data = NULL;
            kept.cap = 0;
        }
    } else {
        PyMem_Free(f->out.data);
    }
    f->out.data = NULL;
}

/* The whole frame through `fallback`, encoded: a first_seq this C does not count in. */
static PyObject *whole(PyObject *fallback, PyObject *first_seq, PyObject *events) {
    PyObject *text = PyObject_CallFunctionObjArgs(fallback, first_seq, events, NULL);
    if (text == NULL)
        return NULL;
    PyObject *blob = NULL;
    if (PyUnicode_Check(text))
        blob = PyUnicode_AsUTF8String(text);
    else
        PyErr_SetString(PyExc_TypeError, "event-log fallback: a str expected");
    Py_DECREF(text);
    return blob;
}

static PyObject *lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "lines() takes 9 arguments");
        return NULL;
    }
    PyObject *first_seq = args[0], *events = args[1];
    Frame f = {
        .info = args[2],
        .messages = args[3],
        .shapes = args[4],
        .message_info = args[5],
        .cache_message = args[6],
        .cache_shape = args[7],
        .fallback = args[8],
    };
    if (!PyDict_CheckExact(f.info) || !PyDict_CheckExact(f.messages) ||
        !PyDict_CheckExact(f.shapes)) {
        PyErr_SetString(PyExc_TypeError, "lines(): info, messages and shapes must be dicts");
        return NULL;
    }
    if (!PyList_CheckExact(events) || !PyLong_CheckExact(first_seq))
        return whole(f.fallback, first_seq, events);
    int overflow;
    long long seq = PyLong_AsLongLongAndOverflow(first_seq, &overflow);
    if (seq == -1 && PyErr_Occurred())
        return NULL;
    /* seq + index stays a long long (a list holds fewer than 2**61 items) */
    if (overflow || seq > LLONG_MAX / 2 || seq < LLONG_MIN / 2)
        return whole(f.fallback, first_seq, events);
    if (!kept_busy) {
        kept_busy = 1;
        f.owns_kept = 1;
        f.out = kept;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *event = PyList_GET_ITEM(events, i);
        Py_INCREF(event);
        int rc = one(&f, seq + i, event);
        Py_DECREF(event);
        if (rc < 0) {
            release(&f);
            return NULL;
        }
    }
    PyObject *blob = NULL;
    if (f.out.error_type != NULL) {
        PyErr_Restore(f.out.error_type, f.out.error_value, f.out.error_tb);
        f.out.error_type = f.out.error_value = f.out.error_tb = NULL;
    } else {
        blob = PyBytes_FromStringAndSize(f.out.data ? f.out.data : "", f.out.len);
    }
    release(&f);
    return blob;
}

/* glibc's malloc keeps what this process frees (no trimming of the heap's top, no mmap
   below 32 MiB): a frame's megabytes of objects and lines are allocated and freed at every
   read, and giving them back to the kernel made each read fault them in again (~1 page
   fault a message, issue 20). The writer process's peak is a read's frames and its caches:
   tens of MiB, kept. Elsewhere (no glibc) it does nothing. */
static PyObject *keep_memory(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"keep_memory", keep_memory, METH_NOARGS,
     "keep_memory() -> bool: glibc's malloc keeps freed memory (no trim, no mmap < 32 MiB)"},
    {"lines", (PyCFunction)(void (*)(void))lines, METH_FASTCALL,
     "lines(first_seq, events, info, messages, shapes, message_info, cache_message, "
     "cache_shape, fallback) -> bytes: ChildWriter._format(first_seq, events).encode()"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_lines",
    .m_doc = "The event-log writer's common line in C (issue 20).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__lines(void) { return PyModule_Create(&module_def); }
