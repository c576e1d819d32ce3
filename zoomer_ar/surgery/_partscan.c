/* Zoomer AR: a compiled scanner of a trace's `traceEvents` array for `partition_trace`
 * (zoomer_ar/surgery/partition_fast.py): per event, where its JSON lies in the buffer (to copy it
 * verbatim) and the few fields the partition decides on, with no Python object per event.
 *
 * It reads only the subset of JSON whose meaning is plain: whenever an event holds something the
 * surgery readers (msgspec, zoomer_ar/surgery/slices.py) might read otherwise (a value of an
 * unusual type, a duplicate or escaped key, an explicit null in a typed field, an integer outside
 * int64, invalid JSON or UTF-8 ...) it raises `Unsupported` and the caller cuts the trace with
 * the original code, which then says what it says of it.
 *
 * The JSON helpers (strings, numbers, skipping) are zoomer_ar/load/_jsonlex.h, shared with the
 * compiled event reader (zoomer_ar/load/_fastjson.c).
 *
 * Protocol:
 *   s = Scanner(cats)          # cats: a list; each new `cat` string's raw JSON token (with its
 *                              # quotes) is appended, its index is the code
 *   pos, ended, cols = s.feed(buf, start, final)   # whole events of buf[start:]
 *   cols: (n, start, end, ph, flags, ts, dur, cat, corr, fid, step) with start/end int64 offsets
 *         in buf, the others as bytes of fixed-size values (see COLUMNS in partition_fast.py)
 *   s.reset()                  # a new array (same cat codes)
 *   gather(buf, start, end, win, k) -> list of k bytes: the events of each window joined by `,`
 *         (win[i] = j: window j; -1: none; -2: every window)
 *   compact(data, sep, n) -> data with each `sep` (`}` gap `{`) made `},{`; None where sep does
 *         not occur exactly n times
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../load/_jsonlex.h"

/* ------------------------------------------------------------------------------------------ */
/* the partition's columns of each event */

enum { PH_OTHER = 0, PH_NONE = 1, PH_META = 2, PH_X = 3, PH_FLOW = 4, PH_TIMED = 5 };  /* slices._PH_CODE */
enum { F_PID = 1, F_TID = 2, F_NAME = 4, F_ID = 8 };  /* present (an id: present and not null) */
enum { S_START, S_END, S_PH, S_FLAGS, S_TS, S_DUR, S_CAT, S_CORR, S_FID, S_STEP, N_SCOLS };
static const size_t SCOL_SIZE[N_SCOLS] = {8, 8, 1, 1, 8, 8, 4, 8, 8, 8};

typedef struct {
    PyObject_HEAD
    PyObject *cats;      /* list: raw JSON token of each cat code */
    Intern cat_tab;      /* raw cat contents -> code */
    char *cols[N_SCOLS];
    size_t n, cap;
    int state;           /* 0: before an event or `]`; 1: after an event; 2: after `,` */
    int ended;
} Scanner;

typedef struct {
    int64_t start, end, corr, fid, step;
    double ts, dur;
    int32_t cat;
    uint8_t ph, flags;
} Ev;

/* A number whose value is needed only where it is an integer (pid, tid, id, the typed `args`):
 * scan_number's answers, without its conversion to a double for a plain integer of at most 18
 * digits (the value is exact then); a fraction, an exponent or a longer integer: scan_number. */
static int quick_number(Cur *c, int *is_int, int64_t *iv, int *big) {
    const char *p = c->p, *end = c->end;
    double dv;
    int neg = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    const char *d0 = p;
    uint64_t m = 0;
    while (p < end && *p >= '0' && *p <= '9' && p - d0 < 19) { m = m * 10 + (uint64_t)(*p - '0'); p++; }
    size_t nd = (size_t)(p - d0);
    if (p >= end && !c->final) return MORE;
    if (nd == 0 || nd > 18 || (nd > 1 && *d0 == '0') || (p < end && (*p == '.' || *p == 'e' || *p == 'E')))
        return number_token(c, is_int, iv, big, &dv);  /* (and its errors) */
    *is_int = 1;
    *big = 0;
    *iv = neg ? -(int64_t)m : (int64_t)m;
    c->p = p;
    return OK;
}

