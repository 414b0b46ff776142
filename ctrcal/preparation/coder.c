/* Dense codes of one column, kept across chunks, and how often each distinct value occurs in
 * the train rows: the counting and the lookup of the feature fit in one pass over each chunk.
 *
 * Each value (64 bits: a hash read base 16, or the bits of a float64 number) goes through an
 * open-addressing table (linear probing, Fibonacci hashing, at most half full, doubled as it
 * fills) that gives it a dense index in order of first appearance over all chunks coded so
 * far. A row's code is that index + 1, or 0 where the value is missing, so an encoding is one
 * gather through a table whose entry 0 answers "missing". Criteo's values are Zipf-distributed:
 * the hot ones stay in cache.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t key;
    int32_t index;  /* -1: empty */
    uint32_t count; /* train rows with this value since the last fold (beside the key: one cache
                       miss per lookup, in a 16-byte slot) */
} slot_t;

typedef struct {
    slot_t *table;
    int bits;
    int64_t used, capacity;
    uint64_t *distinct; /* [capacity] values in order of first appearance */
    uint64_t *totals;   /* [capacity] or NULL: the counts folded so far */
    int64_t since_fold; /* rows coded since the last fold: no slot's count is above it */
    int64_t fold_at;    /* fold before this many rows (at most 2^32 - 1: no count wraps) */
    int64_t train_missing;
} coder_t;

enum { KEYS64 = 0, KEYS32 = 1, NUMBERS = 2 };

static inline uint64_t slot_of(uint64_t key, int bits) {
    return (key * 0x9E3779B97F4A7C15ULL) >> (64 - bits);
}

static int grow_table(coder_t *c) {
    const int nbits = c->bits + 1;
    const uint64_t size = 1ULL << nbits, mask = size - 1;
    slot_t *t = malloc(size * sizeof(slot_t));
    if (!t) return -1;
    for (uint64_t i = 0; i < size; i++) t[i].index = -1;
    if (c->table) {
        const uint64_t old = 1ULL << c->bits;
        for (uint64_t i = 0; i < old; i++) {
            if (c->table[i].index < 0) continue;
            uint64_t s = slot_of(c->table[i].key, nbits);
            while (t[s].index >= 0) s = (s + 1) & mask;
            t[s] = c->table[i];
        }
    }
    free(c->table);
    c->table = t;
    c->bits = nbits;
    return 0;
}

static int grow_arrays(coder_t *c) {
    const int64_t cap = c->capacity ? 2 * c->capacity : 1024;
    uint64_t *d = realloc(c->distinct, (size_t)cap * sizeof(uint64_t));
    if (!d) return -1;
    c->distinct = d;
    if (c->totals) {
        uint64_t *t = realloc(c->totals, (size_t)cap * sizeof(uint64_t));
        if (!t) return -1;
        memset(t + c->capacity, 0, (size_t)(cap - c->capacity) * sizeof(uint64_t));
        c->totals = t;
    }
    c->capacity = cap;
    return 0;
}

/* Move every slot's count into the 64-bit totals (made on first need). */
static int fold(coder_t *c) {
    if (!c->totals) {
        c->totals = calloc((size_t)c->capacity, sizeof(uint64_t));
        if (!c->totals) return -1;
    }
    const uint64_t size = 1ULL << c->bits;
    for (uint64_t s = 0; s < size; s++) {
        if (c->table[s].index < 0) continue;
        c->totals[c->table[s].index] += c->table[s].count;
        c->table[s].count = 0;
    }
    c->since_fold = 0;
    return 0;
}

void coder_free(coder_t *c) {
    if (!c) return;
    free(c->table);
    free(c->distinct);
    free(c->totals);
    free(c);
}

/* A new coder whose slot counts are folded into 64-bit totals every fold_at rows (at most
 * 2^32 - 1; fewer exercise the folding in tests). */
