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

/* -- the scanner ------------------------------------------------------------------------ */

typedef struct {
    const char *buf;
    const char *end;
} Text;

/* Results of the value readers below: the end of the value, or one of these. */
#define INCOMPLETE ((const char *)0)
#define BROKEN ((const char *)1)
#define IS_BAD(p) ((uintptr_t)(p) <= 1)

static inline const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* p at the opening quote: the end of the string (after its closing quote); *escaped set when
 * it holds a backslash. */
static inline const char *skip_string(const char *p, const char *end, int *escaped) {
    p++;
    for (;;) {
        const char *q = p;
        while (q < end && *q != '"' && *q != '\\') q++;
        if (q >= end) return INCOMPLETE;
        if (*q == '"') return q + 1;
        if (escaped) *escaped = 1;
        p = q + 2;
        if (p > end) return INCOMPLETE;
    }
}

static inline int is_num_char(char c) {
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* A JSON number at p: its end; *is_int set when it has no fraction or exponent. */
static const char *number_end(const char *p, const char *end, int *is_int) {
    const char *q = p;
    if (q < end && *q == '-') q++;
    if (q >= end) return INCOMPLETE;
    if (*q < '0' || *q > '9') return BROKEN;
    while (q < end && *q >= '0' && *q <= '9') q++;
    int integer = 1;
    if (q < end && *q == '.') {
        integer = 0;
        q++;
        if (q < end && (*q < '0' || *q > '9')) return BROKEN;
        while (q < end && *q >= '0' && *q <= '9') q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        integer = 0;
        q++;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (q < end && (*q < '0' || *q > '9')) return BROKEN;
        while (q < end && *q >= '0' && *q <= '9') q++;
    }
    if (q >= end) return INCOMPLETE; /* it may go on in the next bytes */
    if (is_num_char(*q)) return BROKEN;
    *is_int = integer;
    return q;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                               1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                               1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* Whether the C library reads "." as the decimal point (checked before each scan). */
static int dot_locale = 1;

static void check_locale(void) {
    const char *point = localeconv()->decimal_point;
    dot_locale = point && point[0] == '.' && point[1] == 0;
}

/* The value of the number p[0:n] (valid JSON), rounded as Python's float() rounds it; *slow
 * set (and nan) when it is for the slow way to read (too long, or an unusual locale). */
static double number_value(const char *p, Py_ssize_t n, int *slow) {
    const char *q = p, *end = p + n;
    int neg = 0;
    if (*q == '-') {
        neg = 1;
        q++;
    }
    uint64_t mant = 0;
    int digits = 0, scale = 0;
    while (q < end && *q >= '0' && *q <= '9') {
        if (digits < 19) {
            mant = mant * 10 + (uint64_t)(*q - '0');
            if (mant) digits++;
        } else {
            digits = 99;
        }
        q++;
    }
    if (q < end && *q == '.') {
        q++;
        while (q < end && *q >= '0' && *q <= '9') {
            if (digits < 19) {
                mant = mant * 10 + (uint64_t)(*q - '0');
                if (mant) digits++;
                scale--;
            } else {
                digits = 99;
            }
            q++;
        }
    }
    if (q == end && digits <= 19 && mant <= (1ULL << 53) && scale >= -22) {
        /* Clinger's fast path: both exact, so one rounding, the correct one */
        double v = scale ? (double)mant / POW10[-scale] : (double)mant;
        return neg ? -v : v;
    }
    /* glibc's strtod rounds correctly; it reads the locale's decimal point, which scan()
     * checks is "." before it starts */
    char local[128];
    if (n >= (Py_ssize_t)sizeof(local) || !dot_locale) {
        *slow = 1;
        return NAN;
    }
    memcpy(local, p, (size_t)n);
    local[n] = 0;
    return strtod(local, NULL);
}

static inline const char *literal_end(const char *p, const char *end, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(end - p) < n) {
        return memcmp(p, word, (size_t)(end - p)) == 0 ? INCOMPLETE : BROKEN;
    }
    return memcmp(p, word, n) == 0 ? p + n : BROKEN;
}

/* Any JSON value at p (whitespace skipped before it): its end. Nested values are only
 * checked for balanced brackets and whole strings. */
static const char *skip_value(const char *p, const char *end) {
    p = skip_ws(p, end);
    if (p >= end) return INCOMPLETE;
    char c = *p;
    if (c == '"') return skip_string(p, end, NULL);
    if (c == '{' || c == '[') {
        int depth = 0;
        while (p < end) {
            c = *p;
            if (c == '"') {
                p = skip_string(p, end, NULL);
                if (IS_BAD(p)) return p;
                continue;
            }
            if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (--depth == 0) return p + 1;
            }
            p++;
        }
        return INCOMPLETE;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        int is_int;
        return number_end(p, end, &is_int);
    }
    if (c == 't') return literal_end(p, end, "true");
    if (c == 'f') return literal_end(p, end, "false");
    if (c == 'n') return literal_end(p, end, "null");
    return BROKEN;
}