static uint8_t ph_of(const char *s, size_t n) {
    if (n == 0) return PH_NONE;
    if (n > 1) return PH_OTHER;
    switch (s[0]) {
    case 'M': return PH_META;
    case 'X': return PH_X;
    case 's': case 't': case 'f': return PH_FLOW;
    default: return (s[0] && strchr("BEiICbneSTpFONDPR", s[0])) ? PH_TIMED : PH_OTHER;
    }
}

/* ProfilerStep#N -> N; -1: not a step name; -2: the caller decides (escapes, non-ASCII, long) */
static int64_t step_of(const char *s, size_t n, int esc) {
    if (esc) return -2;
    if (n < 13 || memcmp(s, "ProfilerStep#", 13) != 0) return -1;
    if (n == 13) return -1;
    if (n - 13 > 18) return -2;
    int64_t v = 0;
    for (size_t i = 13; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x80) return -2;
        if (ch < '0' || ch > '9') return -1;
        v = v * 10 + (ch - '0');
    }
    return v;
}

static int cat_code(Scanner *S, const char *s, size_t n, int32_t *code) {
    uint64_t h = hash_bytes(s, n);
    Slot *slot = intern_find(&S->cat_tab, s, n, h);
    if (slot->used) { *code = slot->code; return OK; }
    Py_ssize_t k = PyList_GET_SIZE(S->cats);
    if (k >= INT32_MAX) return BAD;
    PyObject *raw = PyBytes_FromStringAndSize(s - 1, (Py_ssize_t)n + 2);
    if (!raw) return ERR;
    int bad = PyList_Append(S->cats, raw) < 0;
    Py_DECREF(raw);
    if (bad) return ERR;
    *code = (int32_t)k;
    if (intern_add(&S->cat_tab, slot, s, n, h, *code) < 0) { PyErr_NoMemory(); return ERR; }
    return OK;
}

/* A value of a typed `args` field (load/schema.py RawArgs): int, float, str or null; `str_only`:
 * str or null. *iv: an int value in int64 that is >= 0, else -1. */
static int typed_arg(Cur *c, int str_only, int64_t *iv) {
    int r;
    *iv = -1;
    if ((r = next_value(c)) != OK) return r;
    char ch = *c->p;
    if (ch == '"') {
        const char *s; size_t n; int esc;
        return scan_string(c, &s, &n, &esc);
    }
    if (ch == 'n') return skip_literal(c, "null", 4);
    if (str_only) return BAD;
    int is_int, big; int64_t v;
    if ((r = quick_number(c, &is_int, &v, &big)) != OK) return r;
    if (big) return BAD;
    if (is_int && v >= 0) *iv = v;
    return OK;
}

enum { AK_ANY, AK_CORR, AK_SCALAR, AK_STR };

static int arg_kind(const char *s, size_t n) {
    switch (n) {
    case 5: if (key_is(s, n, "bytes") || key_is(s, n, "Bytes")) return AK_SCALAR; break;
    case 6: if (key_is(s, n, "stream") || key_is(s, n, "device")) return AK_SCALAR; break;
    case 9: if (key_is(s, n, "Device Id") || key_is(s, n, "Python id")) return AK_SCALAR; break;
    case 10:
        if (key_is(s, n, "Group size")) return AK_SCALAR;
        if (key_is(s, n, "Call stack")) return AK_STR;
        break;
    case 11:
        if (key_is(s, n, "correlation")) return AK_CORR;
        if (key_is(s, n, "External id") || key_is(s, n, "external id")) return AK_SCALAR;
        break;
    case 13: if (key_is(s, n, "In msg nelems")) return AK_SCALAR; break;
    case 14: if (key_is(s, n, "Out msg nelems")) return AK_SCALAR; break;
    case 15:
        if (key_is(s, n, "Total Allocated")) return AK_SCALAR;
        if (key_is(s, n, "Collective name")) return AK_STR;
        break;
    case 16: if (key_is(s, n, "Python parent id")) return AK_SCALAR; break;
    }
    return AK_ANY;
}

