/* The events of a Chrome (Kineto) trace's event array, scanned straight into typed columns.
 *
 * doctor.trace.scan drives this: it hands a buffer of the array's bytes and a set of column
 * buffers (numpy arrays) to scan(), which reads whole events one after the other and writes the
 * few fields the analysis reads into row n of the columns, never making a Python object per
 * event:
 *   ph      1 when "ph" is "X" (a complete event), else 0
 *   name, cat, tid   the id of the string in that field's Interner (its raw bytes, escapes and
 *                    all, between the quotes; an integer tid by its digits; a missing or null
 *                    name or cat as "", a missing or null tid as "None", as str(None) says)
 *   ts, dur          the numbers (NaN: missing or null)
 *   corr             args.correlation when it is an integer, else -1
 *   args_lo, args_hi where the "args" object lies in the buffer (-1: none), for the few events
 *                    whose other args the analysis reads (decoded then, one by one)
 * An event whose fields have other types than these (a "ts" given as a string, "args" that is
 * not an object, an element that is not an object, escapes in a key or in "ph") is not scanned:
 * scan() stops before it and says ODD, and the caller decodes it the slow way, which knows what
 * the analysis makes of each. Text that is not JSON is ERROR; the caller reads the file again
 * the slow way, which says what is wrong with it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { NEED_MORE = 0, END = 1, FULL = 2, ODD = 3, ERROR = 4 };

#include "_scan_interner.h"
#include "_scan_json.h"
#include "_scan_args.h"

/* -- the scanner ------------------------------------------------------------------------ */

typedef struct {
    uint8_t *ph;
    int32_t *name, *cat, *tid;
    double *ts, *dur;
    int64_t *corr, *args_lo, *args_hi;
    Interner *names, *cats, *tids;
} Columns;

/* A string or null field: *id is the interned id (of `missing` when null). */
static int string_field(const char **pp, const char *end, Interner *in, const char *missing,
                        int32_t *id) {
    const char *p = *pp;
    if (*p == '"') {
        const char *q = skip_string(p, end, NULL);
        if (q == INCOMPLETE) return EV_INCOMPLETE;
        *id = intern(in, p + 1, q - p - 2);
        if (*id < 0) return EV_FAILED;
        *pp = q;
        return OK_EVENT;
    }
    if (*p == 'n') {
        const char *q = literal_end(p, end, "null");
        if (q == INCOMPLETE) return EV_INCOMPLETE;
        if (q == BROKEN) return EV_BROKEN;
        *id = intern(in, missing, (Py_ssize_t)strlen(missing));
        if (*id < 0) return EV_FAILED;
        *pp = q;
        return OK_EVENT;
    }
    return EV_ODD;
}

static int number_field(const char **pp, const char *end, double *out) {
    const char *p = *pp;
    if (*p == '-' || (*p >= '0' && *p <= '9')) {
        int is_int;
        const char *q = number_end(p, end, &is_int);
        if (q == INCOMPLETE) return EV_INCOMPLETE;
        if (q == BROKEN) return EV_BROKEN;
        int slow = 0;
        *out = number_value(p, q - p, &slow);
        if (slow) return EV_ODD;
        *pp = q;
        return OK_EVENT;
    }
    if (*p == 'n') {
        const char *q = literal_end(p, end, "null");
        if (q == INCOMPLETE) return EV_INCOMPLETE;
        if (q == BROKEN) return EV_BROKEN;
        *out = NAN;
        *pp = q;
        return OK_EVENT;
    }
    return EV_ODD;
}

/* An integer of at most 18 digits (so that it fits), as int64; 0 and *ok = 0 otherwise. */
static int64_t small_int(const char *p, const char *q, int *ok) {
    int neg = (*p == '-');
    const char *d = p + neg;
    if (q - d > 18 || q - d < 1) {
        *ok = 0;
        return 0;
    }
    int64_t v = 0;
    for (; d < q; d++) v = v * 10 + (*d - '0');
    *ok = 1;
    return neg ? -v : v;
}

/* The "args" object at p: its end, and args.correlation when it is an integer. */
static int args_field(const char **pp, const char *end, int64_t *corr) {
    const char *p = *pp;
    p++; /* { */
    p = skip_ws(p, end);
    if (p >= end) return EV_INCOMPLETE;
    if (*p == '}') {
        *pp = p + 1;
        return OK_EVENT;
    }
    for (;;) {
        const char *k, *q;
        Py_ssize_t kn;
        int r = member_key(&p, end, &k, &kn);
        if (r != OK_EVENT) return r;
        if (KEY_IS(k, kn, "correlation") && (*p == '-' || (*p >= '0' && *p <= '9'))) {
            int is_int;
            q = number_end(p, end, &is_int);
            if (q == INCOMPLETE) return EV_INCOMPLETE;
            if (q == BROKEN) return EV_BROKEN;
            if (is_int) {
                int ok;
                int64_t v = small_int(p, q, &ok);
                if (!ok) return EV_ODD; /* too large for the column */
                if (*p == '-' && v == 0) return EV_ODD;
                *corr = v;
            } else {
                *corr = -1;
            }
        } else {
            q = skip_value(p, end);
            if (q == INCOMPLETE) return EV_INCOMPLETE;
            if (q == BROKEN) return EV_BROKEN;
            if (KEY_IS(k, kn, "correlation")) *corr = -1;
        }
        p = skip_ws(q, end);
        if (p >= end) return EV_INCOMPLETE;
        if (*p == '}') {
            *pp = p + 1;
            return OK_EVENT;
        }
        if (*p != ',') return EV_BROKEN;
        p = skip_ws(p + 1, end);
    }
}

