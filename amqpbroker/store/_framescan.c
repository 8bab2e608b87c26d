/* The open's bulk frame reader in C (issue 23 item 4, "Recovery, fifth pass").

   `scan(data, pos, batch, top, batches, strings)` reads the frames the broker writes per
   message, an AddMessage of the issue-23 layout (10 fields) and an AddRef, from `pos` on,
   exactly as `frames.read_batches` does with `codec.add_message_layout` and
   `codec.add_ref_row`: the same checks (length, flags, crc32 of the length field and of
   type, flags and payload, every tag and length of the payload), the same entries
   appended to `batch` (`(MessageLayout | RefRow, offset, frame size)`), each complete
   append moved to `batches` as `(batch, largest message id)`. It stops, without
   consuming it, at the first frame that is not one of the two or is not sound in every
   respect, and returns `(pos, batch, top)`: `read_batches` reads that frame itself, with
   its own checks, so stopping early is always safe (it only costs speed). Names
   (addresses, queues) go through `strings` as `codec._string` does (one str per name).

   Built only with the compiled build (setup.py, beside mypyc's modules); without it
   `frames.read_batches` does all of it. The crc32 is zlib's (the same polynomial and
   conventions, `zlib.crc32(data, value)`), computed here slicing-by-8: no zlib headers
   needed (tests compare both on random data). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FRAME_BYTES 12
#define MAX_PAYLOAD (1u << 30)
#define BATCH_END 1u
#define ADD_REF 32
#define ADD_MESSAGE 45
#define TAG_FALSE 1
#define TAG_TRUE 2
#define TAG_INT 3
#define TAG_STR 4
#define TAG_BYTES 5
#define STRINGS_MAX 10000

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

static inline uint32_t rd32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v; /* little-endian hosts only: checked at import */
}