static int parse_args(Cur *c, Ev *ev) {
    int r, empty, more = 1, seen_corr = 0;
    if ((r = next_value(c)) != OK) return r;
    if (*c->p != '{') return BAD;  /* RawArgs: an object */
    if ((r = open_object(c, &empty)) != OK || empty) return r;
    while (more) {
        const char *ks; size_t kn;
        if ((r = read_key(c, &ks, &kn)) != OK) return r;
        int kind = arg_kind(ks, kn);
        int64_t iv;
        if (kind == AK_ANY) r = skip_value(c, 1);
        else if (kind == AK_CORR) {
            if (seen_corr) return BAD;
            seen_corr = 1;
            r = typed_arg(c, 0, &iv);
            ev->corr = iv;
        } else r = typed_arg(c, kind == AK_STR, &iv);
        if ((r = member_end(c, r, &more)) != OK) return r;
    }
    return OK;
}

static int string_value(Cur *c, const char **s, size_t *n, int *esc) {
    int r;
    if ((r = next_value(c)) != OK) return r;
    if (*c->p != '"') return BAD;
    return scan_string(c, s, n, esc);
}

static int parse_ev(Scanner *S, Cur *c, Ev *ev) {
    uint32_t seen = 0;
    int r, empty, more = 1;
    if ((r = open_object(c, &empty)) != OK || empty) return r;
    while (more) {
        const char *ks; size_t kn;
        if ((r = read_key(c, &ks, &kn)) != OK) return r;
        int k = event_key(ks, kn, 1);
        if (!first_key(&seen, k)) return BAD;
        const char *s; size_t n; int esc, is_int, big; int64_t iv; double dv;
        switch (k) {
        case K_PH:
            if ((r = string_value(c, &s, &n, &esc)) != OK) return r;
            if (esc) return BAD;
            ev->ph = ph_of(s, n);
            break;
        case K_TS:
        case K_DUR:
            if ((r = next_value(c)) != OK) return r;
            if ((r = number_token(c, &is_int, &iv, &big, &dv)) != OK) return r;
            if (big) return BAD;
            if (k == K_TS) ev->ts = dv; else ev->dur = dv;
            break;
        case K_CAT:
            if ((r = string_value(c, &s, &n, &esc)) != OK) return r;
            if ((r = cat_code(S, s, n, &ev->cat)) != OK) return r;
            break;
        case K_PID:
        case K_TID:
            if ((r = next_value(c)) != OK) return r;
            if (*c->p == '"') r = scan_string(c, &s, &n, &esc);
            else {
                if ((r = quick_number(c, &is_int, &iv, &big)) != OK) return r;
                if (!is_int || big) return BAD;
            }
            if (r != OK) return r;
            ev->flags |= k == K_PID ? F_PID : F_TID;
            break;
        case K_NAME:
            if ((r = string_value(c, &s, &n, &esc)) != OK) return r;
            ev->flags |= F_NAME;
            ev->step = step_of(s, n, esc);
            break;
        case K_ID:
            if ((r = next_value(c)) != OK) return r;
            if (*c->p == 'n') {
                if ((r = skip_literal(c, "null", 4)) != OK) return r;
                break;
            }
            ev->flags |= F_ID;
            if (*c->p == '-' || (*c->p >= '0' && *c->p <= '9')) {
                if ((r = quick_number(c, &is_int, &iv, &big)) != OK) return r;
                if (is_int && !big && iv >= 0) ev->fid = iv;
            } else if ((r = skip_value(c, 1)) != OK) return r;
            break;
        case K_ARGS:
            r = parse_args(c, ev);
            break;
        default:
            r = skip_value(c, 0);
            break;
        }
        if ((r = member_end(c, r, &more)) != OK) return r;
    }
    return OK;
}

static int append(Scanner *S, Ev *ev) {
    if (S->n == S->cap && grow_columns(S->cols, SCOL_SIZE, N_SCOLS, &S->cap, 8192) != OK) {
        PyErr_NoMemory();
        return ERR;
    }
    size_t i = S->n++;
    ((int64_t *)S->cols[S_START])[i] = ev->start;
    ((int64_t *)S->cols[S_END])[i] = ev->end;
    ((uint8_t *)S->cols[S_PH])[i] = ev->ph;
    ((uint8_t *)S->cols[S_FLAGS])[i] = ev->flags;
    ((double *)S->cols[S_TS])[i] = ev->ts;
    ((double *)S->cols[S_DUR])[i] = ev->dur;
    ((int32_t *)S->cols[S_CAT])[i] = ev->cat;
    ((int64_t *)S->cols[S_CORR])[i] = ev->corr;
    ((int64_t *)S->cols[S_FID])[i] = ev->fid;
    ((int64_t *)S->cols[S_STEP])[i] = ev->step;
    return OK;
}

