/* Zoomer AR: a compiled reader for the `traceEvents` array of a Kineto / Chrome trace.
 *
 * It parses whole events straight into columns (no Python object per event) and gives exactly
 * the values that zoomer_ar.load.columns.ColumnBuilder builds from msgspec's typed decode
 * (schema.py). It is an accelerator only: whenever an event holds something it does not handle
 * the same way (a value of an unusual type, a duplicate key, invalid JSON, an integer outside
 * int64 ...) it stops with `Unsupported` and the caller redoes the file with the msgspec path.
 *
 * Protocol (see zoomer_ar/load/fastcols.py):
 *   p = EventParser(name_index, cat_index, pid_index, tid_index, decode)
 *   pos, ended = p.feed(buf, start, final)   # parses whole events of buf[start:]; returns where
 *                                            # the first incomplete event starts (or, ended=True,
 *                                            # the index just after the array's `]`)
 *   cols = p.take()                          # columns of the events parsed since the last take
 * The index dicts map a value (str or int) to its code in first-seen order, as the Python
 * builder's; `decode` is msgspec.json.decode, used for strings with escapes. The parser caches
 * codes by the raw bytes of each value: while it is in use, other code may add entries to the
 * dicts but must not remove or renumber any. One feed() at a time per parser (it runs without
 * the GIL; a second call from another thread is refused).
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "_jsonlex.h"

/* ------------------------------------------------------------------------------------------ */

enum {
    SP_INPUT_DIMS, SP_INPUT_TYPE, SP_CALL_STACK, SP_COLLECTIVE, SP_IN_NELEMS, SP_PYTHON_ID, SP_META_NAME, N_SPARSE
};

enum { C_TS, C_DUR, C_PH, C_CAT, C_NAME, C_PID, C_TID, C_CORR, C_STREAM, C_DEVICE, C_DEVICE_ID, C_EXT, C_EXT21,
       C_NBYTES, C_TOTAL, N_COLS };
static const size_t COL_SIZE[N_COLS] = {8, 8, 1, 4, 4, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8};

typedef struct {
    PyObject_HEAD
    PyObject *index[4];   /* name, cat, pid, tid: dict value -> code */
    PyObject *decode;     /* msgspec.json.decode */
    Intern str_tab[4];    /* raw string token -> code, per index (pid/tid: string values) */
    Intern sp_tab[N_SPARSE];
    PyObject *sp_uniques[N_SPARSE];  /* list of bytes: raw JSON text per uid */
    char *cols[N_COLS];   /* columns of the events not yet taken: n_pend of cap_ev */
    size_t n_pend, cap_ev;
    Buf sp_pos[N_SPARSE];  /* int64 event numbers */
    Buf sp_uid[N_SPARSE];  /* int32 */
    int64_t n_total;       /* events parsed so far (all feeds) */
    int64_t n_taken;       /* events handed over by take() */
    int state;             /* 0: before an event or `]`; 1: after an event (`,` or `]` next); 2: after `,` */
    int ended;
    /* last pid/tid int seen and its code (consecutive events mostly share them) */
    int64_t last_int[2];
    int32_t last_int_code[2];
    int last_int_valid[2];
    Intern int_tab[2];     /* pid/tid integer (8 bytes) -> code */
    PyThreadState *ts;     /* non-NULL while feed() runs without the GIL */
    int busy;              /* feed() is running (it releases the GIL: no second call meanwhile) */
} Parser;

/* feed() parses without the GIL (the reader thread inflates and hashes meanwhile); it takes the
 * GIL back only to register a value it has not seen before. */
#define GIL(P) do { if ((P)->ts) { PyEval_RestoreThread((P)->ts); (P)->ts = NULL; } } while (0)
#define NOGIL(P) do { (P)->ts = PyEval_SaveThread(); } while (0)

static int code_of_new_string(Parser *P, int k, const char *s, size_t n, int esc, int32_t *code);

