/* The hot path's calls into the Proton engine (issue 20): a plain CPython extension
   (METH_FASTCALL, built by setup.py C_MODULES beside mypyc's modules) that does what
   `transfers.py` and `shell.py` did with several cffi calls per message in one, and
   takes and returns proton's pointers as Python ints (their addresses): no cdata object
   is made per call, and cffi's conversions of arguments and results (0.7-1.2k
   instructions a call, callgrind) are gone. `protocol/pnloop.py` says which maps are
   keyed by these ints (`key`) and turns one back into a cdata for proton's wrappers on
   the rare paths (`pointer`).

   Proton's functions are called through pointers that `pnloop.py` takes from
   python-qpid-proton's own binding (`bind`), so nothing is linked against it. Loop
   thread only: the calls touch the engine of that thread's own connection and never
   block, so the GIL is kept. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stddef.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

typedef struct { size_t size; const char *start; } amqpb_bytes;

/* PN_DELIVERY, PN_LINK_FLOW, PN_ACCEPTED, PN_MODIFIED: pnloop.py checks them against
   proton's. */
enum { AMQPB_DELIVERY = 28, AMQPB_LINK_FLOW = 26, AMQPB_ACCEPTED = 36, AMQPB_MODIFIED = 39 };

static void *(*collector_peek)(void *);
static bool (*collector_pop)(void *);
static void *(*event_delivery)(void *);
static int (*event_type)(void *);
static void *(*event_link)(void *);
static void *(*delivery_link)(void *);
static size_t (*delivery_pending)(void *);
static bool (*delivery_partial)(void *);
static uint64_t (*delivery_remote_state)(void *);
static ssize_t (*link_recv)(void *, char *, size_t);
static bool (*link_advance)(void *);
static void (*delivery_update)(void *, uint64_t);
static void (*delivery_settle)(void *);
static void *(*delivery_new)(void *, amqpb_bytes);
static ssize_t (*link_send)(void *, const char *, size_t);
static int (*link_credit)(void *);
static bool (*link_get_drain)(void *);
static int (*object_decref)(void *);
static void *(*delivery_remote)(void *);
static bool (*disposition_is_failed)(void *);
static bool (*disposition_is_undeliverable)(void *);
static void *(*link_current)(void *);
static bool (*delivery_aborted)(void *);
static bool (*delivery_settled)(void *);
static void (*link_flow)(void *, int);
static void *(*object_incref)(void *);
static bool (*link_is_receiver)(void *);
static ssize_t (*transport_pending)(void *);
static int (*transport_peek)(void *, char *, size_t);
static void (*transport_pop)(void *, size_t);

/* The order of pnloop.py's FUNCTIONS. */
static void **const SLOTS[] = {
    (void **)&collector_peek, (void **)&collector_pop, (void **)&event_delivery,
    (void **)&event_type, (void **)&event_link, (void **)&delivery_link,
    (void **)&delivery_pending, (void **)&delivery_partial, (void **)&delivery_remote_state,
    (void **)&link_recv, (void **)&link_advance, (void **)&delivery_update,
    (void **)&delivery_settle, (void **)&delivery_new, (void **)&link_send,
    (void **)&link_credit, (void **)&link_get_drain, (void **)&object_decref,
    (void **)&delivery_remote, (void **)&disposition_is_failed,
    (void **)&disposition_is_undeliverable, (void **)&link_current,
    (void **)&delivery_aborted, (void **)&delivery_settled, (void **)&link_flow,
    (void **)&object_incref, (void **)&link_is_receiver, (void **)&transport_pending,
    (void **)&transport_peek, (void **)&transport_pop,
};
#define NSLOTS ((Py_ssize_t)(sizeof(SLOTS) / sizeof(SLOTS[0])))
static int bound = 0;

/* A pointer argument: a Python int (its address); NULL (and an exception) for another
   type, 0, or before `bind`: the engine is never called with NULL or unbound. */
static inline void *ptr(PyObject *arg) {
    void *p = PyLong_AsVoidPtr(arg);
    if (p == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "_pnloop: a NULL pointer");
    return p;
}

static inline PyObject *address(void *p) { return PyLong_FromVoidPtr(p); }