static int Scanner_init(Scanner *S, PyObject *args, PyObject *kw) {
    PyObject *cats;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &cats)) return -1;
    Py_INCREF(cats);
    Py_XSETREF(S->cats, cats);
    intern_free(&S->cat_tab);
    if (intern_init(&S->cat_tab) < 0) { PyErr_NoMemory(); return -1; }
    S->n = 0;
    S->state = 0;
    S->ended = 0;
    return 0;
}

static void Scanner_dealloc(Scanner *S) {
    Py_XDECREF(S->cats);
    intern_free(&S->cat_tab);
    for (int i = 0; i < N_SCOLS; i++) PyMem_RawFree(S->cols[i]);
    Py_TYPE(S)->tp_free((PyObject *)S);
}

static PyObject *Scanner_reset(Scanner *S, PyObject *unused) {
    S->n = 0;
    S->state = 0;
    S->ended = 0;
    Py_RETURN_NONE;
}

/* feed(buf, start, final) -> (pos, ended, columns) */
static PyObject *Scanner_feed(Scanner *S, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start;
    int final;
    if (!PyArg_ParseTuple(args, "y*np", &view, &start, &final)) return NULL;
    if (start < 0 || start > view.len || S->ended) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, S->ended ? "the events array has ended" : "start outside the buffer");
        return NULL;
    }
    const char *base = (const char *)view.buf;
    Cur c = {base + start, base + view.len, final};
    const char *done = c.p;
    int r = OK;
    S->n = 0;
    for (;;) {
        if ((r = array_next(&c, &S->state, &S->ended, &done)) != AT_EVENT) break;
        Ev ev;
        ev.start = (int64_t)(c.p - base);
        ev.ts = ev.dur = NAN;
        ev.corr = ev.fid = ev.step = -1;
        ev.cat = -1;
        ev.ph = PH_NONE;
        ev.flags = 0;
        r = parse_ev(S, &c, &ev);
        if (r == OK) {
            ev.end = (int64_t)(c.p - base);
            r = append(S, &ev);
        }
        if (r != OK) {
            done = base + ev.start;
            break;
        }
        S->state = 1;
        done = c.p;
    }
    Py_ssize_t pos = (Py_ssize_t)(done - base);
    PyBuffer_Release(&view);
    if (feed_failed(r, final, pos, "buffer", "partition scanner")) return NULL;
    PyObject *cols = PyTuple_New(N_SCOLS + 1);
    if (!cols) return NULL;
    PyTuple_SET_ITEM(cols, 0, PyLong_FromSize_t(S->n));
    for (int i = 0; i < N_SCOLS; i++) {
        PyObject *b = PyBytes_FromStringAndSize(S->cols[i] ? S->cols[i] : "", (Py_ssize_t)(S->n * SCOL_SIZE[i]));
        if (!b) { Py_DECREF(cols); return NULL; }
        PyTuple_SET_ITEM(cols, i + 1, b);
    }
    if (!PyTuple_GET_ITEM(cols, 0)) { Py_DECREF(cols); return NULL; }
    S->n = 0;
    return Py_BuildValue("nON", pos, S->ended ? Py_True : Py_False, cols);
}

