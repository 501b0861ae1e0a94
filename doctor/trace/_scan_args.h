/* The args of many events at once, for the trace scanner's caller (included by _scan.c, its
 * one translation unit). */
#ifndef DOCTOR_SCAN_ARGS_H
#define DOCTOR_SCAN_ARGS_H

/* -- values of an event's args, for many events at once ---------------------------------- */

#define MAX_KEYS 8

/* The values of `keys` among the members of the args object at p (spans[k] = NULL when
 * absent): 0, or -1 when it is not a whole object. */
static int find_members(const char *p, const char *end, PyObject *keys, Py_ssize_t nkeys,
                        const char **lo, const char **hi) {
    for (Py_ssize_t k = 0; k < nkeys; k++) lo[k] = hi[k] = NULL;
    if (p >= end || *p != '{') return -1;
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') return 0;
    for (;;) {
        const char *k, *q;
        Py_ssize_t kn;
        if (member_key(&p, end, &k, &kn) != OK_EVENT) return -1;
        q = skip_value(p, end);
        if (IS_BAD(q)) return -1;
        for (Py_ssize_t i = 0; i < nkeys; i++) {
            PyObject *key = PyTuple_GET_ITEM(keys, i);
            if (PyBytes_GET_SIZE(key) == kn && memcmp(PyBytes_AS_STRING(key), k, (size_t)kn) == 0) {
                lo[i] = p; /* the last of a repeated key, as a decoder keeps it */
                hi[i] = q;
            }
        }
        p = skip_ws(q, end);
        if (p >= end) return -1;
        if (*p == '}') return 0;
        if (*p != ',') return -1;
        p = skip_ws(p + 1, end);
    }
}

typedef struct {
    Py_buffer text, lo, hi;
    Py_ssize_t rows, nkeys;
    PyObject *keys;
} ArgsQuery;

static void query_close(ArgsQuery *q);
static int writable_out(PyObject *obj, Py_buffer *out, Py_ssize_t need);

/* Parse (buf, lo, hi, keys, [interner,] out): the query, and out as a writable buffer of
 * itemsize bytes a row (a key, with per_key). interner NULL: the call takes none. 0, or -1 with
 * an exception set and nothing held. */
static int query_open(PyObject *args, ArgsQuery *q, PyObject **interner, Py_buffer *out,
                      Py_ssize_t itemsize, int per_key) {
    PyObject *buf, *lo, *hi, *fifth = NULL, *sixth = NULL;
    if (!PyArg_ParseTuple(args, "OOOO!O|O", &buf, &lo, &hi, &PyTuple_Type, &q->keys, &fifth,
                          &sixth))
        return -1;
    PyObject *out_obj = interner ? sixth : fifth;
    if (interner) *interner = fifth;
    if (!interner && sixth) {
        PyErr_SetString(PyExc_TypeError, "too many arguments");
        return -1;
    }
    q->nkeys = PyTuple_GET_SIZE(q->keys);
    if (q->nkeys > MAX_KEYS) {
        PyErr_SetString(PyExc_ValueError, "too many keys");
        return -1;
    }
    for (Py_ssize_t k = 0; k < q->nkeys; k++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(q->keys, k))) {
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            return -1;
        }
    }
    if (PyObject_GetBuffer(buf, &q->text, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(lo, &q->lo, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&q->text);
        return -1;
    }
    if (PyObject_GetBuffer(hi, &q->hi, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&q->text);
        PyBuffer_Release(&q->lo);
        return -1;
    }
    q->rows = q->lo.len / 8;
    if (q->hi.len / 8 < q->rows) q->rows = q->hi.len / 8;
    if (writable_out(out_obj, out, q->rows * itemsize * (per_key ? q->nkeys : 1)) < 0) {
        query_close(q);
        return -1;
    }
    return 0;
}

static void query_close(ArgsQuery *q) {
    PyBuffer_Release(&q->text);
    PyBuffer_Release(&q->lo);
    PyBuffer_Release(&q->hi);
}

/* Row i's args object: its span in the text, or 0 when it has none. */
static int query_row(ArgsQuery *q, Py_ssize_t i, const char **p, const char **end) {
    int64_t lo = ((int64_t *)q->lo.buf)[i], hi = ((int64_t *)q->hi.buf)[i];
    if (lo < 0 || hi > q->text.len || lo > hi) return 0;
    *p = (const char *)q->text.buf + lo;
    *end = (const char *)q->text.buf + hi;
    return 1;
}

