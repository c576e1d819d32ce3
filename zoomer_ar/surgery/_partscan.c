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
 * The JSON helpers (strings, numbers, skipping) are those of zoomer_ar/load/_fastjson.c.
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
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <errno.h>
#include <locale.h>
#include <stdlib.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* growable buffers */

typedef struct {
    char *data;
    size_t len;  /* bytes */
    size_t cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *d = (char *)PyMem_RawRealloc(b->data, cap);
    if (!d) return -1;  /* feed() raises MemoryError */
    b->data = d;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *p, size_t n) {
    if (n == 0) return 0;
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static void buf_free(Buf *b) {
    PyMem_RawFree(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* intern table: raw JSON token bytes -> int32 code (the code is set by the caller) */

typedef struct {
    uint64_t hash;
    uint32_t off;   /* into arena */
    uint32_t len;
    int32_t code;
    int32_t used;
} Slot;

typedef struct {
    Slot *slots;
    size_t mask;    /* capacity - 1 */
    size_t count;
    Buf arena;
} Intern;

static uint64_t hash_bytes(const char *p, size_t n) {
    /* FNV-1a over 8-byte words, then a final mix */
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ULL;
    h ^= h >> 32;
    return h;
}

static int intern_init(Intern *t) {
    t->mask = 255;
    t->count = 0;
    t->slots = (Slot *)PyMem_RawCalloc(t->mask + 1, sizeof(Slot));
    memset(&t->arena, 0, sizeof(Buf));
    if (!t->slots) return -1;
    return 0;
}

static void intern_free(Intern *t) {
    PyMem_RawFree(t->slots);
    t->slots = NULL;
    buf_free(&t->arena);
}

/* slot for (p, n): found (used) or the empty one where it goes */
static Slot *intern_find(Intern *t, const char *p, size_t n, uint64_t h) {
    size_t i = (size_t)h & t->mask;
    for (;;) {
        Slot *s = &t->slots[i];
        if (!s->used) return s;
        if (s->hash == h && s->len == n && (n == 0 || memcmp(t->arena.data + s->off, p, n) == 0)) return s;
        i = (i + 1) & t->mask;
    }
}

static int intern_grow(Intern *t) {
    size_t ncap = (t->mask + 1) * 2;
    Slot *ns = (Slot *)PyMem_RawCalloc(ncap, sizeof(Slot));
    if (!ns) return -1;
    for (size_t i = 0; i <= t->mask; i++) {
        Slot *s = &t->slots[i];
        if (!s->used) continue;
        size_t j = (size_t)s->hash & (ncap - 1);
        while (ns[j].used) j = (j + 1) & (ncap - 1);
        ns[j] = *s;
    }
    PyMem_RawFree(t->slots);
    t->slots = ns;
    t->mask = ncap - 1;
    return 0;
}

static int intern_add(Intern *t, Slot *s, const char *p, size_t n, uint64_t h, int32_t code) {
    if (t->arena.len + n > 0xFFFFFFFFu) return -1;
    s->off = (uint32_t)t->arena.len;
    if (buf_put(&t->arena, p, n) < 0) return -1;
    s->hash = h;
    s->len = (uint32_t)n;
    s->code = code;
    s->used = 1;
    t->count++;
    if (t->count * 2 > t->mask + 1) return intern_grow(t);
    return 0;
}

enum { OK = 0, MORE = 1, BAD = 2, ERR = 3 };  /* MORE: ran off the buffer; BAD: unsupported; ERR: Python error */

typedef struct {
    const char *p;
    const char *end;
    int final;
} Cur;

static inline void skip_ws(Cur *c) {
    while (c->p < c->end) {
        char ch = *c->p;
        if (ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t') c->p++;
        else break;
    }
}

/* UTF-8 validation (as strict as CPython's decoder: no overlongs, surrogates or > U+10FFFF) */
static int utf8_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            unsigned char c1 = s[i + 1], c2 = s[i + 2];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0;
            if (c == 0xED && c1 >= 0xA0) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            unsigned char c1 = s[i + 1], c2 = s[i + 2], c3 = s[i + 3];
            if ((c1 & 0xC0) != 0x80 || (c2 & 0xC0) != 0x80 || (c3 & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;
            if (c == 0xF4 && c1 >= 0x90) return 0;
            i += 4;
        } else return 0;
    }
    return 1;
}

static inline int is_hex(char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* String token at c->p (which is `"`). On OK: *s, *n = contents (without quotes), *esc = has
 * escapes, c->p after the closing quote. Validates escapes, control characters and UTF-8. */
static int scan_string(Cur *c, const char **s, size_t *n, int *esc) {
    const char *p = c->p + 1;
    const char *end = c->end;
    int has_esc = 0, high = 0;
    for (;;) {
        const char *q = p;
        /* fast run over plain characters: 16 at a time where SSE2 is there */
#ifdef __SSE2__
        {
            const __m128i quote = _mm_set1_epi8('"'), bslash = _mm_set1_epi8('\\');
            const __m128i ctl = _mm_set1_epi8(0x1F);
            while (q + 16 <= end) {
                __m128i v = _mm_loadu_si128((const __m128i *)q);
                int hi = _mm_movemask_epi8(v);
                /* bytes < 0x20 (unsigned): min(v, 0x1F) == v, only for bytes without the high bit */
                __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)),
                                            _mm_cmpeq_epi8(_mm_min_epu8(v, ctl), v));
                int m = _mm_movemask_epi8(stop);
                if (m) {
                    int k = __builtin_ctz(m);
                    high |= hi & ((1 << k) - 1);
                    q += k;
                    goto found;
                }
                high |= hi;
                q += 16;
            }
        }
#endif
        while (q < end) {
            unsigned char ch = (unsigned char)*q;
            if (ch == '"' || ch == '\\' || ch < 0x20) break;
            high |= ch & 0x80;
            q++;
        }
#ifdef __SSE2__
    found:
#endif
        if (q >= end) return MORE;
        unsigned char ch = (unsigned char)*q;
        if (ch == '"') { p = q; break; }
        if (ch < 0x20) return BAD;
        /* backslash */
        has_esc = 1;
        if (q + 1 >= end) return MORE;
        char e = q[1];
        if (e == 'u') {
            if (q + 6 > end) return MORE;
            for (int k = 2; k < 6; k++) if (!is_hex(q[k])) return BAD;
            p = q + 6;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
            p = q + 2;
        } else return BAD;
    }
    *s = c->p + 1;
    *n = (size_t)(p - (c->p + 1));
    *esc = has_esc;
    if (high && !utf8_ok((const unsigned char *)*s, *n)) return BAD;
    c->p = p + 1;
    return OK;
}

/* Number token. On OK: *is_int, *iv (when is_int and in int64), *big (int outside int64),
 * *dv (the value as a double, correctly rounded). A number that touches the end of the buffer
 * is MORE unless final. */
/* correctly rounded decimal -> double, independent of the process locale and of the GIL */
static locale_t C_LOCALE;

static int c_strtod(const char *tmp, size_t n, double *out) {
    char *endp = NULL;
    errno = 0;
    double d = strtod_l(tmp, &endp, C_LOCALE);
    if (endp != tmp + n) return 0;
    *out = d;
    return 1;
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* eight ASCII digits at once (the SWAR trick of simdjson and fast_float; little-endian loads) */
static inline int eight_digits(const char *p, uint64_t *out) {
    uint64_t v;
    memcpy(&v, p, 8);
    if ((((v & 0xF0F0F0F0F0F0F0F0ULL) | (((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) >> 4)) !=
         0x3333333333333333ULL))
        return 0;
    v -= 0x3030303030303030ULL;
    v = (v * 10) + (v >> 8);
    v = (((v & 0x000000FF000000FFULL) * 0x000F424000000064ULL) +
         (((v >> 16) & 0x000000FF000000FFULL) * 0x0000271000000001ULL)) >> 32;
    *out = v;
    return 1;
}

#if defined(__x86_64__) || defined(__i386__)
static const long double POW10L[28] = {1e0L, 1e1L, 1e2L, 1e3L, 1e4L, 1e5L, 1e6L, 1e7L, 1e8L, 1e9L, 1e10L, 1e11L, 1e12L,
                                       1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L, 1e20L, 1e21L, 1e22L, 1e23L,
                                       1e24L, 1e25L, 1e26L, 1e27L};
#endif

static int scan_number(Cur *c, int *is_int, int64_t *iv, int *big, double *dv) {
    const char *p = c->p, *end = c->end, *start = c->p;
    int neg = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    if (p >= end) return c->final ? BAD : MORE;
    uint64_t m = 0;
    int digits = 0, mdigits = 0, overflow = 0;
    if (*p == '0') {
        p++;
        digits = 1;
    } else if (*p >= '1' && *p <= '9') {
        const char *d0 = p;
        uint64_t eight;
        while (end - p >= 8 && p - d0 <= 11 && eight_digits(p, &eight)) { m = m * 100000000ULL + eight; p += 8; }
        while (p < end && *p >= '0' && *p <= '9' && p - d0 < 19) { m = m * 10 + (uint64_t)(*p - '0'); p++; }
        mdigits = digits = (int)(p - d0);
        while (p < end && *p >= '0' && *p <= '9') {  /* a 20th digit and more: rare */
            if (m > (UINT64_MAX - 9) / 10) overflow = 1;
            else { m = m * 10 + (uint64_t)(*p - '0'); mdigits++; }
            digits++;
            p++;
        }
    } else return BAD;
    int frac = 0, exp10 = 0, has_exp = 0;
    int frac_digits = 0;
    uint64_t fm = m;
    int fm_ok = !overflow && mdigits <= 19;
    int sig = (m != 0) ? mdigits : 0;
    if (p < end && *p == '.') {
        frac = 1;
        p++;
        const char *f0 = p;
        uint64_t eight;
        while (fm_ok && fm != 0 && sig <= 11 && end - p >= 8 && eight_digits(p, &eight)) {
            fm = fm * 100000000ULL + eight;
            sig += 8;
            frac_digits += 8;
            p += 8;
        }
        while (p < end && *p >= '0' && *p <= '9') {
            if (fm_ok) {
                if (fm == 0 && *p == '0') { frac_digits++; }
                else if (sig < 19) { fm = fm * 10 + (uint64_t)(*p - '0'); sig++; frac_digits++; }
                else fm_ok = 0;
            }
            p++;
        }
        if (p == f0) return (p >= end && !c->final) ? MORE : BAD;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        has_exp = 1;
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        const char *e0 = p;
        int ev = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (ev < 100000) ev = ev * 10 + (*p - '0');
            p++;
        }
        if (p == e0) return (p >= end && !c->final) ? MORE : BAD;
        exp10 = eneg ? -ev : ev;
    }
    if (p >= end && !c->final) return MORE;
    (void)digits;
    c->p = p;
    if (!frac && !has_exp) {
        *is_int = 1;
        if (overflow || (!neg && m > (uint64_t)INT64_MAX) || (neg && m > (uint64_t)INT64_MAX + 1)) {
            *big = 1;
            *iv = 0;
            *dv = 0;
            return OK;
        }
        *big = 0;
        *iv = neg ? (int64_t)(0 - m) : (int64_t)m;
        *dv = (double)*iv;
        return OK;
    }
    *is_int = 0;
    *big = 0;
    /* Clinger's fast path: exact mantissa and power of ten, one rounding */
    if (fm_ok && fm < (1ULL << 53)) {
        int e = exp10 - frac_digits;
        double d = (double)fm;
        if (e >= 0 && e <= 22) { d = d * POW10[e]; *dv = neg ? -d : d; return OK; }
        if (e < 0 && e >= -22) { d = d / POW10[-e]; *dv = neg ? -d : d; return OK; }
    }
#if defined(__x86_64__) || defined(__i386__)
    /* Up to 19 significant digits and a power of ten exact in x87's 64-bit mantissa: one rounding
     * to 64 bits, then one to 53; the two give the correctly rounded double unless the first
     * lands exactly on a midpoint between two doubles (then strtod decides). */
    if (fm_ok) {
        int e = exp10 - frac_digits;
        if (e >= -27 && e <= 27) {
            long double p10 = POW10L[e < 0 ? -e : e];
            long double q = e < 0 ? (long double)fm / p10 : (long double)fm * p10;
            uint64_t mant;  /* x87 extended: the 64-bit significand (explicit leading 1) comes first */
            memcpy(&mant, &q, 8);
            if (fm == 0 || (mant & 0x7FF) != 0x400) {
                double d = (double)q;
                *dv = neg ? -d : d;
                return OK;
            }
        }
    }
#endif
    size_t n = (size_t)(p - start);
    char small[64];
    char *tmp = n < sizeof(small) ? small : (char *)malloc(n + 1);
    if (!tmp) return ERR;
    memcpy(tmp, start, n);
    tmp[n] = 0;
    double d;
    int bad = !c_strtod(tmp, n, &d);
    if (tmp != small) free(tmp);
    if (bad || isinf(d)) return BAD;  /* msgspec and Python differ on out-of-range floats: not our subset */
    *dv = d;
    return OK;
}

static int skip_value(Cur *c, int depth);

/* A number whose value is not needed (arguments nobody reads): the grammar only. */
static int skip_number(Cur *c) {
    const char *p = c->p, *end = c->end;
    if (p < end && *p == '-') p++;
    if (p >= end) return c->final ? BAD : MORE;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < end && *p >= '0' && *p <= '9') p++; }
    else return BAD;
    if (p < end && *p == '.') {
        const char *f0 = ++p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == f0) return (p >= end && !c->final) ? MORE : BAD;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const char *e0 = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == e0) return (p >= end && !c->final) ? MORE : BAD;
    }
    if (p >= end && !c->final) return MORE;
    c->p = p;
    return OK;
}