coder_t *coder_new(int64_t fold_at) {
    if (fold_at < 1 || fold_at > (int64_t)UINT32_MAX) return NULL;
    coder_t *c = calloc(1, sizeof(coder_t));
    if (!c) return NULL;
    c->fold_at = fold_at;
    c->bits = 9; /* grown to 10 bits at once */
    if (grow_table(c) || grow_arrays(c)) {
        coder_free(c);
        return NULL;
    }
    return c;
}

static int64_t code_rows(coder_t *c, const void *values, int kind, const uint8_t *valid,
                         const uint8_t *train, int64_t lo, int64_t hi, int32_t *const *outs,
                         const int64_t *lens, int64_t nseg, const int64_t *at) {
    slot_t *table = c->table; /* locals: the stores below cannot change them behind our back */
    int bits = c->bits;
    uint64_t mask = (1ULL << bits) - 1;
    int64_t missing = 0;
    for (int64_t i = lo; i < hi; i++) {
        const uint32_t counted = train && train[i];
        const int64_t seg = at ? at[i] >> 32 : 0, pos = at ? at[i] & 0xFFFFFFFF : i;
        if (seg >= nseg || pos >= lens[seg]) return -2;
        int32_t *const to = outs[seg] + pos;
        if (valid && !valid[i]) {
            *to = 0;
            missing += counted;
            continue;
        }
        uint64_t key;
        if (kind == KEYS32) {
            key = ((const uint32_t *)values)[i];
        } else if (kind == NUMBERS) {
            double x = ((const double *)values)[i] + 0.0;
            memcpy(&key, &x, sizeof key);
        } else {
            key = ((const uint64_t *)values)[i];
        }
        uint64_t s = slot_of(key, bits);
        while (table[s].index >= 0 && table[s].key != key) s = (s + 1) & mask;
        if (table[s].index < 0) {
            if (c->used >= INT32_MAX - 1) return -1;
            if (c->used == c->capacity && grow_arrays(c)) return -1;
            const int32_t index = (int32_t)c->used++;
            table[s].key = key;
            table[s].index = index;
            table[s].count = 0;
            c->distinct[index] = key;
            if ((uint64_t)c->used * 2 > mask) { /* keep the table at most half full */
                if (grow_table(c)) return -1;
                table = c->table;
                bits = c->bits;
                mask = (1ULL << bits) - 1;
                s = slot_of(key, bits);
                while (table[s].key != key) s = (s + 1) & mask;
            }
        }
        *to = table[s].index + 1;
        table[s].count += counted;
    }
    c->train_missing += missing;
    return 0;
}

/* Code values[0, n) (valid[i] == 0 marks a missing value; valid may be NULL: none missing):
 * 0 = missing, else 1 + the value's index among the distinct values seen so far; counting the
 * rows with train[i] != 0 per value (train may be NULL: none). Row i's code goes to
 * outs[at[i] >> 32][at[i] & 0xFFFFFFFF] (nseg segments of lens[...] codes; at may be NULL:
 * outs[0][i]). The values are kind's: 64-bit keys (KEYS64), 32-bit keys (KEYS32, Criteo's
 * hashes: coded as the same number in 64 bits), or float64 numbers (NUMBERS) coded by their
 * bits with -0.0 made 0.0 first (x + 0.0), so that equal numbers have equal codes.
 *
 * Returns the number of distinct values so far; -1 when memory runs out (the coder is then
 * unusable) or a code would pass INT32_MAX, -2 when a position is outside its segment. */
int64_t coder_code(coder_t *c, const void *values, int kind, const uint8_t *valid,
                   const uint8_t *train, int64_t n, int32_t *const *outs, const int64_t *lens,
                   int64_t nseg, const int64_t *at) {
    for (int64_t lo = 0; lo < n;) { /* in pieces after which no slot's count can wrap */
        if (c->since_fold == c->fold_at && fold(c)) return -1;
        const int64_t hi = lo + (n - lo < c->fold_at - c->since_fold ? n - lo
                                                                      : c->fold_at - c->since_fold);
        const int64_t err =
            code_rows(c, values, kind, valid, train, lo, hi, outs, lens, nseg, at);
        if (err) return err;
        c->since_fold += hi - lo;
        lo = hi;
    }
    return c->used;
}