/* The code of `key` (a new reference, consumed; NULL: ERR) in index k: its code, or the next one
 * when the key is new (first-seen order, as the Python builders' setdefault). GIL held. */
static int register_key(Parser *P, int k, PyObject *key, int32_t *code) {
    if (!key) return ERR;
    PyObject *d = P->index[k];
    PyObject *next = PyLong_FromSsize_t(PyDict_GET_SIZE(d));
    if (!next) { Py_DECREF(key); return ERR; }
    PyObject *got = PyDict_SetDefault(d, key, next);
    Py_DECREF(next);
    Py_DECREF(key);
    if (!got) return ERR;
    long v = PyLong_AsLong(got);
    if (v == -1 && PyErr_Occurred()) return ERR;
    *code = (int32_t)v;
    return OK;
}

/* code of a string token in index k (0 name, 1 cat, 2 pid, 3 tid) */
static int code_of_string(Parser *P, int k, const char *s, size_t n, int esc, int32_t *code) {
    Intern *t = &P->str_tab[k];
    uint64_t h = hash_bytes(s, n);
    Slot *slot = intern_find(t, s, n, h);
    if (slot->used) { *code = slot->code; return OK; }
    int released = P->ts != NULL;
    GIL(P);
    int r = code_of_new_string(P, k, s, n, esc, code);
    if (r == OK && intern_add(t, slot, s, n, h, *code) < 0) r = ERR;
    if (released) NOGIL(P);
    return r;
}

static int code_of_new_string(Parser *P, int k, const char *s, size_t n, int esc, int32_t *code) {
    PyObject *str;
    if (esc) {
        PyObject *raw = PyBytes_FromStringAndSize(s - 1, (Py_ssize_t)n + 2);
        if (!raw) return ERR;
        str = PyObject_CallOneArg(P->decode, raw);
        Py_DECREF(raw);
        if (!str) { PyErr_Clear(); return BAD; }
        if (!PyUnicode_Check(str)) { Py_DECREF(str); return BAD; }
    } else {
        str = PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, NULL);
        if (!str) { PyErr_Clear(); return BAD; }
    }
    return register_key(P, k, str, code);
}

static int read_string_code(Parser *P, Cur *c, int k, int32_t *code) {
    skip_ws(c);
    if (c->p >= c->end) return MORE;
    if (*c->p != '"') return BAD;  /* msgspec: wrong type -> ValidationError */
    const char *s; size_t n; int esc; int r;
    if ((r = scan_string(c, &s, &n, &esc)) != OK) return r;
    return code_of_string(P, k, s, n, esc, code);
}

static int code_of_new_int(Parser *P, int k, int64_t iv, int32_t *code);

/* pid / tid: int or str (k = 2 or 3) */
static int read_id_code(Parser *P, Cur *c, int k, int32_t *code) {
    int is_int, big; int64_t iv; double dv; int r;
    if ((r = next_value(c)) != OK) return r;
    if (*c->p == '"') return read_string_code(P, c, k, code);
    if ((r = number_token(c, &is_int, &iv, &big, &dv)) != OK) return r;
    if (!is_int || big) return BAD;
    int j = k - 2;
    if (P->last_int_valid[j] && P->last_int[j] == iv) { *code = P->last_int_code[j]; return OK; }
    Intern *t = &P->int_tab[j];
    uint64_t h = hash_bytes((const char *)&iv, 8);
    Slot *slot = intern_find(t, (const char *)&iv, 8, h);
    if (slot->used) {
        *code = slot->code;
    } else {
        int released = P->ts != NULL;
        GIL(P);
        r = code_of_new_int(P, k, iv, code);
        if (r == OK && intern_add(t, slot, (const char *)&iv, 8, h, *code) < 0) r = ERR;
        if (released) NOGIL(P);
        if (r != OK) return r;
    }
    P->last_int[j] = iv;
    P->last_int_code[j] = *code;
    P->last_int_valid[j] = 1;
    return OK;
}

