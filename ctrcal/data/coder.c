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