static int arity(const char *name, Py_ssize_t nargs, Py_ssize_t expected) {
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "_pnloop: not bound (pnloop.bind)");
        return -1;
    }
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "_pnloop.%s takes %zd arguments (%zd given)", name,
                     expected, nargs);
        return -1;
    }
    return 0;
}

/* bind(addresses): proton's functions, a tuple of ints in FUNCTIONS' order; returns how
   many were bound, -1 for a wrong count or a NULL. */
static PyObject *m_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "_pnloop.bind takes one tuple");
        return NULL;
    }
    PyObject *functions = args[0];
    if (PyTuple_GET_SIZE(functions) != NSLOTS) return PyLong_FromLong(-1);
    void *found[sizeof(SLOTS) / sizeof(SLOTS[0])];
    for (Py_ssize_t i = 0; i < NSLOTS; i++) {
        found[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(functions, i));
        if (found[i] == NULL) {
            if (PyErr_Occurred()) return NULL;
            return PyLong_FromLong(-1);
        }
    }
    for (Py_ssize_t i = 0; i < NSLOTS; i++) *SLOTS[i] = found[i];
    bound = 1;
    return PyLong_FromSsize_t(NSLOTS);
}

/* next(collector, pop_previous): the collector's next event (the previous one popped
   first if `pop_previous`) as (packed, link, other), or None for none. `link`: the
   delivery's link, else the event's (0 if none); `other`: the delivery of a PN_DELIVERY,
   else the event itself (for proton's wrapper, `pnloop.pointer`). `packed`: bits 0-7 the
   event type; of a delivery, bit 8 whether it is partial, bits 9-16 its remote state
   (255 for one of 255 or more: read it with `remote_state`), bits 17-18 of a modified
   state 2 x delivery-failed + undeliverable-here, bits 19- its pending bytes; of
   PN_LINK_FLOW, bit 8 whether the link drains, bits 9- its credit (signed: the result
   is credit x 512 + ...). */
static PyObject *m_next(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (arity("next", nargs, 2) < 0) return NULL;
    void *collector = ptr(args[0]);
    if (collector == NULL) return NULL;
    int pop_previous = PyObject_IsTrue(args[1]);
    if (pop_previous < 0) return NULL;
    if (pop_previous) collector_pop(collector);
    void *event = collector_peek(collector);
    if (event == NULL) Py_RETURN_NONE;
    void *delivery = event_delivery(event);
    int64_t packed;
    void *link;
    void *other;
    if (delivery != NULL) {
        link = delivery_link(delivery);
        other = delivery;
        uint64_t state = delivery_remote_state(delivery);
        packed = AMQPB_DELIVERY;
        if (delivery_partial(delivery)) packed |= 1 << 8;
        if (state >= 255) state = 255;
        packed |= (int64_t)state << 9;
        if (state == AMQPB_MODIFIED) {
            void *remote = delivery_remote(delivery);
            packed |= (int64_t)((disposition_is_failed(remote) ? 2 : 0) +
                                (disposition_is_undeliverable(remote) ? 1 : 0))
                      << 17;
        }
        packed |= (int64_t)delivery_pending(delivery) << 19;
    } else {
        link = event_link(event);
        other = event;
        int type = event_type(event);
        if (type == AMQPB_LINK_FLOW && link != NULL)
            packed = (int64_t)link_credit(link) * 512 + (link_get_drain(link) ? 256 : 0) + type;
        else
            packed = type;
    }
    PyObject *result = PyTuple_New(3);
    if (result == NULL) return NULL;
    PyObject *items[3] = {PyLong_FromLongLong(packed), address(link), address(other)};
    for (int i = 0; i < 3; i++) {
        if (items[i] == NULL) {
            Py_DECREF(result);
            for (int j = 0; j < 3; j++) Py_XDECREF(items[j]);
            return NULL;
        }
    }
    for (int i = 0; i < 3; i++) PyTuple_SET_ITEM(result, i, items[i]);
    return result;
}

/* recv(link, size): the link's current (complete) delivery's bytes (up to `size`), the
   link advanced; or proton's negative code (PN_ABORTED, PN_EOS) as an int. The bytes
   object is the buffer proton copies into: no buffer and copy of the loop's. */