static int code_of_new_int(Parser *P, int k, int64_t iv, int32_t *code) {
    return register_key(P, k, PyLong_FromLongLong(iv), code);
}

/* ts / dur: int | float -> double */
static int read_number(Cur *c, double *out) {
    int is_int, big; int64_t iv; int r;
    if ((r = next_value(c)) != OK) return r;
    if ((r = number_token(c, &is_int, &iv, &big, out)) != OK) return r;
    return big ? BAD : OK;
}

/* A numeric field given as a string (AMD traces: "stream": "0x0", "bytes": "60"). The reference
 * path converts a column with numpy, or value by value with int()/float() where numpy refuses a
 * value; both agree on decimal strings (the value) and on hex strings (refused: -1 / NaN), so only
 * those are in this reader's subset. kind: 0 -> *iv (integer), 1 -> *dv (float). */
static int numeric_string(const char *s, size_t n, int kind, int64_t *iv, double *dv) {
    if (n >= 3 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        for (size_t i = 2; i < n; i++) if (!is_hex(s[i])) return BAD;
        if (kind == 0) *iv = -1; else *dv = NAN;
        return OK;
    }
    size_t i = 0;
    if (i < n && s[i] == '-') i++;
    size_t d0 = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    if (i == d0) return BAD;
    if (kind == 0) {
        if (i != n || n - d0 > 18) return BAD;
        int64_t v = 0;
        for (size_t k = d0; k < n; k++) v = v * 10 + (s[k] - '0');
        *iv = s[0] == '-' ? -v : v;
        return OK;
    }
    if (i < n && s[i] == '.') {
        i++;
        size_t f0 = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == f0) return BAD;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t e0 = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (i == e0) return BAD;
    }
    if (i != n || n > 60) return BAD;
    char tmp[64];
    memcpy(tmp, s, n);
    tmp[n] = 0;
    double d;
    if (!c_strtod(tmp, n, &d) || isinf(d)) return BAD;
    *dv = d;
    return OK;
}

/* A numeric argument (Scalar | None) for an int column (kind 0: *iout, -1 for null) or a float
 * column (kind 1: *dout, NaN for null): numbers, null, and the strings numeric_string takes. */
static int read_numeric_arg(Cur *c, int kind, int64_t *iout, double *dout) {
    int r;
    if ((r = next_value(c)) != OK) return r;
    char ch = *c->p;
    if (ch == 'n') {
        if ((r = skip_literal(c, "null", 4)) == OK) {
            if (kind == 0) *iout = -1; else *dout = NAN;
        }
        return r;
    }
    if (ch == '"') {
        const char *s; size_t n; int esc;
        if ((r = scan_string(c, &s, &n, &esc)) != OK) return r;
        return esc ? BAD : numeric_string(s, n, kind, iout, dout);
    }
    int is_int, big; int64_t iv; double dv;
    if ((r = number_token(c, &is_int, &iv, &big, &dv)) != OK) return r;
    if (big) return BAD;
    if (kind == 1) { *dout = dv; return OK; }
    if (!is_int || iv == INT64_MIN) return BAD;
    *iout = iv;
    return OK;
}

static int read_int_arg(Cur *c, int64_t *out) {
    double unused;
    return read_numeric_arg(c, 0, out, &unused);
}

static int read_float_arg(Cur *c, double *out) {
    int64_t unused;
    return read_numeric_arg(c, 1, &unused, out);
}

/* a value kept as raw JSON text for a sparse field: uid of the text. kind: 0 any JSON,
 * 1 str|null, 2 scalar|null. JSON null gives uid -1 (absent). */
