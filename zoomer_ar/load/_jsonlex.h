/* Zoomer AR: the JSON lexer shared by the compiled event reader (zoomer_ar/load/_fastjson.c) and
 * the partition's event scanner (zoomer_ar/surgery/_partscan.c), kept in one place so that both
 * read strings, escapes, numbers, literals and nesting exactly alike.
 *
 * What it holds: growable buffers (Buf), an intern table of raw JSON tokens (Intern), a cursor
 * over a buffer (Cur) and the helpers that read or skip one JSON token at the cursor: strings
 * (with strict UTF-8 checks, as CPython's decoder), numbers (int64, or a correctly rounded double
 * independent of the process locale), literals, whole values (nesting up to a fixed depth), an
 * object's `{`, a member's key and `:`, what follows a member, an event's keys and the steps
 * between the events of the `traceEvents` array. Each returns OK, MORE (ran
 * off the buffer: feed more), BAD (not read here: the caller falls back to msgspec) or ERR.
 *
 * Use: `#define _GNU_SOURCE` and `#define PY_SSIZE_T_CLEAN`, `#include <Python.h>`, then this
 * header, in each extension's one .c file (everything here is `static`: each extension gets its
 * own copy, so nothing is exported). The module's PyInit calls lexer_module, which sets C_LOCALE
 * (numbers are read in the C locale) and creates the module's Unsupported exception. The helpers take no GIL and touch
 * no Python object (memory comes from PyMem_Raw*), so they run with the GIL released; all but
 * the last part's (feed_failed, lexer_module).
 * setup.py lists this header in both Extensions' `depends`, so a change here rebuilds both.
 */
#ifndef ZOOMER_JSONLEX_H
#define ZOOMER_JSONLEX_H

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

/* ------------------------------------------------------------------------------------------ */
/* the lexer: a cursor over a buffer and the tokens read or skipped at it */

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

/* An object's `{`; *empty when `}` follows at once (consumed). */
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
/* an event object and the `traceEvents` array */

/* After a member's value, read with result r: r unless OK, else after_member's (`,`: *more). */
static inline int member_end(Cur *c, int r, int *more) {
    return r != OK ? r : after_member(c, more);
}

/* Doubles the capacity of the n columns cols[i] of sizes[i] bytes a row (from `first` rows when
 * empty). ERR: out of memory (no error set; *cap unchanged, the columns that grew keep their rows). */
static int grow_columns(char **cols, const size_t *sizes, int n, size_t *cap, size_t first) {
    size_t c = *cap ? *cap * 2 : first;
    for (int i = 0; i < n; i++) {
        char *d = (char *)PyMem_RawRealloc(cols[i], c * sizes[i]);
        if (!d) return ERR;
        cols[i] = d;
    }
    *cap = c;
    return OK;
}

/* Marks member k (>= 0) of an object seen; 0 when it was seen before (a duplicate key: msgspec
 * keeps the last, these readers stop with BAD). k < 0 (a key not tracked): 1. */
static inline int first_key(uint32_t *seen, int k) {
    if (k < 0) return 1;
    if (*seen & (1u << k)) return 0;
    *seen |= 1u << k;
    return 1;
}

enum { K_PH, K_TS, K_ID, K_CAT, K_DUR, K_PID, K_TID, K_NAME, K_ARGS };

/* The event key a reader decides on (K_*), -1 for any other; `with_id`: `id` is one (the
 * partition's flows), else it is any other key. */
static inline int event_key(const char *ks, size_t kn, int with_id) {
    switch (kn) {
    case 2:
        if (ks[0] == 'p' && ks[1] == 'h') return K_PH;
        if (ks[0] == 't' && ks[1] == 's') return K_TS;
        if (with_id && ks[0] == 'i' && ks[1] == 'd') return K_ID;
        break;
    case 3:
        if (key_is(ks, kn, "cat")) return K_CAT;
        if (key_is(ks, kn, "dur")) return K_DUR;
        if (key_is(ks, kn, "pid")) return K_PID;
        if (key_is(ks, kn, "tid")) return K_TID;
        break;
    case 4:
        if (key_is(ks, kn, "name")) return K_NAME;
        if (key_is(ks, kn, "args")) return K_ARGS;
        break;
    }
    return -1;
}

enum { AT_EVENT = 4 };  /* array_next: an event's `{` is at the cursor */

/* Moves through a `traceEvents` array to its next event: past whitespace and the `,` after an
 * event (*state: 0 before an event or `]`, 1 after an event, 2 after `,`). AT_EVENT: an event's
 * `{` is at c->p; OK: the array's `]` was read (*ended = 1); MORE or BAD. *done: where a caller
 * resumes (after the last whole event, separator or the `]`). */
static inline int array_next(Cur *c, int *state, int *ended, const char **done) {
    for (;;) {
        skip_ws(c);
        if (c->p >= c->end) { *done = c->p; return MORE; }
        char ch = *c->p;
        if (ch == ']' && *state != 2) {
            c->p++;
            *done = c->p;
            *ended = 1;
            return OK;
        }
        if (*state == 1) {
            if (ch != ',') return BAD;
            c->p++;
            *state = 2;
            *done = c->p;
            continue;
        }
        if (ch != '{') return BAD;
        return AT_EVENT;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* the extension module (GIL held) */

static PyObject *Unsupported;  /* the module's exception: an event its reader does not read */

/* After a feed's loop: the error of its result r, set and 1, else 0. ERR: the error set (or out
 * of memory); BAD, or MORE of a final buffer: Unsupported, naming the byte. */
static int feed_failed(int r, int final, Py_ssize_t pos, const char *of, const char *reader) {
    if (r == ERR) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return 1;
    }
    if (r == BAD || (r == MORE && final)) {
        PyErr_Format(Unsupported, "event at byte %zd of the %s is not in the %s's subset", pos, of, reader);
        return 1;
    }
    return 0;
}

/* The module of `def` (its PyInit): sets C_LOCALE, readies `type` and adds it as `type_name`,
 * creates Unsupported (a ValueError named `unsupported_name`) and adds it. NULL: the error set. */
static PyObject *lexer_module(PyModuleDef *def, PyTypeObject *type, const char *type_name,
                              const char *unsupported_name) {
    C_LOCALE = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (!C_LOCALE) { PyErr_SetString(PyExc_OSError, "cannot create the C locale"); return NULL; }
    if (PyType_Ready(type) < 0) return NULL;
    PyObject *m = PyModule_Create(def);
    if (!m) return NULL;
    Unsupported = PyErr_NewException(unsupported_name, PyExc_ValueError, NULL);
    if (!Unsupported || PyModule_AddObject(m, "Unsupported", Unsupported) < 0) return NULL;
    Py_INCREF(Unsupported);
    Py_INCREF(type);
    if (PyModule_AddObject(m, type_name, (PyObject *)type) < 0) return NULL;
    return m;
}

#endif  /* ZOOMER_JSONLEX_H */