/* gather(buf, start, end, win, k) -> [bytes] * k */
static PyObject *gather(PyObject *mod, PyObject *args) {
    Py_buffer b, st, en, wv;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "y*y*y*y*n", &b, &st, &en, &wv, &k)) return NULL;
    PyObject *out = NULL;
    size_t *size = NULL, *count = NULL;
    char **dst = NULL;
    Py_ssize_t n = st.len / 8;
    if (k < 1 || st.len % 8 || en.len != st.len || wv.len != st.len) {
        PyErr_SetString(PyExc_ValueError, "gather: columns of different lengths");
        goto done;
    }
    const int64_t *s = (const int64_t *)st.buf, *e = (const int64_t *)en.buf, *w = (const int64_t *)wv.buf;
    const char *base = (const char *)b.buf;
    size = (size_t *)PyMem_Calloc((size_t)k, sizeof(size_t));
    count = (size_t *)PyMem_Calloc((size_t)k, sizeof(size_t));
    dst = (char **)PyMem_Calloc((size_t)k, sizeof(char *));
    if (!size || !count || !dst) { PyErr_NoMemory(); goto done; }
    size_t every = 0, every_n = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] < 0 || e[i] < s[i] || e[i] > b.len) {
            PyErr_SetString(PyExc_ValueError, "gather: an event outside the buffer");
            goto done;
        }
        size_t len = (size_t)(e[i] - s[i]);
        if (w[i] == -2) { every += len; every_n++; }
        else if (w[i] >= 0 && w[i] < k) { size[w[i]] += len; count[w[i]]++; }
    }
    out = PyList_New(k);
    if (!out) goto done;
    for (Py_ssize_t j = 0; j < k; j++) {
        size_t m = count[j] + every_n;
        size_t total = size[j] + every + (m ? m - 1 : 0);
        PyObject *o = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
        if (!o) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, j, o);
        dst[j] = PyBytes_AS_STRING(o);
        count[j] = 0;  /* events written so far */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t len = (size_t)(e[i] - s[i]);
        int64_t wi = w[i];
        if (wi == -2) {
            for (Py_ssize_t j = 0; j < k; j++) {
                if (count[j]++) *dst[j]++ = ',';
                memcpy(dst[j], base + s[i], len);
                dst[j] += len;
            }
        } else if (wi >= 0 && wi < k) {
            if (count[wi]++) *dst[wi]++ = ',';
            memcpy(dst[wi], base + s[i], len);
            dst[wi] += len;
        }
    }
done:
    PyMem_Free(size);
    PyMem_Free(count);
    PyMem_Free(dst);
    PyBuffer_Release(&b);
    PyBuffer_Release(&st);
    PyBuffer_Release(&en);
    PyBuffer_Release(&wv);
    return out;
}

/* compact(data, sep, n) -> data with each occurrence of sep (`}` gap `{`) made `},{`, or None
 * where sep does not occur exactly n times */
static PyObject *compact(PyObject *mod, PyObject *args) {
    Py_buffer d, sp;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*y*n", &d, &sp, &n)) return NULL;
    PyObject *out = NULL;
    const char *p = (const char *)d.buf, *end = p + d.len, *sep = (const char *)sp.buf;
    size_t m = (size_t)sp.len;
    if (m < 3 || sep[0] != '}' || sep[m - 1] != '{') {
        PyErr_SetString(PyExc_ValueError, "compact: the separator must be `}` gap `{`");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, d.len);
    if (!out) goto done;
    char *w = PyBytes_AS_STRING(out);
    Py_ssize_t count = 0;
    for (;;) {
        const char *q = (const char *)memmem(p, (size_t)(end - p), sep, m);
        if (!q) break;
        if (++count > n) break;
        size_t k = (size_t)(q - p) + 1;  /* through the `}` */
        memcpy(w, p, k);
        w += k;
        *w++ = ',';
        p = q + m - 1;  /* the `{` */
    }
    if (count != n) {
        Py_CLEAR(out);
        out = Py_None;
        Py_INCREF(out);
        goto done;
    }
    memcpy(w, p, (size_t)(end - p));
    w += end - p;
    if (_PyBytes_Resize(&out, w - PyBytes_AS_STRING(out)) < 0) out = NULL;
done:
    PyBuffer_Release(&d);
    PyBuffer_Release(&sp);
    return out;
}

static PyMethodDef Scanner_methods[] = {
    {"feed", (PyCFunction)Scanner_feed, METH_VARARGS,
     "feed(buf, start, final) -> (position, ended, columns): the whole events of buf[start:]"},
    {"reset", (PyCFunction)Scanner_reset, METH_NOARGS, "reset(): read a new events array (cat codes kept)"},
    {NULL}};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zoomer_ar.surgery._partscan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scans the events of a trace's traceEvents array for partition_trace.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = Scanner_methods,
};

static PyMethodDef module_methods[] = {
    {"gather", gather, METH_VARARGS, "gather(buf, start, end, win, k) -> the events of each window, joined by ','"},
    {"compact", compact, METH_VARARGS, "compact(data, sep, n) -> data with its n seps made '},{', or None"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_partscan",
                                    "Compiled event scanner of trace partition (optional accelerator).", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__partscan(void) {
    return lexer_module(&module, &ScannerType, "Scanner", "zoomer_ar.surgery._partscan.Unsupported");
}