static int read_sparse(Parser *P, Cur *c, int f, int kind, int32_t *uid) {
    skip_ws(c);
    if (c->p >= c->end) return MORE;
    char ch = *c->p;
    if (ch == 'n') { int r = skip_literal(c, "null", 4); if (r == OK) *uid = -1; return r; }
    if (kind == 1 && ch != '"') return BAD;
    if (kind == 2 && (ch == '{' || ch == '[' || ch == 't' || ch == 'f')) return BAD;
    const char *start = c->p;
    int r;
    if (kind == 2 && (ch == '-' || (ch >= '0' && ch <= '9'))) {
        /* a typed scalar: msgspec refuses a float out of range (1e400), so must we */
        int is_int, big; int64_t iv; double dv;
        r = scan_number(c, &is_int, &iv, &big, &dv);
    } else {
        r = skip_value(c, 0);
    }
    if (r != OK) return r;
    size_t n = (size_t)(c->p - start);
    Intern *t = &P->sp_tab[f];
    uint64_t h = hash_bytes(start, n);
    Slot *slot = intern_find(t, start, n, h);
    if (slot->used) { *uid = slot->code; return OK; }
    int released = P->ts != NULL;
    GIL(P);
    r = ERR;
    PyObject *b = PyBytes_FromStringAndSize(start, (Py_ssize_t)n);
    if (b) {
        Py_ssize_t k = PyList_GET_SIZE(P->sp_uniques[f]);
        if (PyList_Append(P->sp_uniques[f], b) == 0) {
            *uid = (int32_t)k;
            r = intern_add(t, slot, start, n, h, *uid) < 0 ? ERR : OK;
        }
        Py_DECREF(b);
    }
    if (released) NOGIL(P);
    return r;
}

/* a scalar that is only validated (Out msg nelems, Group size, Python parent id); a float out of
 * range is refused as msgspec refuses it */
static int skip_scalar(Cur *c) {
    skip_ws(c);
    if (c->p >= c->end) return MORE;
    char ch = *c->p;
    if (ch == '{' || ch == '[' || ch == 't' || ch == 'f') return BAD;
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        int is_int, big; int64_t iv; double dv;
        return scan_number(c, &is_int, &iv, &big, &dv);
    }
    return skip_value(c, 0);
}

typedef struct {
    double ts, dur, nbytes, mem_bytes, total;
    int64_t corr, stream, device, device_id, ext, ext21;
    int32_t cat, name, pid, tid;
    uint8_t ph;
    int32_t sp[N_SPARSE];
} Event;

enum {
    A_CORR, A_STREAM, A_DEVICE, A_DEVICE_ID, A_EXT, A_EXT21, A_BYTES, A_MEM, A_TOTAL, A_DIMS, A_TYPE, A_STACK,
    A_COLL, A_IN, A_OUT, A_GROUP, A_PYID, A_PYPARENT, A_NAME, N_ARGKEYS
};

static int arg_key(const char *s, size_t n) {
    switch (n) {
    case 4: if (key_is(s, n, "name")) return A_NAME; break;
    case 5: if (key_is(s, n, "bytes")) return A_BYTES; if (key_is(s, n, "Bytes")) return A_MEM; break;
    case 6: if (key_is(s, n, "stream")) return A_STREAM; if (key_is(s, n, "device")) return A_DEVICE; break;
    case 9: if (key_is(s, n, "Device Id")) return A_DEVICE_ID; if (key_is(s, n, "Python id")) return A_PYID; break;
    case 10:
        if (key_is(s, n, "Input Dims")) return A_DIMS;
        if (key_is(s, n, "Input type")) return A_TYPE;
        if (key_is(s, n, "Call stack")) return A_STACK;
        if (key_is(s, n, "Group size")) return A_GROUP;
        break;
    case 11:
        if (key_is(s, n, "correlation")) return A_CORR;
        if (key_is(s, n, "External id")) return A_EXT;
        if (key_is(s, n, "external id")) return A_EXT21;
        break;
    case 13: if (key_is(s, n, "In msg nelems")) return A_IN; break;
    case 14: if (key_is(s, n, "Out msg nelems")) return A_OUT; break;
    case 15:
        if (key_is(s, n, "Total Allocated")) return A_TOTAL;
        if (key_is(s, n, "Collective name")) return A_COLL;
        break;
    case 16: if (key_is(s, n, "Python parent id")) return A_PYPARENT; break;
    }
    return -1;
}