static int skip_literal(Cur *c, const char *lit, size_t n) {
    size_t avail = (size_t)(c->end - c->p);
    if (avail < n) {
        if (memcmp(c->p, lit, avail) != 0) return BAD;
        return c->final ? BAD : MORE;
    }
    if (memcmp(c->p, lit, n) != 0) return BAD;
    c->p += n;
    return OK;
}

static int skip_value(Cur *c, int depth) {
    if (depth > 200) return BAD;
    skip_ws(c);
    if (c->p >= c->end) return MORE;
    char ch = *c->p;
    int r;
    if (ch == '"') {
        const char *s; size_t n; int esc;
        return scan_string(c, &s, &n, &esc);
    }
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->p++;
        skip_ws(c);
        if (c->p >= c->end) return MORE;
        if (*c->p == close) { c->p++; return OK; }
        for (;;) {
            if (close == '}') {
                skip_ws(c);
                if (c->p >= c->end) return MORE;
                if (*c->p != '"') return BAD;
                const char *s; size_t n; int esc;
                if ((r = scan_string(c, &s, &n, &esc)) != OK) return r;
                skip_ws(c);
                if (c->p >= c->end) return MORE;
                if (*c->p != ':') return BAD;
                c->p++;
            }
            if ((r = skip_value(c, depth + 1)) != OK) return r;
            skip_ws(c);
            if (c->p >= c->end) return MORE;
            if (*c->p == ',') { c->p++; continue; }
            if (*c->p == close) { c->p++; return OK; }
            return BAD;
        }
    }
    if (ch == 't') return skip_literal(c, "true", 4);
    if (ch == 'f') return skip_literal(c, "false", 5);
    if (ch == 'n') return skip_literal(c, "null", 4);
    if (ch == '-' || (ch >= '0' && ch <= '9')) return skip_number(c);
    return BAD;
}