/* One event object at p into row i; *pp set to its end. */
static int scan_event(const char **pp, const char *end, const char *base, Columns *c,
                      Py_ssize_t i) {
    const char *p = *pp;
    uint8_t ph = 0;
    int32_t name = -1, cat = -1, tid = -1;
    double ts = NAN, dur = NAN;
    int64_t corr = -1, lo = -1, hi = -1;
    p = skip_ws(p + 1, end);
    if (p >= end) return EV_INCOMPLETE;
    if (*p == '}') {
        p++;
        goto done;
    }
    for (;;) {
        const char *k, *q;
        Py_ssize_t kn;
        int r = member_key(&p, end, &k, &kn);
        if (r != OK_EVENT) return r;
        r = OK_EVENT;
        if (KEY_IS(k, kn, "ph")) {
            if (*p == '"') {
                int esc = 0;
                q = skip_string(p, end, &esc);
                if (q == INCOMPLETE) return EV_INCOMPLETE;
                if (esc) return EV_ODD;
                ph = (q - p == 3 && p[1] == 'X');
                p = q;
            } else if (*p == 'n') {
                q = literal_end(p, end, "null");
                if (q == INCOMPLETE) return EV_INCOMPLETE;
                if (q == BROKEN) return EV_BROKEN;
                ph = 0;
                p = q;
            } else {
                return EV_ODD;
            }
        } else if (KEY_IS(k, kn, "name")) {
            r = string_field(&p, end, c->names, "", &name);
        } else if (KEY_IS(k, kn, "cat")) {
            r = string_field(&p, end, c->cats, "", &cat);
        } else if (KEY_IS(k, kn, "tid")) {
            if (*p == '-' || (*p >= '0' && *p <= '9')) {
                int is_int;
                q = number_end(p, end, &is_int);
                if (q == INCOMPLETE) return EV_INCOMPLETE;
                if (q == BROKEN) return EV_BROKEN;
                if (!is_int) return EV_ODD;
                /* an integer's text, as str() writes it: no "-0" */
                if (*p == '-' && q - p == 2 && p[1] == '0') return EV_ODD;
                tid = intern(c->tids, p, q - p);
                if (tid < 0) return EV_FAILED;
                p = q;
            } else {
                r = string_field(&p, end, c->tids, "None", &tid);
            }
        } else if (KEY_IS(k, kn, "ts")) {
            r = number_field(&p, end, &ts);
        } else if (KEY_IS(k, kn, "dur")) {
            r = number_field(&p, end, &dur);
        } else if (KEY_IS(k, kn, "args")) {
            if (*p == '{') {
                lo = p - base;
                corr = -1;
                r = args_field(&p, end, &corr);
                hi = p - base;
            } else if (*p == 'n') {
                q = literal_end(p, end, "null");
                if (q == INCOMPLETE) return EV_INCOMPLETE;
                if (q == BROKEN) return EV_BROKEN;
                lo = hi = -1;
                corr = -1;
                p = q;
            } else {
                return EV_ODD;
            }
        } else {
            q = skip_value(p, end);
            if (q == INCOMPLETE) return EV_INCOMPLETE;
            if (q == BROKEN) return EV_BROKEN;
            p = q;
        }
        if (r != OK_EVENT) return r;
        p = skip_ws(p, end);
        if (p >= end) return EV_INCOMPLETE;
        if (*p == '}') {
            p++;
            break;
        }
        if (*p != ',') return EV_BROKEN;
        p = skip_ws(p + 1, end);
    }
done:
    if (name < 0 && (name = intern(c->names, "", 0)) < 0) return EV_FAILED;
    if (cat < 0 && (cat = intern(c->cats, "", 0)) < 0) return EV_FAILED;
    if (tid < 0 && (tid = intern(c->tids, "None", 4)) < 0) return EV_FAILED;
    c->ph[i] = ph;
    c->name[i] = name;
    c->cat[i] = cat;
    c->tid[i] = tid;
    c->ts[i] = ts;
    c->dur[i] = dur;
    c->corr[i] = corr;
    c->args_lo[i] = lo;
    c->args_hi[i] = hi;
    *pp = p;
    return OK_EVENT;
}

static int get_column(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t *rows) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    Py_ssize_t n = view->len / itemsize;
    if (n < *rows) *rows = n;
    return 0;
}