static int parse_args(Parser *P, Cur *c, Event *ev) {
    uint32_t seen = 0;
    int r, empty, more = 1;
    if ((r = open_object(c, &empty)) != OK || empty) return r;
    while (more) {
        const char *ks; size_t kn;
        if ((r = read_key(c, &ks, &kn)) != OK) return r;
        int k = arg_key(ks, kn);
        if (!first_key(&seen, k)) return BAD;
        switch (k) {
        case A_CORR: r = read_int_arg(c, &ev->corr); break;
        case A_STREAM: r = read_int_arg(c, &ev->stream); break;
        case A_DEVICE: r = read_int_arg(c, &ev->device); break;
        case A_DEVICE_ID: r = read_int_arg(c, &ev->device_id); break;
        case A_EXT: r = read_int_arg(c, &ev->ext); break;
        case A_EXT21: r = read_int_arg(c, &ev->ext21); break;
        case A_BYTES: r = read_float_arg(c, &ev->nbytes); break;
        case A_MEM: r = read_float_arg(c, &ev->mem_bytes); break;
        case A_TOTAL: r = read_float_arg(c, &ev->total); break;
        case A_DIMS: r = read_sparse(P, c, SP_INPUT_DIMS, 0, &ev->sp[SP_INPUT_DIMS]); break;
        case A_TYPE: r = read_sparse(P, c, SP_INPUT_TYPE, 0, &ev->sp[SP_INPUT_TYPE]); break;
        case A_STACK: r = read_sparse(P, c, SP_CALL_STACK, 1, &ev->sp[SP_CALL_STACK]); break;
        case A_COLL: r = read_sparse(P, c, SP_COLLECTIVE, 1, &ev->sp[SP_COLLECTIVE]); break;
        case A_IN: r = read_sparse(P, c, SP_IN_NELEMS, 2, &ev->sp[SP_IN_NELEMS]); break;
        case A_PYID: r = read_sparse(P, c, SP_PYTHON_ID, 2, &ev->sp[SP_PYTHON_ID]); break;
        case A_NAME: r = read_sparse(P, c, SP_META_NAME, 0, &ev->sp[SP_META_NAME]); break;
        case A_OUT: case A_GROUP: case A_PYPARENT: r = skip_scalar(c); break;
        default: r = skip_value(c, 0); break;
        }
        if ((r = member_end(c, r, &more)) != OK) return r;
    }
    return OK;
}

static uint8_t ph_code_of(const char *s, size_t n) {
    if (n != 1) return 0;
    switch (s[0]) {
    case 'X': return 1;
    case 'i': case 'I': return 2;
    case 's': return 3;
    case 'f': case 't': return 4;
    case 'M': return 5;
    case 'B': return 6;
    case 'E': return 7;
    case 'C': return 8;
    }
    return 0;
}

static int parse_event(Parser *P, Cur *c, Event *ev) {
    uint32_t seen = 0;
    int r, empty, more = 1;
    if ((r = open_object(c, &empty)) != OK || empty) return r;
    while (more) {
        const char *ks; size_t kn;
        if ((r = read_key(c, &ks, &kn)) != OK) return r;
        int k = event_key(ks, kn, 0);
        if (!first_key(&seen, k)) return BAD;
        switch (k) {
        case K_PH: {
            skip_ws(c);
            if (c->p >= c->end) return MORE;
            if (*c->p != '"') return BAD;
            const char *s; size_t n; int esc;
            if ((r = scan_string(c, &s, &n, &esc)) != OK) return r;
            if (esc) return BAD;
            ev->ph = ph_code_of(s, n);
            break;
        }
        case K_NAME: r = read_string_code(P, c, 0, &ev->name); break;
        case K_CAT: r = read_string_code(P, c, 1, &ev->cat); break;
        case K_TS: r = read_number(c, &ev->ts); break;
        case K_DUR: r = read_number(c, &ev->dur); break;
        case K_PID: r = read_id_code(P, c, 2, &ev->pid); break;
        case K_TID: r = read_id_code(P, c, 3, &ev->tid); break;
        case K_ARGS: r = parse_args(P, c, ev); break;
        default: r = skip_value(c, 0); break;
        }
        if ((r = member_end(c, r, &more)) != OK) return r;
    }
    return OK;
}