/* ------------------------------------------------------------------------------------------ */
/* values of a known type */

/* Whitespace up to the next value: MORE when the buffer ends first. */
static inline int next_value(Cur *c) {
    skip_ws(c);
    return c->p < c->end ? OK : MORE;
}

/* A number token at c->p (anything else: BAD, msgspec's type error). */
static int number_token(Cur *c, int *is_int, int64_t *iv, int *big, double *dv) {
    char ch = *c->p;
    if (!(ch == '-' || (ch >= '0' && ch <= '9'))) return BAD;
    return scan_number(c, is_int, iv, big, dv);
}

static inline int key_is(const char *s, size_t n, const char *lit) {
    size_t m = strlen(lit);
    return n == m && memcmp(s, lit, m) == 0;
}

static int open_object(Cur *c, int *empty) {
    skip_ws(c);
    if (c->p >= c->end) return MORE;
    if (*c->p != '{') return BAD;
    c->p++;
    skip_ws(c);
    if (c->p >= c->end) return MORE;
    *empty = *c->p == '}';
    if (*empty) c->p++;
    return OK;
}

/* A member's key (without escapes: the keys read here have none) and its `:`. */
static int read_key(Cur *c, const char **ks, size_t *kn) {
    skip_ws(c);
    if (c->p >= c->end) return MORE;
    if (*c->p != '"') return BAD;
    int kesc, r;
    if ((r = scan_string(c, ks, kn, &kesc)) != OK) return r;
    if (kesc) return BAD;
    skip_ws(c);
    if (c->p >= c->end) return MORE;
    if (*c->p != ':') return BAD;
    c->p++;
    return OK;
}