typedef struct {
    uint8_t *ph;
    int32_t *name, *cat, *tid;
    double *ts, *dur;
    int64_t *corr, *args_lo, *args_hi;
    Interner *names, *cats, *tids;
} Columns;

enum { OK_EVENT = 0, EV_INCOMPLETE = 1, EV_ODD = 2, EV_BROKEN = 3, EV_FAILED = 4 };

#define KEY_IS(k, n, lit) ((n) == (Py_ssize_t)sizeof(lit) - 1 && memcmp((k), (lit), (n)) == 0)

/* The key of an object's member at *pp (a string, then a colon): *k and *kn say where its
 * text lies; *pp is set to the member's value. */
static int member_key(const char **pp, const char *end, const char **k, Py_ssize_t *kn) {
    const char *p = *pp;
    if (p >= end) return EV_INCOMPLETE;
    if (*p != '"') return EV_BROKEN;
    int escaped = 0;
    const char *q = skip_string(p, end, &escaped);
    if (q == INCOMPLETE) return EV_INCOMPLETE;
    *k = p + 1;
    *kn = q - p - 2;
    p = skip_ws(q, end);
    if (p >= end) return EV_INCOMPLETE;
    if (*p != ':') return EV_BROKEN;
    p = skip_ws(p + 1, end);
    if (p >= end) return EV_INCOMPLETE;
    if (escaped) return EV_ODD; /* a key written with escapes: the slow way reads it */
    *pp = p;
    return OK_EVENT;
}

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

static int check_interner(PyObject *obj) {
    if (!PyObject_TypeCheck(obj, &InternerType)) {
        PyErr_SetString(PyExc_TypeError, "expected an Interner");
        return -1;
    }
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

static int query_open(PyObject *args, ArgsQuery *q, PyObject **extra, PyObject **extra2) {
    PyObject *buf, *lo, *hi;
    if (!PyArg_ParseTuple(args, "OOOO!|OO", &buf, &lo, &hi, &PyTuple_Type, &q->keys, extra,
                          extra2))
        return -1;
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

PyDoc_STRVAR(args_numbers_doc,
"args_numbers(buf, lo, hi, keys, out) -> bool\n\n"
"For each row i, the values of the args members named by keys (a tuple of bytes) of the\n"
"args object at buf[lo[i]:hi[i]] (lo -1: none) into out[i, k] (float64, rows x keys): a number\n"
"as Python's float() reads it, nan for anything else. False (out unfinished) when a value is\n"
"a string: its number is for the slow way to read.");

static PyObject *args_numbers(PyObject *module, PyObject *args) {
    ArgsQuery q;
    PyObject *out_obj = NULL, *unused = NULL;
    if (query_open(args, &q, &out_obj, &unused) < 0) return NULL;
    Py_buffer out;
    if (!out_obj || PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        if (!out_obj) PyErr_SetString(PyExc_TypeError, "args_numbers needs out");
        query_close(&q);
        return NULL;
    }
    if (out.len < (Py_ssize_t)(q.rows * q.nkeys * 8)) {
        PyErr_SetString(PyExc_ValueError, "out is too small");
        PyBuffer_Release(&out);
        query_close(&q);
        return NULL;
    }
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
"For each row i, the id in interner (an Interner) of the text of the values of the args\n"
"members named by keys (a tuple of bytes) of the args object at buf[lo[i]:hi[i]] (lo -1:\n"
"none), into out (int32): equal texts are equal values, so the id is a key to cache what is\n"
"made of them.");

static PyObject *args_ids(PyObject *module, PyObject *args) {
    ArgsQuery q;
    PyObject *table = NULL, *out_obj = NULL;
    if (query_open(args, &q, &table, &out_obj) < 0) return NULL;
    Py_buffer out;
    if (!table || !out_obj || check_interner(table) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "args_ids needs interner, out");
        query_close(&q);
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        query_close(&q);
        return NULL;
    }
    if (out.len < (Py_ssize_t)(q.rows * 4)) {
        PyErr_SetString(PyExc_ValueError, "out is too small");
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