/* codes of the defaults ("" for name/cat, 0 for pid/tid), resolved lazily in event order */
static int default_codes(Parser *P, Event *ev, uint32_t need) {
    int r;
    if (need & 1) { if ((r = code_of_string(P, 0, "", 0, 0, &ev->name)) != OK) return r; }
    if (need & 2) { if ((r = code_of_string(P, 1, "", 0, 0, &ev->cat)) != OK) return r; }
    for (int j = 0; j < 2; j++) {
        if (!(need & (4u << j))) continue;
        Cur c0 = {"0", "0" + 1, 1};
        int32_t code;
        if ((r = read_id_code(P, &c0, 2 + j, &code)) != OK) return r;
        if (j == 0) ev->pid = code; else ev->tid = code;
    }
    return OK;
}

static int append_event(Parser *P, Event *ev) {
    if (P->n_pend == P->cap_ev && grow_columns(P->cols, COL_SIZE, N_COLS, &P->cap_ev, 16384) != OK) return ERR;
    size_t i = P->n_pend;
    ((double *)P->cols[C_TS])[i] = ev->ts;
    ((double *)P->cols[C_DUR])[i] = ev->dur;
    ((uint8_t *)P->cols[C_PH])[i] = ev->ph;
    ((int32_t *)P->cols[C_CAT])[i] = ev->cat;
    ((int32_t *)P->cols[C_NAME])[i] = ev->name;
    ((int32_t *)P->cols[C_PID])[i] = ev->pid;
    ((int32_t *)P->cols[C_TID])[i] = ev->tid;
    ((int64_t *)P->cols[C_CORR])[i] = ev->corr;
    ((int64_t *)P->cols[C_STREAM])[i] = ev->stream;
    ((int64_t *)P->cols[C_DEVICE])[i] = ev->device;
    ((int64_t *)P->cols[C_DEVICE_ID])[i] = ev->device_id;
    ((int64_t *)P->cols[C_EXT])[i] = ev->ext;
    ((int64_t *)P->cols[C_EXT21])[i] = ev->ext21;
    ((double *)P->cols[C_NBYTES])[i] = isnan(ev->nbytes) ? ev->mem_bytes : ev->nbytes;
    ((double *)P->cols[C_TOTAL])[i] = ev->total;
    P->n_pend++;
    for (int f = 0; f < N_SPARSE; f++) {
        if (ev->sp[f] < 0) continue;
        if (buf_put(&P->sp_pos[f], &P->n_total, 8) < 0 || buf_put(&P->sp_uid[f], &ev->sp[f], 4) < 0) return ERR;
    }
    P->n_total++;
    return OK;
}

/* ------------------------------------------------------------------------------------------ */