static PyObject *m_recv(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (arity("recv", nargs, 2) < 0) return NULL;
    void *link = ptr(args[0]);
    if (link == NULL) return NULL;
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (size < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "_pnloop.recv: size < 0");
        return NULL;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, size);
    if (data == NULL) return NULL;
    ssize_t received = link_recv(link, PyBytes_AS_STRING(data), (size_t)size);
    link_advance(link);
    if (received < 0) {
        Py_DECREF(data);
        return PyLong_FromSsize_t(received);
    }
    if (received < size && _PyBytes_Resize(&data, received) < 0) return NULL;
    return data;
}

/* output(transport): the engine's next output buffer (one `pn_transport_pending`'s worth,
   a few frames) popped, as bytes; b"" when it has none, None when its output side is
   closed. Peeked straight into the bytes object: connection.py peeked into a buffer and
   copied that into bytes (the output's every byte twice, ~1.1k instructions a queue
   message under callgrind, which counts a large copy a byte an instruction). */
static PyObject *m_output(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (arity("output", nargs, 1) < 0) return NULL;
    void *transport = ptr(args[0]);
    if (transport == NULL) return NULL;
    ssize_t pending = transport_pending(transport);
    if (pending < 0) Py_RETURN_NONE;
    PyObject *data = PyBytes_FromStringAndSize(NULL, pending);
    if (data == NULL || pending == 0) return data;
    if (transport_peek(transport, PyBytes_AS_STRING(data), (size_t)pending) < 0) {
        Py_DECREF(data);
        PyErr_SetString(PyExc_RuntimeError, "_pnloop.output: pn_transport_peek failed");
        return NULL;
    }
    transport_pop(transport, (size_t)pending);
    return data;
}

/* One pointer argument, the C function called on it: the calls of one step fused. */
#define ONE_POINTER(NAME, BODY)                                                          \
    static PyObject *m_##NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs) { \
        if (arity(#NAME, nargs, 1) < 0) return NULL;                                     \
        void *p = ptr(args[0]);                                                          \
        if (p == NULL) return NULL;                                                      \
        BODY                                                                             \
    }

ONE_POINTER(accept, {
    delivery_update(p, AMQPB_ACCEPTED);
    delivery_settle(p);
    Py_RETURN_NONE;
})
ONE_POINTER(settle, {
    delivery_settle(p);
    Py_RETURN_NONE;
})
/* A durable send stored: accepted, settled, and the reference the loop kept let go. */
ONE_POINTER(accept_stored, {
    delivery_update(p, AMQPB_ACCEPTED);
    delivery_settle(p);
    object_decref(p);
    Py_RETURN_NONE;
})
ONE_POINTER(incref, {
    object_incref(p);
    Py_RETURN_NONE;
})
ONE_POINTER(decref, {
    object_decref(p);
    Py_RETURN_NONE;
})
ONE_POINTER(link_credit, return PyLong_FromLong(link_credit(p));)
ONE_POINTER(link_current, return address(link_current(p));)
ONE_POINTER(link_is_receiver, return PyBool_FromLong(link_is_receiver(p));)
ONE_POINTER(delivery_aborted, return PyBool_FromLong(delivery_aborted(p));)
ONE_POINTER(delivery_settled, return PyBool_FromLong(delivery_settled(p));)
ONE_POINTER(delivery_partial, return PyBool_FromLong(delivery_partial(p));)
ONE_POINTER(delivery_pending, return PyLong_FromSize_t(delivery_pending(p));)
ONE_POINTER(remote_state, return PyLong_FromUnsignedLongLong(delivery_remote_state(p));)

static PyObject *m_link_flow(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (arity("link_flow", nargs, 2) < 0) return NULL;
    void *link = ptr(args[0]);
    if (link == NULL) return NULL;
    long credit = PyLong_AsLong(args[1]);
    if (credit == -1 && PyErr_Occurred()) return NULL;
    if (credit < INT_MIN || credit > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "_pnloop.link_flow: credit out of range");
        return NULL;
    }
    link_flow(link, (int)credit);
    Py_RETURN_NONE;
}

/* `id` in decimal at the end of `end`'s buffer (20 bytes before it hold any uint64): where
   it starts. snprintf cost ~700 instructions a send (callgrind, issue 20). */