/* After a member: `,` (*more = 1) or the object's `}` (*more = 0). */
static int after_member(Cur *c, int *more) {
    skip_ws(c);
    if (c->p >= c->end) return MORE;
    if (*c->p == ',') { c->p++; *more = 1; return OK; }
    if (*c->p == '}') { c->p++; *more = 0; return OK; }
    return BAD;
}

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

static PyObject *Unsupported;

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
        if (r != OK) return r;
        if ((r = after_member(c, &more)) != OK) return r;
    }
    return OK;
}

enum { K_PH, K_TS, K_ID, K_CAT, K_DUR, K_PID, K_TID, K_NAME, K_ARGS };

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
        int k = -1;
        switch (kn) {
        case 2:
            if (ks[0] == 'p' && ks[1] == 'h') k = K_PH;
            else if (ks[0] == 't' && ks[1] == 's') k = K_TS;
            else if (ks[0] == 'i' && ks[1] == 'd') k = K_ID;
            break;
        case 3:
            if (key_is(ks, kn, "cat")) k = K_CAT;
            else if (key_is(ks, kn, "dur")) k = K_DUR;
            else if (key_is(ks, kn, "pid")) k = K_PID;
            else if (key_is(ks, kn, "tid")) k = K_TID;
            break;
        case 4:
            if (key_is(ks, kn, "name")) k = K_NAME;
            else if (key_is(ks, kn, "args")) k = K_ARGS;
            break;
        }
        if (k >= 0) {
            if (seen & (1u << k)) return BAD;
            seen |= 1u << k;
        }
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
        if (r != OK) return r;
        if ((r = after_member(c, &more)) != OK) return r;
    }
    return OK;
}

