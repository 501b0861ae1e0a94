/* The trace scanner's JSON: skipping and reading one value at a time, in bytes that may end
 * inside it (INCOMPLETE: read on) or that are not JSON (BROKEN). Included by _scan.c, its one
 * translation unit. */
#ifndef DOCTOR_SCAN_JSON_H
#define DOCTOR_SCAN_JSON_H

/* -- JSON, a value at a time ----------------------------------------------------------- */

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

#endif