/* The first d distinct values and their train counts (d <= the number seen). */
void coder_state(const coder_t *c, int64_t d, uint64_t *distinct, int64_t *counts,
                 int64_t *train_missing) {
    for (int64_t i = 0; i < d; i++) distinct[i] = c->distinct[i];
    const uint64_t size = 1ULL << c->bits;
    for (uint64_t s = 0; s < size; s++) {
        const int64_t index = c->table[s].index;
        if (index >= 0 && index < d)
            counts[index] = (int64_t)(c->table[s].count + (c->totals ? c->totals[index] : 0));
    }
    *train_missing = c->train_missing;
}

/* out[j * out_stride + i] = tables[j][codes[j * stride + i]] for the f columns j < f and rows
 * i < n, with 4-byte answers (int32 ids, float32 model values): the encoding of n rows of coded
 * columns, straight into the writer's buffers. The caller guarantees 0 <= each code < its
 * table's length. */
void gather_columns(int64_t f, const uint32_t *const *tables, const int32_t *codes,
                    int64_t stride, int64_t n, uint32_t *out, int64_t out_stride) {
    for (int64_t j = 0; j < f; j++) {
        const uint32_t *table = tables[j];
        const int32_t *c = codes + j * stride;
        uint32_t *o = out + j * out_stride;
        for (int64_t i = 0; i < n; i++) o[i] = table[c[i]];
    }
}

/* XXH64, xxHash's 64-bit function (Yann Collet, https://github.com/Cyan4973/xxHash, its
 * specification doc/xxhash_spec.md): the key of a string categorical is XXH64 of the value's
 * UTF-8 bytes with seed 0. A fixed, published function, so that prepared vocabularies stay
 * valid whatever library versions read them later. Reads are little-endian, as the
 * specification defines them, on any machine. */
#define XXH_P1 0x9E3779B185EBCA87ULL
#define XXH_P2 0xC2B2AE3D27D4EB4FULL
#define XXH_P3 0x165667B19E3779F9ULL
#define XXH_P4 0x85EBCA77C2B2AE63ULL
#define XXH_P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline uint32_t read_le32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline uint64_t xxh64_round(uint64_t acc, uint64_t input) {
    return rotl64(acc + input * XXH_P2, 31) * XXH_P1;
}

static inline uint64_t xxh64_merge(uint64_t acc, uint64_t lane) {
    return (acc ^ xxh64_round(0, lane)) * XXH_P1 + XXH_P4;
}

static uint64_t xxh64(const uint8_t *p, uint64_t len, uint64_t seed) {
    const uint8_t *const end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = seed + XXH_P1 + XXH_P2, v2 = seed + XXH_P2, v3 = seed, v4 = seed - XXH_P1;
        do {
            v1 = xxh64_round(v1, read_le64(p));
            v2 = xxh64_round(v2, read_le64(p + 8));
            v3 = xxh64_round(v3, read_le64(p + 16));
            v4 = xxh64_round(v4, read_le64(p + 24));
            p += 32;
        } while (end - p >= 32);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xxh64_merge(h, v1);
        h = xxh64_merge(h, v2);
        h = xxh64_merge(h, v3);
        h = xxh64_merge(h, v4);
    } else {
        h = seed + XXH_P5;
    }
    h += len;
    for (; end - p >= 8; p += 8) h = rotl64(h ^ xxh64_round(0, read_le64(p)), 27) * XXH_P1 + XXH_P4;
    if (end - p >= 4) {
        h = rotl64(h ^ (uint64_t)read_le32(p) * XXH_P1, 23) * XXH_P2 + XXH_P3;
        p += 4;
    }
    for (; p < end; p++) h = rotl64(h ^ (uint64_t)*p * XXH_P5, 11) * XXH_P1;
    h ^= h >> 33;
    h *= XXH_P2;
    h ^= h >> 29;
    h *= XXH_P3;
    h ^= h >> 32;
    return h;
}