static int grow(Scanner *S) {
    size_t cap = S->cap ? S->cap * 2 : 8192;
    for (int i = 0; i < N_SCOLS; i++) {
        char *d = (char *)PyMem_RawRealloc(S->cols[i], cap * SCOL_SIZE[i]);
        if (!d) return ERR;
        S->cols[i] = d;
    }
    S->cap = cap;
    return OK;
}

static int append(Scanner *S, Ev *ev) {
    if (S->n == S->cap && grow(S) != OK) { PyErr_NoMemory(); return ERR; }
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
        skip_ws(&c);
        if (c.p >= c.end) { done = c.p; r = MORE; break; }
        char ch = *c.p;
        if (ch == ']' && S->state != 2) {
            c.p++;
            done = c.p;
            S->ended = 1;
            break;
        }
        if (S->state == 1) {
            if (ch != ',') { r = BAD; break; }
            c.p++;
            S->state = 2;
            done = c.p;
            continue;
        }
        if (ch != '{') { r = BAD; break; }
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
    if (r == ERR) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return NULL;
    }
    if (r == BAD || (r == MORE && final)) {
        PyErr_Format(Unsupported, "event at byte %zd of the buffer is not in the partition scanner's subset", pos);
        return NULL;
    }
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
    C_LOCALE = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (!C_LOCALE) { PyErr_SetString(PyExc_OSError, "cannot create the C locale"); return NULL; }
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Unsupported = PyErr_NewException("zoomer_ar.surgery._partscan.Unsupported", PyExc_ValueError, NULL);
    if (!Unsupported || PyModule_AddObject(m, "Unsupported", Unsupported) < 0) return NULL;
    Py_INCREF(Unsupported);
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType) < 0) return NULL;
    return m;
}