static char *decimal(char *end, uint64_t id) {
    char *start = end;
    do {
        *--start = (char)('0' + id % 10);
        id /= 10;
    } while (id != 0);
    return start;
}

/* send(link, id, data, settle): a transfer of `data` (bytes, or any buffer) on `link`
   tagged with `id` (a uint64) in decimal (`shell.delivery_id_of` reads it back), settled
   at once if `settle`: the new delivery's address. */
static PyObject *m_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (arity("send", nargs, 4) < 0) return NULL;
    void *link = ptr(args[0]);
    if (link == NULL) return NULL;
    uint64_t id = PyLong_AsUnsignedLongLong(args[1]);
    if (id == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    int settle = PyObject_IsTrue(args[3]);
    if (settle < 0) return NULL;
    Py_buffer view;
    const char *data;
    Py_ssize_t size;
    int viewed = 0;
    if (PyBytes_CheckExact(args[2])) {
        data = PyBytes_AS_STRING(args[2]);
        size = PyBytes_GET_SIZE(args[2]);
    } else {
        if (PyObject_GetBuffer(args[2], &view, PyBUF_SIMPLE) < 0) return NULL;
        viewed = 1;
        data = view.buf;
        size = view.len;
    }
    char tag[24];
    char *start = decimal(tag + sizeof(tag), id);
    amqpb_bytes bytes = {(size_t)(tag + sizeof(tag) - start), start};
    void *delivery = delivery_new(link, bytes);
    link_send(link, data, (size_t)size);  /* proton copies the bytes */
    link_advance(link);
    if (viewed) PyBuffer_Release(&view);
    if (settle) delivery_settle(delivery);
    return address(delivery);
}

/* send_headed(link, id, header, data, offset, settle): `send` of `header` followed by
   `data` from `offset` on (both bytes), without joining them first: a redelivery's
   re-encoded header (B-050) and the stored message's bytes after its old header. The
   join copied the message once more (a slice and a concatenation, ~1 KiB twice) before
   proton copies it again (issue 20). */
static PyObject *m_send_headed(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (arity("send_headed", nargs, 6) < 0) return NULL;
    void *link = ptr(args[0]);
    if (link == NULL) return NULL;
    uint64_t id = PyLong_AsUnsignedLongLong(args[1]);
    if (id == (uint64_t)-1 && PyErr_Occurred()) return NULL;
    if (!PyBytes_CheckExact(args[2]) || !PyBytes_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError, "_pnloop.send_headed: header and data must be bytes");
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[4]);
    if (offset == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t size = PyBytes_GET_SIZE(args[3]);
    if (offset < 0 || offset > size) {
        PyErr_SetString(PyExc_ValueError, "_pnloop.send_headed: offset out of range");
        return NULL;
    }
    int settle = PyObject_IsTrue(args[5]);
    if (settle < 0) return NULL;
    char tag[24];
    char *start = decimal(tag + sizeof(tag), id);
    amqpb_bytes bytes = {(size_t)(tag + sizeof(tag) - start), start};
    void *delivery = delivery_new(link, bytes);
    /* proton appends what each call gives to the delivery's bytes */
    link_send(link, PyBytes_AS_STRING(args[2]), (size_t)PyBytes_GET_SIZE(args[2]));
    link_send(link, PyBytes_AS_STRING(args[3]) + offset, (size_t)(size - offset));
    link_advance(link);
    if (settle) delivery_settle(delivery);
    return address(delivery);
}

#define FAST(NAME) {#NAME, (PyCFunction)(void (*)(void))m_##NAME, METH_FASTCALL, NULL}
static PyMethodDef methods[] = {
    FAST(bind), FAST(next), FAST(recv), FAST(accept), FAST(settle), FAST(accept_stored),
    FAST(incref), FAST(decref), FAST(link_credit), FAST(link_current),
    FAST(link_is_receiver), FAST(delivery_aborted), FAST(delivery_settled),
    FAST(delivery_partial), FAST(delivery_pending), FAST(remote_state), FAST(link_flow),
    FAST(send), FAST(send_headed), FAST(output), {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pnloop",
    "The hot path's engine calls, pointers as ints (issue 20, protocol/pnloop.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__pnloop(void) { return PyModule_Create(&module); }