static int Parser_init(Parser *P, PyObject *args, PyObject *kw) {
    PyObject *idx[4], *decode;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O", &PyDict_Type, &idx[0], &PyDict_Type, &idx[1], &PyDict_Type, &idx[2],
                          &PyDict_Type, &idx[3], &decode))
        return -1;
    if (P->busy) {
        PyErr_SetString(PyExc_RuntimeError, "EventParser.__init__() while feed() runs");
        return -1;
    }
    for (int k = 0; k < 4; k++) {
        Py_INCREF(idx[k]);
        Py_XSETREF(P->index[k], idx[k]);
        intern_free(&P->str_tab[k]);
        if (intern_init(&P->str_tab[k]) < 0) { PyErr_NoMemory(); return -1; }
    }
    Py_INCREF(decode);
    Py_XSETREF(P->decode, decode);
    for (int f = 0; f < N_SPARSE; f++) {
        intern_free(&P->sp_tab[f]);
        if (intern_init(&P->sp_tab[f]) < 0) { PyErr_NoMemory(); return -1; }
        PyObject *l = PyList_New(0);
        if (!l) return -1;
        Py_XSETREF(P->sp_uniques[f], l);
    }
    for (int j = 0; j < 2; j++) {
        intern_free(&P->int_tab[j]);
        if (intern_init(&P->int_tab[j]) < 0) { PyErr_NoMemory(); return -1; }
    }
    P->state = 0;
    P->ended = 0;
    P->n_total = P->n_taken = 0;
    P->last_int_valid[0] = P->last_int_valid[1] = 0;
    return 0;
}

static void Parser_dealloc(Parser *P) {
    for (int k = 0; k < 4; k++) { Py_XDECREF(P->index[k]); intern_free(&P->str_tab[k]); }
    for (int j = 0; j < 2; j++) intern_free(&P->int_tab[j]);
    Py_XDECREF(P->decode);
    for (int f = 0; f < N_SPARSE; f++) {
        intern_free(&P->sp_tab[f]);
        Py_XDECREF(P->sp_uniques[f]);
        buf_free(&P->sp_pos[f]);
        buf_free(&P->sp_uid[f]);
    }
    for (int i = 0; i < N_COLS; i++) PyMem_RawFree(P->cols[i]);
    Py_TYPE(P)->tp_free((PyObject *)P);
}

static PyObject *Parser_feed(Parser *P, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start;
    int final;
    if (!PyArg_ParseTuple(args, "y*np", &view, &start, &final)) return NULL;
    if (start < 0 || start > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "start outside the buffer");
        return NULL;
    }
    if (P->ended) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the events array has ended");
        return NULL;
    }
    if (P->busy) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "EventParser.feed() is already running in another thread");
        return NULL;
    }
    P->busy = 1;
    const char *base = (const char *)view.buf;
    Cur c = {base + start, base + view.len, final};
    const char *done = c.p;  /* position after the last whole event (or separator) */
    int r = OK;
    NOGIL(P);
    for (;;) {
        if ((r = array_next(&c, &P->state, &P->ended, &done)) != AT_EVENT) break;
        Event ev;
        ev.ts = ev.dur = 0.0;
        ev.nbytes = ev.mem_bytes = ev.total = NAN;
        ev.corr = ev.stream = ev.device = ev.device_id = ev.ext = ev.ext21 = -1;
        ev.cat = ev.name = ev.pid = ev.tid = -1;
        ev.ph = 0;
        for (int f = 0; f < N_SPARSE; f++) ev.sp[f] = -1;
        const char *ev_start = c.p;
        r = parse_event(P, &c, &ev);
        if (r == OK) {
            uint32_t need = (ev.name < 0 ? 1u : 0u) | (ev.cat < 0 ? 2u : 0u) | (ev.pid < 0 ? 4u : 0u) |
                            (ev.tid < 0 ? 8u : 0u);
            if (need) r = default_codes(P, &ev, need);
        }
        if (r == OK) r = append_event(P, &ev);
        if (r != OK) {
            done = ev_start;
            break;
        }
        P->state = 1;
        done = c.p;
    }
    GIL(P);
    P->busy = 0;
    Py_ssize_t pos = (Py_ssize_t)(done - base);
    PyBuffer_Release(&view);
    if (feed_failed(r, final, pos, "slice", "fast reader")) return NULL;
    return Py_BuildValue("nO", pos, P->ended ? Py_True : Py_False);
}

