/* How the host ops of a trace nest, at C speed (doctor.trace.ops; its Python loops do the same
 * where this is not built). Each thread's ops are a stack: one pass over the ops (and the
 * runtime calls) in order of start, a linked list through the ops standing for each thread's
 * stack, so no Python object is made per op.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    Py_buffer view;
    Py_ssize_t n;
} Column;

static int column(PyObject *obj, Column *c, Py_ssize_t itemsize, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &c->view, flags) < 0) return -1;
    c->n = c->view.len / itemsize;
    return 0;
}

/* The largest thread code of tid[0:n] (-1 when one is negative). */
static int32_t top_tid(const int32_t *tid, Py_ssize_t n) {
    int32_t top = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (tid[i] < 0) return -1;
        if (tid[i] > top) top = tid[i];
    }
    return top;
}

/* Each thread's stack, empty: head (top + 1 entries, all -1, the op on top of each thread's
 * stack) and below (n + 1, the op under each op). -1 with MemoryError set when out of memory. */
static int empty_stacks(int32_t top, Py_ssize_t n, Py_ssize_t **head, Py_ssize_t **below) {
    *head = malloc(((size_t)top + 1) * sizeof(Py_ssize_t));
    *below = malloc(((size_t)n + 1) * sizeof(Py_ssize_t));
    if (!*head || !*below) {
        free(*head);
        free(*below);
        PyErr_NoMemory();
        return -1;
    }
    for (int32_t k = 0; k <= top; k++) (*head)[k] = -1;
    return 0;
}

PyDoc_STRVAR(self_times_doc,
"self_times(start, end, tid, own) -> bool\n\n"
"For ops sorted by start (float64 start and end, int32 thread codes), subtract from own\n"
"(float64, each op's duration) the duration of each op's direct children on its thread.\n"
"False (own untouched) when a thread code is negative.");

static PyObject *self_times(PyObject *module, PyObject *args) {
    PyObject *o_start, *o_end, *o_tid, *o_own;
    if (!PyArg_ParseTuple(args, "OOOO:self_times", &o_start, &o_end, &o_tid, &o_own)) return NULL;
    Column start, end, tid, own;
    int got = 0, ok = 1;
    PyObject *result = NULL;
    if (column(o_start, &start, 8, 0) < 0) goto done;
    got++;
    if (column(o_end, &end, 8, 0) < 0) goto done;
    got++;
    if (column(o_tid, &tid, 4, 0) < 0) goto done;
    got++;
    if (column(o_own, &own, 8, 1) < 0) goto done;
    got++;
    Py_ssize_t n = start.n;
    if (end.n != n || tid.n != n || own.n != n) {
        PyErr_SetString(PyExc_ValueError, "columns of different lengths");
        goto done;
    }
    const double *s = start.view.buf, *e = end.view.buf;
    const int32_t *t = tid.view.buf;
    double *mine = own.view.buf;
    int32_t top = top_tid(t, n);
    if (top < 0) {
        ok = 0;
    } else {
        Py_ssize_t *head, *below;
        if (empty_stacks(top, n, &head, &below) < 0) goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_ssize_t h = head[t[i]];
            while (h >= 0 && e[h] <= s[i]) h = below[h];
            if (h >= 0) mine[h] -= e[i] - s[i];
            below[i] = h;
            head[t[i]] = i;
        }
        free(head);
        free(below);
    }
    result = PyBool_FromLong(ok);
done:
    if (got > 0) PyBuffer_Release(&start.view);
    if (got > 1) PyBuffer_Release(&end.view);
    if (got > 2) PyBuffer_Release(&tid.view);
    if (got > 3) PyBuffer_Release(&own.view);
    return result;
}

PyDoc_STRVAR(launching_ops_doc,
"launching_ops(h_start, h_end, h_tid, r_start, r_tid, out) -> bool\n\n"
"For each runtime call (sorted by start), the index of the innermost host op (sorted by start)\n"
"on its thread that contains it, into out (int64, -1: none). False (out untouched) when a\n"
"thread code is negative.");

static PyObject *launching_ops(PyObject *module, PyObject *args) {
    PyObject *objs[6];
    if (!PyArg_ParseTuple(args, "OOOOOO:launching_ops", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5]))
        return NULL;
    static const Py_ssize_t sizes[6] = {8, 8, 4, 8, 4, 8};
    Column c[6];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 6; got++) {
        if (column(objs[got], &c[got], sizes[got], got == 5) < 0) goto done;
    }
    Py_ssize_t nh = c[0].n, nr = c[3].n;
    if (c[1].n != nh || c[2].n != nh || c[4].n != nr || c[5].n != nr) {
        PyErr_SetString(PyExc_ValueError, "columns of different lengths");
        goto done;
    }
    const double *hs = c[0].view.buf, *he = c[1].view.buf, *rs = c[3].view.buf;
    const int32_t *ht = c[2].view.buf, *rt = c[4].view.buf;
    int64_t *out = c[5].view.buf;
    int32_t top_h = top_tid(ht, nh), top_r = top_tid(rt, nr);
    if (top_h < 0 || top_r < 0) {
        result = PyBool_FromLong(0);
        goto done;
    }
    int32_t top = top_h > top_r ? top_h : top_r;
    Py_ssize_t *head, *below;
    if (empty_stacks(top, nh, &head, &below) < 0) goto done;
    /* one merge of both in order of start, a host op before a call that starts with it: the
     * same pushes and pops, thread by thread, as a walk over each thread's calls */
    Py_ssize_t k = 0;
    for (Py_ssize_t j = 0; j < nr; j++) {
        double at = rs[j];
        while (k < nh && hs[k] <= at) {
            Py_ssize_t h = head[ht[k]];
            while (h >= 0 && he[h] <= hs[k]) h = below[h];
            below[k] = h;
            head[ht[k]] = k;
            k++;
        }
        Py_ssize_t h = head[rt[j]];
        while (h >= 0 && he[h] < at) h = below[h];
        head[rt[j]] = h;
        out[j] = h;
    }
    free(head);
    free(below);
    result = PyBool_FromLong(1);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&c[i].view);
    return result;
}

static PyMethodDef methods[] = {
    {"self_times", self_times, METH_VARARGS, self_times_doc},
    {"launching_ops", launching_ops, METH_VARARGS, launching_ops_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_nest", "How the host ops of a trace nest (see doctor.trace.ops).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__nest(void) { return PyModule_Create(&module_def); }