/* obj as a writable buffer of at least `need` bytes: 0, or -1 with an exception set. */
static int writable_out(PyObject *obj, Py_buffer *out, Py_ssize_t need) {
    if (!obj) {
        PyErr_SetString(PyExc_TypeError, "out is missing");
        return -1;
    }
    if (PyObject_GetBuffer(obj, out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (out->len < need) {
        PyErr_SetString(PyExc_ValueError, "out is too small");
        PyBuffer_Release(out);
        return -1;
    }
    return 0;
}

/* What each row's query reads, for the docstrings. */
#define OF_ROW_ARGS \
    "of the args\nmembers named by keys (a tuple of bytes) of the args object at buf[lo[i]:hi[i]]\n(lo -1: none)"

PyDoc_STRVAR(args_numbers_doc,
"args_numbers(buf, lo, hi, keys, out) -> bool\n\n"
"For each row i, the values " OF_ROW_ARGS " into out[i, k] (float64, rows x keys): a number\n"
"as Python's float() reads it, nan for anything else. False (out unfinished) when a value is\n"
"a string: its number is for the slow way to read.");

static PyObject *args_numbers(PyObject *module, PyObject *args) {
    ArgsQuery q;
    Py_buffer out;
    if (query_open(args, &q, NULL, &out, 8, 1) < 0) return NULL;
    double *o = out.buf;
    int ok = 1;
    check_locale();
    const char *vlo[MAX_KEYS], *vhi[MAX_KEYS];
    for (Py_ssize_t i = 0; i < q.rows && ok; i++) {
        const char *p, *end;
        double *row = o + i * q.nkeys;
        for (Py_ssize_t k = 0; k < q.nkeys; k++) row[k] = NAN;
        if (!query_row(&q, i, &p, &end) || find_members(p, end, q.keys, q.nkeys, vlo, vhi) < 0)
            continue;
        for (Py_ssize_t k = 0; k < q.nkeys; k++) {
            const char *v = vlo[k];
            if (!v) continue;
            if (*v == '"') {
                ok = 0;
                break;
            }
            if (*v == '-' || (*v >= '0' && *v <= '9')) {
                int slow = 0;
                row[k] = number_value(v, vhi[k] - v, &slow);
                if (slow) {
                    ok = 0;
                    break;
                }
            }
        }
    }
    PyBuffer_Release(&out);
    query_close(&q);
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(args_ids_doc,
"args_ids(buf, lo, hi, keys, interner, out)\n\n"
"For each row i, the id in interner (an Interner) of the text of the values " OF_ROW_ARGS ",\n"
"into out (int32): equal texts are equal values, so the id is a key to cache what is made of\n"
"them.");

static PyObject *args_ids(PyObject *module, PyObject *args) {
    ArgsQuery q;
    PyObject *table = NULL;
    Py_buffer out;
    if (query_open(args, &q, &table, &out, 4, 0) < 0) return NULL;
    if (check_interner(table) < 0) {
        PyBuffer_Release(&out);
        query_close(&q);
        return NULL;
    }
    int32_t *ids = out.buf;
    const char *vlo[MAX_KEYS], *vhi[MAX_KEYS];
    char local[4096];
    char *text = local;
    Py_ssize_t cap = sizeof(local);
    int failed = 0;
    for (Py_ssize_t i = 0; i < q.rows && !failed; i++) {
        const char *p, *end;
        Py_ssize_t n = 0;
        if (!query_row(&q, i, &p, &end)) {
            n = 0; /* no args: the empty text */
        } else if (find_members(p, end, q.keys, q.nkeys, vlo, vhi) < 0) {
            /* not read: the whole text, which starts with '{' (never the first byte below) */
            vlo[0] = p;
            vhi[0] = end;
            n = -1;
        } else {
            n = 1;
            for (Py_ssize_t k = 0; k < q.nkeys; k++) n += 1 + (vlo[k] ? vhi[k] - vlo[k] : 0);
        }
        Py_ssize_t need = n < 0 ? vhi[0] - vlo[0] : n;
        if (need > cap) {
            char *grown = PyMem_Malloc((size_t)need);
            if (!grown) {
                PyErr_NoMemory();
                failed = 1;
                break;
            }
            if (text != local) PyMem_Free(text);
            text = grown;
            cap = need;
        }
        if (n < 0) {
            memcpy(text, vlo[0], (size_t)need);
        } else if (n > 0) {
            char *w = text;
            *w++ = '\x02';
            for (Py_ssize_t k = 0; k < q.nkeys; k++) {
                *w++ = vlo[k] ? '\x01' : '\x00';
                if (vlo[k]) {
                    memcpy(w, vlo[k], (size_t)(vhi[k] - vlo[k]));
                    w += vhi[k] - vlo[k];
                }
            }
        }
        int32_t id = intern((Interner *)table, text, need);
        if (id < 0) {
            PyErr_NoMemory();
            failed = 1;
            break;
        }
        ids[i] = id;
    }
    if (text != local) PyMem_Free(text);
    PyBuffer_Release(&out);
    query_close(&q);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

#endif
