/* The trace scanner's tables of strings (included by _scan.c, its one translation unit). */
#ifndef DOCTOR_SCAN_INTERNER_H
#define DOCTOR_SCAN_INTERNER_H

/* -- Interner: raw strings to ids, in order of first sight ------------------------------- */

/* The keys live in an arena of C memory, so that scan() can intern without the interpreter
 * (it runs with the GIL released); `keys` makes their bytes objects when asked. One thread
 * scans with an interner at a time; the lock keeps the arena still while `keys` reads it. */
typedef struct {
    PyObject_HEAD
    uint64_t *hashes;
    int32_t *ids; /* -1: empty slot */
    Py_ssize_t cap;   /* a power of two */
    char *arena;
    Py_ssize_t arena_len, arena_cap;
    Py_ssize_t *starts; /* key i is arena[starts[i]:starts[i + 1]] */
    Py_ssize_t count, starts_cap;
    PyThread_type_lock lock;
    PyObject *keys;   /* list of bytes: the keys made so far */
} Interner;

static uint64_t hash_bytes(const char *s, Py_ssize_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, (size_t)n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    h ^= h >> 29;
    return h;
}

static int interner_grow(Interner *self) {
    Py_ssize_t cap = self->cap * 2;
    uint64_t *hashes = malloc((size_t)cap * sizeof(uint64_t));
    int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
    if (!hashes || !ids) {
        free(hashes);
        free(ids);
        return -1;
    }
    for (Py_ssize_t i = 0; i < cap; i++) ids[i] = -1;
    for (Py_ssize_t i = 0; i < self->cap; i++) {
        if (self->ids[i] < 0) continue;
        Py_ssize_t at = (Py_ssize_t)(self->hashes[i] & (uint64_t)(cap - 1));
        while (ids[at] >= 0) at = (at + 1) & (cap - 1);
        ids[at] = self->ids[i];
        hashes[at] = self->hashes[i];
    }
    free(self->hashes);
    free(self->ids);
    self->hashes = hashes;
    self->ids = ids;
    self->cap = cap;
    return 0;
}

/* Append s[0:n] to the arena as key number count (under the lock: `keys` may be reading). */
static int interner_store(Interner *self, const char *s, Py_ssize_t n) {
    int ok = 0;
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    if (self->count + 2 > self->starts_cap) {
        Py_ssize_t cap = self->starts_cap * 2;
        Py_ssize_t *starts = realloc(self->starts, (size_t)cap * sizeof(Py_ssize_t));
        if (!starts) ok = -1;
        else {
            self->starts = starts;
            self->starts_cap = cap;
        }
    }
    if (ok == 0 && self->arena_len + n > self->arena_cap) {
        Py_ssize_t cap = self->arena_cap * 2;
        while (cap < self->arena_len + n) cap *= 2;
        char *arena = realloc(self->arena, (size_t)cap);
        if (!arena) ok = -1;
        else {
            self->arena = arena;
            self->arena_cap = cap;
        }
    }
    if (ok == 0) {
        memcpy(self->arena + self->arena_len, s, (size_t)n);
        self->arena_len += n;
        self->count++;
        self->starts[self->count] = self->arena_len;
    }
    PyThread_release_lock(self->lock);
    return ok;
}

/* The id of s[0:n]; a new one when not seen before; -1 when out of memory. Needs no GIL. */
static int32_t intern(Interner *self, const char *s, Py_ssize_t n) {
    uint64_t h = hash_bytes(s, n);
    Py_ssize_t mask = self->cap - 1;
    Py_ssize_t at = (Py_ssize_t)(h & (uint64_t)mask);
    for (;;) {
        int32_t id = self->ids[at];
        if (id < 0) break;
        if (self->hashes[at] == h) {
            Py_ssize_t lo = self->starts[id], len = self->starts[id + 1] - lo;
            if (len == n && memcmp(self->arena + lo, s, (size_t)n) == 0) return id;
        }
        at = (at + 1) & mask;
    }
    if (self->count >= INT32_MAX - 1) return -1;
    int32_t id = (int32_t)self->count;
    if (interner_store(self, s, n) < 0) return -1;
    self->ids[at] = id;
    self->hashes[at] = h;
    if ((self->count + 1) * 2 > self->cap && interner_grow(self) < 0) return -1;
    return id;
}

static PyObject *interner_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (!PyArg_ParseTuple(args, ":Interner")) return NULL;
    Interner *self = (Interner *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->cap = 1024;
    self->hashes = malloc((size_t)self->cap * sizeof(uint64_t));
    self->ids = malloc((size_t)self->cap * sizeof(int32_t));
    self->arena_cap = 1 << 16;
    self->arena = malloc((size_t)self->arena_cap);
    self->starts_cap = 1024;
    self->starts = malloc((size_t)self->starts_cap * sizeof(Py_ssize_t));
    self->lock = PyThread_allocate_lock();
    self->keys = PyList_New(0);
    if (!self->hashes || !self->ids || !self->arena || !self->starts || !self->lock ||
        !self->keys) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->starts[0] = 0;
    for (Py_ssize_t i = 0; i < self->cap; i++) self->ids[i] = -1;
    return (PyObject *)self;
}

static void interner_dealloc(Interner *self) {
    free(self->hashes);
    free(self->ids);
    free(self->arena);
    free(self->starts);
    if (self->lock) PyThread_free_lock(self->lock);
    Py_XDECREF(self->keys);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *interner_keys(Interner *self, void *closure) {
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    Py_END_ALLOW_THREADS
    for (Py_ssize_t i = PyList_GET_SIZE(self->keys); i < self->count && !failed; i++) {
        PyObject *key = PyBytes_FromStringAndSize(self->arena + self->starts[i],
                                                  self->starts[i + 1] - self->starts[i]);
        failed = !key || PyList_Append(self->keys, key) < 0;
        Py_XDECREF(key);
    }
    PyThread_release_lock(self->lock);
    if (failed) return NULL;
    Py_INCREF(self->keys);
    return self->keys;
}

static PyGetSetDef interner_getset[] = {
    {"keys", (getter)interner_keys, NULL, "the raw bytes of each id, in order", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject InternerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "doctor.trace._scan.Interner",
    .tp_basicsize = sizeof(Interner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Raw strings to ids, in order of first sight (keys: the bytes of each id).",
    .tp_new = interner_new,
    .tp_dealloc = (destructor)interner_dealloc,
    .tp_getset = interner_getset,
};

static int check_interner(PyObject *obj) {
    if (!PyObject_TypeCheck(obj, &InternerType)) {
        PyErr_SetString(PyExc_TypeError, "expected an Interner");
        return -1;
    }
    return 0;
}

#endif
