/* Dense codes of one integer column, and how often each distinct value occurs in the train
 * rows: the counting and the lookup of the feature fit in a single pass over the column.
 *
 * Each value (64 bits: a hash's 8-byte key or an integer field) goes through an
 * open-addressing table (linear probing, Fibonacci hashing, at most half full, doubled as it
 * fills) that gives it a dense index in order of first appearance. A row's code is that index
 * + 1, or 0 where the value is missing, so an encoding is one gather through a table whose
 * entry 0 answers "missing". Criteo's values are Zipf-distributed: the hot ones stay in cache.
 */
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    uint64_t key;
    int32_t index; /* -1: empty */
} slot_t;

static inline uint64_t slot_of(uint64_t key, int bits) {
    return (key * 0x9E3779B97F4A7C15ULL) >> (64 - bits);
}

static int grow(slot_t **table, int *bits, const uint64_t *distinct, int64_t used) {
    const int nbits = *bits + 1;
    const uint64_t size = 1ULL << nbits, mask = size - 1;
    slot_t *t = malloc(size * sizeof(slot_t));
    if (!t) return -1;
    for (uint64_t i = 0; i < size; i++) t[i].index = -1;
    for (int64_t d = 0; d < used; d++) {
        uint64_t s = slot_of(distinct[d], nbits);
        while (t[s].index >= 0) s = (s + 1) & mask;
        t[s].key = distinct[d];
        t[s].index = (int32_t)d;
    }
    free(*table);
    *table = t;
    *bits = nbits;
    return 0;
}

/* Code values[0, n) (valid[i] == 0 marks a missing value; valid may be NULL: none missing).
 *
 * codes: [n] int32 out, 0 = missing, else 1 + the value's index in distinct; row i's code
 *     goes to codes[dest[i]] (dest: a permutation of [0, n), or NULL for codes[i]), so that
 *     rows come out grouped by split without another pass.
 * distinct: [n] out, the distinct values in order of first appearance (the first d used).
 * counts: [n] int64 out, per distinct value its number of rows with train[i] != 0.
 * train_missing: out, the number of train rows whose value is missing.
 *
 * Returns d, the number of distinct values, -1 when memory runs out, -2 when dest points
 * outside [0, n).
 */
int64_t code_column(const uint64_t *values, const uint8_t *valid, const uint8_t *train,
                    const int32_t *dest, int64_t n, int32_t *codes, uint64_t *distinct, int64_t *counts,
                    int64_t *train_missing) {
    int bits = 11;
    slot_t *table = NULL;
    if (grow(&table, &bits, distinct, 0)) return -1;
    uint64_t mask = (1ULL << bits) - 1;
    int64_t used = 0, missing = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t out = dest ? dest[i] : i;
        if (out < 0 || out >= n) {
            free(table);
            return -2;
        }
        if (valid && !valid[i]) {
            codes[out] = 0;
            missing += train[i] != 0;
            continue;
        }
        const uint64_t key = values[i];
        uint64_t s = slot_of(key, bits);
        int32_t index;
        for (;;) {
            index = table[s].index;
            if (index < 0 || table[s].key == key) break;
            s = (s + 1) & mask;
        }
        if (index < 0) {
            index = (int32_t)used;
            table[s].key = key;
            table[s].index = index;
            distinct[used] = key;
            counts[used] = 0;
            used++;
            if ((uint64_t)used * 2 > mask) { /* keep the table at most half full */
                if (grow(&table, &bits, distinct, used)) {
                    free(table);
                    return -1;
                }
                mask = (1ULL << bits) - 1;
            }
        }
        codes[out] = index + 1;
        counts[index] += train[i] != 0;
    }
    free(table);
    *train_missing = missing;
    return used;
}

/* out[i] = table[codes[i]] for 4-byte answers (int32 ids, float32 model values): the encoding
 * of a coded column. codes index table directly (int32, no widening copy as numpy's take
 * makes); the caller guarantees 0 <= codes[i] < the table's length, as code_column's are. */
void gather4(const uint32_t *table, const int32_t *codes, int64_t n, uint32_t *out) {
    for (int64_t i = 0; i < n; i++) out[i] = table[codes[i]];
}