static PyObject *take_buf(Buf *b) {
    PyObject *o = PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
    b->len = 0;
    return o;
}

static const char *COL_NAMES[N_COLS] = {"ts", "dur", "ph", "cat", "name", "pid", "tid", "correlation", "stream",
                                        "device", "device_id", "external_id", "external_id_2021", "nbytes",
                                        "total_allocated"};
static const char *SP_NAMES[N_SPARSE] = {"input_dims", "input_type", "call_stack", "collective", "in_msg_nelems",
                                         "python_id", "meta_name"};

/* take() -> (n, {column: bytes}, {sparse field: (positions bytes, uids bytes, uniques list)}) */
static PyObject *Parser_take(Parser *P, PyObject *unused) {
    if (P->busy) {
        PyErr_SetString(PyExc_RuntimeError, "EventParser.take() while feed() runs in another thread");
        return NULL;
    }
    PyObject *cols = PyDict_New(), *sparse = PyDict_New();
    if (!cols || !sparse) goto fail;
    for (int i = 0; i < N_COLS; i++) {
        PyObject *b = PyBytes_FromStringAndSize(P->cols[i] ? P->cols[i] : "", (Py_ssize_t)(P->n_pend * COL_SIZE[i]));
        if (!b || PyDict_SetItemString(cols, COL_NAMES[i], b) < 0) { Py_XDECREF(b); goto fail; }
        Py_DECREF(b);
    }
    for (int f = 0; f < N_SPARSE; f++) {
        PyObject *pos = take_buf(&P->sp_pos[f]);
        PyObject *uid = take_buf(&P->sp_uid[f]);
        PyObject *t = (pos && uid) ? PyTuple_Pack(3, pos, uid, P->sp_uniques[f]) : NULL;
        Py_XDECREF(pos);
        Py_XDECREF(uid);
        if (!t || PyDict_SetItemString(sparse, SP_NAMES[f], t) < 0) { Py_XDECREF(t); goto fail; }
        Py_DECREF(t);
    }
    P->n_pend = 0;
    int64_t n = P->n_total - P->n_taken;
    P->n_taken = P->n_total;
    return Py_BuildValue("LNN", (long long)n, cols, sparse);
fail:
    Py_XDECREF(cols);
    Py_XDECREF(sparse);
    return NULL;
}

static PyObject *Parser_count(Parser *P, void *closure) { return PyLong_FromLongLong(P->n_total); }
static PyObject *Parser_ended(Parser *P, void *closure) { return PyBool_FromLong(P->ended); }

static PyMethodDef Parser_methods[] = {
    {"feed", (PyCFunction)Parser_feed, METH_VARARGS,
     "feed(buf, start, final) -> (position, ended): parse the whole events of buf[start:]"},
    {"take", (PyCFunction)Parser_take, METH_NOARGS,
     "take() -> (n, columns, sparse): the events parsed since the last take"},
    {NULL}};

static PyGetSetDef Parser_getset[] = {
    {"count", (getter)Parser_count, NULL, "events parsed", NULL},
    {"ended", (getter)Parser_ended, NULL, "whether the array's `]` was read", NULL},
    {NULL}};

static PyTypeObject ParserType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zoomer_ar.load._fastjson.EventParser",
    .tp_basicsize = sizeof(Parser),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Parses the events of a trace's traceEvents array into columns.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Parser_init,
    .tp_dealloc = (destructor)Parser_dealloc,
    .tp_methods = Parser_methods,
    .tp_getset = Parser_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastjson",
                                    "Compiled reader of Kineto trace events (optional accelerator).", -1, NULL};

PyMODINIT_FUNC PyInit__fastjson(void) {
    PyObject *m = lexer_module(&module, &ParserType, "EventParser", "zoomer_ar.load._fastjson.Unsupported");
    if (m) PyModule_AddIntConstant(m, "FORMAT_VERSION", 1);
    return m;
}