PyDoc_STRVAR(scan_doc,
"scan(buf, pos, names, cats, tids, ph, name, cat, tid, ts, dur, corr, args_lo, args_hi)\n"
"    -> (rows, pos, status)\n\n"
"Scan the events of a trace's event array in buf from pos (at an element, a comma or the\n"
"array's closing bracket) into the columns (uint8, int32 x3, float64 x2, int64 x3), at most\n"
"as many as the shortest column holds. status: NEED_MORE (pos: where an event that buf cuts\n"
"short starts), END (pos: after the closing bracket), FULL, ODD (pos: an event to decode the\n"
"slow way), ERROR (pos: where the text is not JSON).");

static PyObject *scan(PyObject *module, PyObject *args) {
    PyObject *buf_obj, *names, *cats, *tids, *cols[9];
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "OnOOOOOOOOOOOO:scan", &buf_obj, &pos, &names, &cats, &tids,
                          &cols[0], &cols[1], &cols[2], &cols[3], &cols[4], &cols[5], &cols[6],
                          &cols[7], &cols[8]))
        return NULL;
    if (check_interner(names) < 0 || check_interner(cats) < 0 || check_interner(tids) < 0)
        return NULL;
    static const Py_ssize_t sizes[9] = {1, 4, 4, 4, 8, 8, 8, 8, 8};
    Py_buffer text, views[9];
    int got = 0;
    if (PyObject_GetBuffer(buf_obj, &text, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t rows = PY_SSIZE_T_MAX;
    for (; got < 9; got++) {
        if (get_column(cols[got], &views[got], sizes[got], &rows) < 0) goto fail;
    }
    if (pos < 0 || pos > text.len) {
        PyErr_SetString(PyExc_ValueError, "pos outside the buffer");
        goto fail;
    }
    Columns c = {views[0].buf, views[1].buf, views[2].buf, views[3].buf, views[4].buf,
                 views[5].buf, views[6].buf, views[7].buf, views[8].buf,
                 (Interner *)names, (Interner *)cats, (Interner *)tids};
    const char *base = text.buf, *end = base + text.len, *p = base + pos;
    Py_ssize_t n = 0;
    int status = NEED_MORE, failed = 0;
    check_locale();
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t' || *p == ','))
            p++;
        if (p >= end) {
            status = NEED_MORE;
            break;
        }
        if (*p == ']') {
            p++;
            status = END;
            break;
        }
        if (*p != '{') {
            status = ODD; /* not an object: the slow way skips it */
            break;
        }
        if (n >= rows) {
            status = FULL;
            break;
        }
        const char *q = p;
        int r = scan_event(&q, end, base, &c, n);
        if (r == OK_EVENT) {
            n++;
            p = q;
            continue;
        }
        failed = r == EV_FAILED;
        status = r == EV_INCOMPLETE ? NEED_MORE : r == EV_ODD ? ODD : ERROR;
        break;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto fail;
    }
    PyBuffer_Release(&text);
    for (int i = 0; i < 9; i++) PyBuffer_Release(&views[i]);
    return Py_BuildValue("nni", n, (Py_ssize_t)(p - base), status);
fail:
    PyBuffer_Release(&text);
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    return NULL;
}

PyDoc_STRVAR(value_end_doc,
"value_end(buf, pos) -> int\n\n"
"Where the JSON value at pos (whitespace before it skipped) ends in buf: -1 when buf ends\n"
"first, -2 when it is not JSON.");

static PyObject *value_end(PyObject *module, PyObject *args) {
    PyObject *buf_obj;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "On:value_end", &buf_obj, &pos)) return NULL;
    Py_buffer text;
    if (PyObject_GetBuffer(buf_obj, &text, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t result;
    if (pos < 0 || pos > text.len) {
        result = -2;
    } else {
        const char *base = text.buf;
        const char *q = skip_value(base + pos, base + text.len);
        result = q == INCOMPLETE ? -1 : q == BROKEN ? -2 : (Py_ssize_t)(q - base);
    }
    PyBuffer_Release(&text);
    return PyLong_FromSsize_t(result);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, scan_doc},
    {"value_end", value_end, METH_VARARGS, value_end_doc},
    {"args_numbers", args_numbers, METH_VARARGS, args_numbers_doc},
    {"args_ids", args_ids, METH_VARARGS, args_ids_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_scan",
    "Kineto trace events scanned into typed columns (see doctor.trace.scan).", -1, methods,
};

PyMODINIT_FUNC PyInit__scan(void) {
    if (PyType_Ready(&InternerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    Py_INCREF(&InternerType);
    if (PyModule_AddObject(m, "Interner", (PyObject *)&InternerType) < 0) {
        Py_DECREF(&InternerType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "NEED_MORE", NEED_MORE) < 0 ||
        PyModule_AddIntConstant(m, "END", END) < 0 ||
        PyModule_AddIntConstant(m, "FULL", FULL) < 0 ||
        PyModule_AddIntConstant(m, "ODD", ODD) < 0 ||
        PyModule_AddIntConstant(m, "ERROR", ERROR) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