static inline int64_t rd64(const unsigned char *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* zlib.crc32(buf[:len], crc), a table lookup per byte (slicing-by-8): the portable path
   and the tail of the folding one below. */
static uint32_t crc32_tables(uint32_t crc, const unsigned char *buf, size_t len) {
    crc = ~crc;
    while (len && ((uintptr_t)buf & 7)) {
        crc = crc_table[0][(crc ^ *buf++) & 0xff] ^ (crc >> 8);
        len--;
    }
    while (len >= 8) {
        uint32_t one = rd32(buf) ^ crc;
        uint32_t two = rd32(buf + 4);
        crc = crc_table[7][one & 0xff] ^ crc_table[6][(one >> 8) & 0xff] ^
              crc_table[5][(one >> 16) & 0xff] ^ crc_table[4][one >> 24] ^
              crc_table[3][two & 0xff] ^ crc_table[2][(two >> 8) & 0xff] ^
              crc_table[1][(two >> 16) & 0xff] ^ crc_table[0][two >> 24];
        buf += 8;
        len -= 8;
    }
    while (len--)
        crc = crc_table[0][(crc ^ *buf++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FOLD_CRC 1
/* The crc of 64 bytes or more, a multiple of 16, by carry-less multiplication (PCLMULQDQ):
   "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Gopal,
   Ozturk et al., Intel, 2009), with the bit-reflected constants of zlib's polynomial
   given at the end of the paper, as zlib-ng and Chromium's zlib compute it. `crc` and
   the result are the inverted state (no ~ on either side): `crc32_fold` wraps it. About
   6x fewer cycles a byte than the tables (issue 23: the crc was ~8% of a 1M-message
   recovery). */
__attribute__((target("sse4.1,pclmul"))) static uint32_t
crc32_clmul(const unsigned char *buf, size_t len, uint32_t crc) {
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;
    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = k1k2;
    buf += 64;
    len -= 64;
    while (len >= 64) { /* four lanes folded in parallel */
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64;
        len -= 64;
    }
    x0 = k3k4; /* the four lanes into one */
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) { /* the rest, 16 bytes at a time */
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10); /* 128 bits to 64 */
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    x0 = poly; /* Barrett reduction to 32 bits */
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}

static int have_clmul; /* set at import: the CPU has PCLMULQDQ and SSE4.1 */

static uint32_t crc32_update(uint32_t crc, const unsigned char *buf, size_t len) {
    if (have_clmul && len >= 64) {
        size_t folded = len & ~(size_t)15;
        crc = ~crc32_clmul(buf, folded, ~crc);
        buf += folded;
        len -= folded;
    }
    return len ? crc32_tables(crc, buf, len) : crc;
}
#else
#define crc32_update crc32_tables
#endif

/* `codec._string`: the str of a name's UTF-8 bytes, shared through `strings`. A new
   reference, or NULL with no error set when the bytes are not UTF-8 (the caller stops). */
typedef struct {
    const unsigned char *raw;
    Py_ssize_t len;
    PyObject *text; /* borrowed from `strings` or from the caller's entries */
} last_name;

static PyObject *name_of(PyObject *strings, const unsigned char *raw, Py_ssize_t len,
                         last_name *last) {
    if (last->text != NULL && last->len == len && memcmp(last->raw, raw, len) == 0) {
        Py_INCREF(last->text);
        return last->text;
    }
    PyObject *key = PyBytes_FromStringAndSize((const char *)raw, len);
    if (key == NULL)
        return NULL;
    PyObject *text = PyDict_GetItemWithError(strings, key);
    if (text != NULL) {
        Py_INCREF(text);
    } else if (PyErr_Occurred()) {
        Py_DECREF(key);
        return NULL;
    } else {
        text = PyUnicode_DecodeUTF8((const char *)raw, len, NULL);
        if (text == NULL) {
            Py_DECREF(key);
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                PyErr_Clear(); /* not ours: `read_batches` gives the full checks */
            return NULL;
        }
        if (PyDict_GET_SIZE(strings) < STRINGS_MAX && PyDict_SetItem(strings, key, text) < 0) {
            Py_DECREF(key);
            Py_DECREF(text);
            return NULL;
        }
    }
    Py_DECREF(key);
    last->raw = raw;
    last->len = len;
    last->text = text; /* alive while the caller's entry holds it */
    return text;
}

/* The MessageLayout of an AddMessage payload at [start, stop), or NULL (error set only
   on a real error, e.g. no memory). `*msg_id` is set. */
static PyObject *message_layout(const unsigned char *buf, Py_ssize_t start, Py_ssize_t stop,
                                PyObject *strings, last_name *last, int64_t *msg_id) {
    const unsigned char *p = buf + start;
    if (stop - start < 15 || p[0] != 10 || p[1] != TAG_INT || p[10] != TAG_STR)
        return NULL; /* (a 7-field layout, before issue 23: `read_batches` reads it) */
    Py_ssize_t address_len = rd32(p + 11);
    if (address_len > stop - start - 15 - 6)
        return NULL;
    Py_ssize_t pos = start + 15 + address_len;
    const unsigned char *q = buf + pos;
    int durable = q[0];
    Py_ssize_t data_len = rd32(q + 2);
    if ((durable != TAG_TRUE && durable != TAG_FALSE) || q[1] != TAG_BYTES)
        return NULL;
    Py_ssize_t data_start = pos + 6;
    if (data_len > stop - data_start || stop - data_start - data_len != 54)
        return NULL;
    Py_ssize_t end = data_start + data_len;
    const unsigned char *r = buf + end;
    for (int i = 0; i < 6; i++)
        if (r[9 * i] != TAG_INT)
            return NULL;
    PyObject *address = name_of(strings, p + 15, address_len, last);
    if (address == NULL)
        return NULL;
    *msg_id = rd64(p + 2);
    PyObject *items[11];
    items[0] = PyLong_FromLongLong(*msg_id);
    items[1] = address;
    items[2] = PyBool_FromLong(durable == TAG_TRUE);
    items[3] = PyLong_FromSsize_t(data_start);
    items[4] = PyLong_FromSsize_t(end);
    for (int i = 0; i < 6; i++)
        items[5 + i] = PyLong_FromLongLong(rd64(r + 9 * i + 1));
    PyObject *layout = PyTuple_New(11);
    int ok = layout != NULL;
    for (int i = 0; i < 11; i++)
        ok = ok && items[i] != NULL;
    if (!ok) {
        for (int i = 0; i < 11; i++)
            Py_XDECREF(items[i]);
        Py_XDECREF(layout);
        return NULL;
    }
    for (int i = 0; i < 11; i++)
        PyTuple_SET_ITEM(layout, i, items[i]);
    return layout;
}

/* The RefRow of an AddRef payload at [start, stop), or NULL (as above). */
static PyObject *ref_row(const unsigned char *buf, Py_ssize_t start, Py_ssize_t stop,
                         PyObject *strings, last_name *last, int64_t *msg_id) {
    const unsigned char *p = buf + start;
    if (stop - start < 6 + 18 || p[0] != 3 || p[1] != TAG_STR)
        return NULL;
    Py_ssize_t queue_len = rd32(p + 2);
    if (queue_len != stop - start - 6 - 18)
        return NULL;
    const unsigned char *r = p + 6 + queue_len;
    if (r[0] != TAG_INT || r[9] != TAG_INT)
        return NULL;
    PyObject *queue = name_of(strings, p + 6, queue_len, last);
    if (queue == NULL)
        return NULL;
    *msg_id = rd64(r + 1);
    PyObject *id = PyLong_FromLongLong(*msg_id);
    PyObject *count = PyLong_FromLongLong(rd64(r + 10));
    if (id == NULL || count == NULL) {
        Py_XDECREF(id);
        Py_XDECREF(count);
        Py_DECREF(queue);
        return NULL;
    }
    PyObject *row = PyTuple_New(3);
    if (row == NULL) {
        Py_DECREF(id);
        Py_DECREF(count);
        Py_DECREF(queue);
        return NULL;
    }
    PyTuple_SET_ITEM(row, 0, id);
    PyTuple_SET_ITEM(row, 1, queue);
    PyTuple_SET_ITEM(row, 2, count);
    return row;
}

static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "scan(data, pos, batch, top, batches, strings)");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    PyObject *batch = args[2];
    long long top = PyLong_AsLongLong(args[3]);
    if (top == -1 && PyErr_Occurred())
        return NULL;
    PyObject *batches = args[4];
    PyObject *strings = args[5];
    if (!PyList_Check(batch) || !PyList_Check(batches) || !PyDict_Check(strings)) {
        PyErr_SetString(PyExc_TypeError, "scan: batch, batches: list; strings: dict");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t size = view.len;
    Py_INCREF(batch);
    last_name last = {NULL, 0, NULL};
    uint32_t heads_len = 0xffffffffu, head = 0; /* the crc of the last length field */
    int failed = 0;
    while (pos >= 0 && size - pos >= FRAME_BYTES) {
        const unsigned char *f = buf + pos;
        uint32_t length = rd32(f);
        uint32_t crc = rd32(f + 4);
        unsigned type_id = f[8] | (unsigned)f[9] << 8;
        unsigned flags = f[10] | (unsigned)f[11] << 8;
        if ((type_id != ADD_MESSAGE && type_id != ADD_REF) || (flags & ~BATCH_END) ||
            length > MAX_PAYLOAD || (Py_ssize_t)length > size - pos - FRAME_BYTES)
            break;
        Py_ssize_t end = pos + FRAME_BYTES + length;
        if (length != heads_len) {
            heads_len = length;
            head = crc32_update(0, f, 4);
        }
        if (crc32_update(head, f + 8, (size_t)(end - pos - 8)) != crc)
            break;
        int64_t msg_id = 0;
        PyObject *record = type_id == ADD_MESSAGE
            ? message_layout(buf, pos + FRAME_BYTES, end, strings, &last, &msg_id)
            : ref_row(buf, pos + FRAME_BYTES, end, strings, &last, &msg_id);
        if (record == NULL) {
            failed = PyErr_Occurred() != NULL;
            break;
        }
        PyObject *offset = PyLong_FromSsize_t(pos);
        PyObject *frame_size = PyLong_FromSsize_t(end - pos);
        PyObject *entry = offset && frame_size ? PyTuple_New(3) : NULL;
        if (entry == NULL) {
            Py_XDECREF(offset);
            Py_XDECREF(frame_size);
            Py_DECREF(record);
            failed = 1;
            break;
        }
        PyTuple_SET_ITEM(entry, 0, record);
        PyTuple_SET_ITEM(entry, 1, offset);
        PyTuple_SET_ITEM(entry, 2, frame_size);
        int appended = PyList_Append(batch, entry);
        Py_DECREF(entry);
        if (appended < 0) {
            failed = 1;
            break;
        }
        if (msg_id > top)
            top = msg_id;
        pos = end;
        if (flags & BATCH_END) {
            PyObject *done = Py_BuildValue("(OL)", batch, top);
            if (done == NULL || PyList_Append(batches, done) < 0) {
                Py_XDECREF(done);
                failed = 1;
                break;
            }
            Py_DECREF(done);
            Py_DECREF(batch);
            batch = PyList_New(0);
            if (batch == NULL) {
                PyBuffer_Release(&view);
                return NULL;
            }
            top = 0;
        }
    }
    PyBuffer_Release(&view);
    if (failed) {
        Py_DECREF(batch);
        return NULL;
    }
    PyObject *result = Py_BuildValue("(nOL)", pos, batch, top);
    Py_DECREF(batch);
    return result;
}

/* crc32(data, value) through `fn`: the module's two entry points (the one the reader
   uses, and the tables alone for the test that checks both against zlib). */
static PyObject *crc32_call(uint32_t (*fn)(uint32_t, const unsigned char *, size_t),
                            const char *usage, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    unsigned long value = PyLong_AsUnsignedLongMask(args[1]);
    if (value == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc = fn((uint32_t)value, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *crc32_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return crc32_call(crc32_update, "crc32(data, value)", args, nargs);
}

static PyObject *crc32_tables_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return crc32_call(crc32_tables, "crc32_tables(data, value)", args, nargs);
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "Read the usual frames in bulk (see the module's comment)."},
    {"crc32", (PyCFunction)(void (*)(void))crc32_py, METH_FASTCALL,
     "zlib.crc32(data, value), as scan computes it (for the tests)."},
    {"crc32_tables", (PyCFunction)(void (*)(void))crc32_tables_py, METH_FASTCALL,
     "zlib.crc32(data, value) by the tables alone (the portable path, for the tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_framescan", "The open's bulk frame reader (issue 23).", -1, methods,
};

PyMODINIT_FUNC PyInit__framescan(void) {
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1) {
        PyErr_SetString(PyExc_ImportError, "_framescan: little-endian hosts only");
        return NULL;
    }
    crc_init();
#ifdef FOLD_CRC
    __builtin_cpu_init();
    have_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
    PyObject *created = PyModule_Create(&module);
#ifdef FOLD_CRC
    if (created != NULL && PyModule_AddIntConstant(created, "FOLDED_CRC", have_clmul) < 0) {
        Py_DECREF(created);
        return NULL;
    }
#else
    if (created != NULL && PyModule_AddIntConstant(created, "FOLDED_CRC", 0) < 0) {
        Py_DECREF(created);
        return NULL;
    }
#endif
    return created;
}