/* The Arrow C data interface (arrow.apache.org/docs/format/CDataInterface.html): what
 * polars exports through the Arrow PyCapsule interface, read here without pyarrow. */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

struct ArrowArrayStream {
    int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *);
    int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *);
    const char *(*get_last_error)(struct ArrowArrayStream *);
    void (*release)(struct ArrowArrayStream *);
    void *private_data;
};

enum { VIEWS = 0, OFFSETS64 = 1, OFFSETS32 = 2 };

/* out[i] = XXH64 (seed 0) of string i of one Arrow array of kind (string views: 16-byte
 * views, a string of at most 12 bytes inline, a longer one in a data buffer at an offset; or
 * 64- / 32-bit offsets into one data buffer); 0 where its validity bitmap marks it null. */
static void hash_array(const struct ArrowArray *a, int kind, uint64_t *out) {
    const uint8_t *validity = a->null_count != 0 ? (const uint8_t *)a->buffers[0] : NULL;
    const uint8_t *body = (const uint8_t *)a->buffers[1];
    const uint8_t *const *data = (const uint8_t *const *)a->buffers + 2;
    for (int64_t i = 0; i < a->length; i++) {
        const int64_t j = a->offset + i;
        if (validity && !((validity[j >> 3] >> (j & 7)) & 1)) {
            out[i] = 0;
            continue;
        }
        const uint8_t *text;
        uint64_t len;
        if (kind == VIEWS) {
            int32_t n, buffer, at; /* the view's fields, in the machine's byte order */
            memcpy(&n, body + 16 * j, 4);
            memcpy(&buffer, body + 16 * j + 8, 4);
            memcpy(&at, body + 16 * j + 12, 4);
            text = n <= 12 ? body + 16 * j + 4 : data[buffer] + at;
            len = (uint64_t)n;
        } else if (kind == OFFSETS64) {
            int64_t lo, hi;
            memcpy(&lo, body + 8 * j, 8);
            memcpy(&hi, body + 8 * j + 8, 8);
            text = data[0] + lo;
            len = (uint64_t)(hi - lo);
        } else {
            int32_t lo, hi;
            memcpy(&lo, body + 4 * j, 4);
            memcpy(&hi, body + 4 * j + 4, 4);
            text = data[0] + lo;
            len = (uint64_t)(hi - lo);
        }
        out[i] = xxh64(text, len, 0);
    }
}

/* out[i] = XXH64 (seed 0) of the UTF-8 bytes of string i of an Arrow stream of strings
 * (string views, large strings or strings: formats "vu", "U", "u"), 0 where it is null; the
 * stream's arrays are released as they are read, the stream itself is left to its owner.
 * Returns the number of strings (at most n); -1: not a stream of strings, or it failed; -2:
 * more than n strings. */
int64_t hash_string_stream(struct ArrowArrayStream *stream, uint64_t *out, int64_t n) {
    struct ArrowSchema schema;
    if (stream->get_schema(stream, &schema)) return -1;
    const char *f = schema.format;
    const int kind = !strcmp(f, "vu") ? VIEWS : !strcmp(f, "U") ? OFFSETS64
                                              : !strcmp(f, "u") ? OFFSETS32 : -1;
    schema.release(&schema);
    if (kind < 0) return -1;
    int64_t done = 0;
    for (;;) {
        struct ArrowArray a;
        if (stream->get_next(stream, &a)) return -1;
        if (!a.release) return done; /* the end of the stream */
        if (a.length > n - done) {
            a.release(&a);
            return -2;
        }
        hash_array(&a, kind, out + done);
        done += a.length;
        a.release(&a);
    }
}
