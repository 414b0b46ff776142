/* Criteo's delimited layout (an optional label, integer fields, 8-hex-digit hashes, one
 * record per '\n' line, fields separated by one byte) parsed straight into columns.
 *
 * Only the clean form is accepted: integer fields spelled -?[0-9]{1,18} or empty, hash fields
 * of exactly 8 hex digits or empty, the layout's number of fields on every line -- or fewer
 * on a ragged row that ends within its hash fields (published Criteo samples drop trailing
 * empty fields), whose missing fields are missing, as the general reader pads them. Any
 * other line makes tsv_parse return its index (as -1 - index), and the caller reads the file
 * the general way instead; nothing here decides what an unusual line means.
 */
#include <stdint.h>
#include <string.h>

/* Number of records in buf[0, len): its '\n' count, plus one for a last line without one. */
int64_t tsv_count_rows(const char *buf, int64_t len) {
    int64_t rows = 0;
    const char *p = buf, *end = buf + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        rows++;
        if (!nl) break;
        p = nl + 1;
    }
    return rows;
}

#define ONES 0x0101010101010101ULL
#define HIGH 0x8080808080808080ULL

static inline uint64_t load8(const unsigned char *p) {
    uint64_t x = 0;
    for (int i = 0; i < 8; i++) x |= (uint64_t)p[i] << (8 * i); /* one load on little-endian */
    return x;
}

/* Per byte of x: the top bit set where the byte is in [lo, hi) (ASCII bytes only). Adding
 * (0x80 - bound) to a 7-bit byte sets its top bit exactly when it is >= bound, no carry. */
static inline uint64_t in_range(uint64_t x, unsigned lo, unsigned hi) {
    const uint64_t seven = x & ~HIGH;
    return (seven + ONES * (0x80 - lo)) & ~(seven + ONES * (0x80 - hi)) & ~x & HIGH;
}

static inline int all_hex(uint64_t x) {
    return (in_range(x, 0x30, 0x3A) | in_range(x, 0x41, 0x47) | in_range(x, 0x61, 0x67)) == HIGH;
}

/* The 8 hex digits of x (byte i = character i, checked by all_hex) read base 16, character 0
 * the most significant: a letter's nibble is its low 4 bits + 9. */
static inline uint64_t hex_value(uint64_t x) {
    const uint64_t letter = (in_range(x, 0x41, 0x47) | in_range(x, 0x61, 0x67)) >> 7;
    uint64_t nib = (x & 0x0F0F0F0F0F0F0F0FULL) + letter * 9;
    nib = ((nib & 0x000F000F000F000FULL) << 4) | ((nib >> 8) & 0x000F000F000F000FULL);
    nib = ((nib & 0x000000FF000000FFULL) << 8) | ((nib >> 16) & 0x000000FF000000FFULL);
    return ((nib & 0xFFFFULL) << 16) | ((nib >> 32) & 0xFFFFULL);
}

/* The value of the k (1..8) decimal digits in the low bytes of x, character 0 the most
 * significant: move them to the top bytes (zeros before them read as leading zeros), then
 * combine neighbouring digits, pairs and quads with three multiplications. */
static inline int64_t digits_value(uint64_t x, int k) {
    x = (x << (8 * (8 - k))) & 0x0F0F0F0F0F0F0F0FULL;
    x = (x * 10 + (x >> 8)) & 0x00FF00FF00FF00FFULL;
    x = (x * 100 + (x >> 16)) & 0x0000FFFF0000FFFFULL;
    return (int64_t)((x * 10000 + (x >> 32)) & 0xFFFFFFFFULL);
}

/* Parse the whole lines of buf[0, len) into rows first, first + 1, ... of the columns.
 *
 * nums: [nnum, stride] double (the label, if any, then the integer fields; exact as the
 * float reader reads them: the integer rounded once); nvalid: [nnum, stride] 0/1. cats:
 * [ncat, stride] uint32, each hash read base 16; cvalid: [ncat, stride] 0/1. An empty field
 * is invalid (value 0). Fields are separated by sep.
 *
 * Returns the number of rows parsed, or -1 - i when line i (0-based, within buf) is not clean.
 */
int64_t tsv_parse(const char *buf, int64_t len, int sep, int nnum, int ncat, int64_t stride,
                  int64_t first, double *nums, uint8_t *nvalid, uint32_t *cats,
                  uint8_t *cvalid) {
    const unsigned char *p = (const unsigned char *)buf, *end = p + len;
    int64_t line = 0;
    while (p < end) {
        const int64_t r = first + line;
        for (int f = 0; f < nnum; f++) {
            int neg = 0, digits = 0;
            int64_t v = 0;
            if (p < end && *p == '-') {
                neg = 1;
                p++;
            }
            uint64_t other = 0;
            if (end - p >= 8) {
                const uint64_t x = load8(p);
                other = ~in_range(x, 0x30, 0x3A) & HIGH; /* top bit of each non-digit byte */
                if (other) {
                    digits = __builtin_ctzll(other) >> 3;
                    if (digits) v = digits_value(x, digits);
                    p += digits;
                }
            }
            if (!other) { /* 8 or more digits, or near the end of the buffer */
                while (p < end && *p >= '0' && *p <= '9') {
                    v = v * 10 + (*p - '0');
                    p++;
                    if (++digits > 18) return -1 - line;
                }
            }
            if (p == end || *p != sep || (neg && !digits)) return -1 - line;
            p++;
            nums[(int64_t)f * stride + r] = (double)(neg ? -v : v);
            nvalid[(int64_t)f * stride + r] = digits != 0;
        }
        int present = ncat; /* hash fields on the line: fewer on a ragged row */
        for (int f = 0; f < ncat; f++) {
            const int last = f == ncat - 1;
            const unsigned char stop = last ? '\n' : (unsigned char)sep;
            uint64_t key = 0;
            int valid = 0;
            if (p < end && *p != stop) {
                if (end - p < 8 || !all_hex(key = load8(p))) {
                    if (!last && *p == '\n') { /* the line ends with this field, empty */
                        present = f;
                        break;
                    }
                    return -1 - line;
                }
                p += 8;
                valid = 1;
            }
            cats[(int64_t)f * stride + r] = valid ? (uint32_t)hex_value(key) : 0;
            cvalid[(int64_t)f * stride + r] = (uint8_t)valid;
            if (p < end ? *p != stop : !last) {
                if (!last && (p == end || *p == '\n')) { /* the line ends after this field */
                    present = f + 1;
                    break;
                }
                return -1 - line;
            }
            if (p < end) p++; /* a last line may end without '\n' */
        }
        if (present < ncat) { /* a ragged row: its last hash fields are missing, as the
                                 general reader pads them */
            for (int f = present; f < ncat; f++) {
                cats[(int64_t)f * stride + r] = 0;
                cvalid[(int64_t)f * stride + r] = 0;
            }
            if (p < end) p++;
        }
        line++;
    }
    return line;
}
