/* Float32 matrix products of the lean forward on the CPU, for any number of rows M, memory-bound at small M.
 *
 * A float32 weight W [N, K] is packed into column blocks of 64 outputs, each block stored k-major:
 * packed[b][k][j] = W[64 b + j][k] (zero beyond N), so one block is one contiguous stream of K x 64 floats.
 * y[m][n] = sum_k x[m][k] W[n][k] then reads every weight exactly once per group of up to four rows: for each
 * k, 64 weights are loaded and multiplied into 64 accumulators per row. At M = 1 the product streams the
 * weights at memory speed; rows 2-4 ride on the same loads, so a pass over 2-4 tokens costs about what a
 * pass over one costs (BLAS kernels on this CPU charge 1.5x-2x for 2-3 rows).
 *
 * (GGUF block-quantised weights have their own products: blocks.c.)
 *
 * Every output is accumulated in a fixed order (k = 0, 1, ..., K-1) in its own accumulator, whatever M is
 * and wherever the row sits in the batch: a row's result does not depend on the other rows. That is what makes a verification pass give a token exactly the logits a plain
 * decoding step gives it.
 *
 * With OpenMP (native.py builds with -fopenmp where the compiler has it) the column blocks of a product are
 * shared among `threads` threads; each block, and so each output, is still computed by one thread in the
 * order above, so the results do not depend on the thread count either.
 *
 * Written with GCC/Clang vector extensions (a 16-float vector is one AVX-512 register, two AVX2 ones);
 * built by spec_fast/lean/native.py with the machine's C compiler (-O3 -march=native, fused multiply-add
 * allowed) and loaded with ctypes; nothing here depends on Python or torch.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#define BLOCK 64
#define LANES 16
#define VECS (BLOCK / LANES)

typedef float f32x16 __attribute__((vector_size(64), aligned(4)));

static inline f32x16 load16(const float *p) { f32x16 v; memcpy(&v, p, sizeof(v)); return v; }

static inline void store_rows(int rows, f32x16 acc[4][VECS], float *restrict y, int64_t ldy, int64_t width) {
    for (int r = 0; r < rows; ++r) {
        float out[BLOCK];
        memcpy(out, acc[r], sizeof(out));
        memcpy(y + r * ldy, out, (size_t)width * sizeof(float));
    }
}

static inline __attribute__((always_inline)) void f32_rows(int rows, const float *restrict x, int64_t ldx,
                                                           int64_t k_size, const float *restrict w,
                                                           float *restrict y, int64_t ldy, int64_t width) {
    f32x16 acc[4][VECS];
    memset(acc, 0, sizeof(acc));
    for (int64_t k = 0; k < k_size; ++k) {
        f32x16 wk[VECS];
        for (int c = 0; c < VECS; ++c) wk[c] = load16(w + k * BLOCK + c * LANES);
        for (int r = 0; r < rows; ++r) {
            const float xv = x[r * ldx + k];
            for (int c = 0; c < VECS; ++c) acc[r][c] += xv * wk[c];
        }
    }
    store_rows(rows, acc, y, ldy, width);
}

/* One instantiation per row count, so every loop has compile-time bounds. */
#define ROWS(NAME, R, T)                                                                                  \
    static void NAME##_##R(const float *restrict x, int64_t ldx, int64_t size, const T *restrict w,       \
                           float *restrict y, int64_t ldy, int64_t width) {                               \
        NAME##_rows(R, x, ldx, size, w, y, ldy, width);                                                    \
    }
ROWS(f32, 1, float)
ROWS(f32, 2, float)
ROWS(f32, 3, float)
ROWS(f32, 4, float)

#define DISPATCH(NAME, SIZE, W)                                                                           \
    switch (rows) {                                                                                       \
        case 1: NAME##_1(xm, ldx, SIZE, W, ym, ldy, width); break;                                        \
        case 2: NAME##_2(xm, ldx, SIZE, W, ym, ldy, width); break;                                        \
        case 3: NAME##_3(xm, ldx, SIZE, W, ym, ldy, width); break;                                        \
        default: NAME##_4(xm, ldx, SIZE, W, ym, ldy, width); break;                                       \
    }

/* y [M, ldy] (first n_size columns written) = x [M, K] (row stride ldx) times the packed float32 weight
 * [ceil(n_size / 64), K, 64], on up to `threads` threads. Each block (at most K x 256 bytes) stays in cache
 * while every group of four rows reads it. */
void spec_fast_mm_f32(const float *x, int64_t m_size, int64_t ldx, int64_t k_size, const float *packed,
                      int64_t n_size, float *y, int64_t ldy, int64_t threads) {
    const int64_t blocks = (n_size + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1 && blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
        const float *w = packed + b * k_size * BLOCK;
        const int64_t width = n_size - b * BLOCK < BLOCK ? n_size - b * BLOCK : BLOCK;
        for (int64_t m0 = 0; m0 < m_size; m0 += 4) {
            const int64_t rows = m_size - m0 < 4 ? m_size - m0 : 4;
            const float *xm = x + m0 * ldx;
            float *ym = y + m0 * ldy + b * BLOCK;
            DISPATCH(f32, k_size, w)
        }
    }
}

/* packed [ceil(n_size / 64), K, 64] = the float32 weight w [n_size, K] (row stride ldw) in the layout of
 * spec_fast_mm_f32, zeros beyond n_size. One block of 64 rows is read at a time, so the transposition stays in
 * cache (torch's strided copy of the same layout was ten times slower at model load). */
void spec_fast_pack_f32(const float *w, int64_t n_size, int64_t k_size, int64_t ldw, float *packed) {
    const int64_t blocks = (n_size + BLOCK - 1) / BLOCK;
    for (int64_t b = 0; b < blocks; ++b) {
        float *out = packed + b * k_size * BLOCK;
        const int64_t width = n_size - b * BLOCK < BLOCK ? n_size - b * BLOCK : BLOCK;
        for (int64_t k0 = 0; k0 < k_size; k0 += 64) {
            const int64_t k1 = k0 + 64 < k_size ? k0 + 64 : k_size;
            for (int64_t j = 0; j < BLOCK; ++j) {
                const float *row = w + (b * BLOCK + j) * ldw;
                for (int64_t k = k0; k < k1; ++k) {
                    out[k * BLOCK + j] = j < width ? row[k] : 0.f;
                }
            }
        }
    }
}

/* out[r] = the index of the first maximum of row r of x [rows, size] (row stride ldx, size >= 1): the lowest
 * index among equal maxima, a NaN counting as the maximum (the first NaN wins), as torch's max(dim).indices
 * and argmax. One sweep for the maximum, one for its first index: a few microseconds over a row of 49152
 * logits, where torch's reduction took about 45 us per row on one thread of a Zen 4 core (0.26 ms for the
 * five rows of a depth-4 chain, 0.9 ms for four such requests). */
void spec_fast_first_max(const float *x, int64_t rows, int64_t size, int64_t ldx, int64_t *out) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * ldx;
        int64_t j = 0, nan_at = -1;
        float best = row[0];
#if defined(__AVX512F__)
        if (size >= LANES) {
            __m512 most = _mm512_loadu_ps(row);
            __mmask16 nan = _mm512_cmp_ps_mask(most, most, _CMP_UNORD_Q);
            for (j = LANES; j + LANES <= size && !nan; j += LANES) {
                const __m512 v = _mm512_loadu_ps(row + j);
                nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                most = _mm512_max_ps(v, most);
            }
            if (nan) {
                nan_at = j - LANES + __builtin_ctz((unsigned)nan);
            } else {
                best = _mm512_reduce_max_ps(most);
            }
        }
#endif
        if (nan_at < 0) {
            for (; j < size; ++j) { /* the tail (or the whole row without AVX-512), in order */
                if (row[j] != row[j]) {
                    nan_at = j;
                    break;
                }
                if (row[j] > best) best = row[j];
            }
        }
        if (nan_at >= 0) { /* every slot before it was compared: it is the first NaN */
            out[r] = nan_at;
            continue;
        }
        int64_t at = 0;
#if defined(__AVX512F__)
        const __m512 target = _mm512_set1_ps(best);
        for (; at + LANES <= size; at += LANES) {
            const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + at), target, _CMP_EQ_OQ);
            if (hit) {
                at += __builtin_ctz((unsigned)hit);
                break;
            }
        }
#endif
        for (; at < size && row[at] != best; ++at) {
        }
        out[r] = at < size ? at : 0;
    }
}

/* e^z for z <= 0 (z = (logit - max) / T): z = n ln 2 + r with |r| <= ln 2 / 2, e^r by the minimax polynomial
 * of the Cephes library's expf (about one ulp), times 2^n through the exponent bits. Below -87 (under float's
 * smallest normal number) it is 0, so a -inf logit weighs exactly 0 and a NaN weighs 0. Plain arithmetic
 * (rounding by the 1.5 * 2^23 trick, no libm call), so the loop over a row vectorises. */
static inline float exp_nonpositive(float z) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float n = (z * 1.44269504088896341f + magic) - magic;
    float r = z - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    const int32_t exponent = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &exponent, sizeof scale);
    return z > -87.0f ? y * scale : 0.0f;
}

/* The tempered softmax's weights of one row into w (exp((x - max) / T), as spec_fast_tempered_draw weighs
 * them) and their float64 total; the row's first maximum in *first_max. */
static double tempered_weights(const float *row, int64_t size, float t, float *w, int64_t *first_max) {
    spec_fast_first_max(row, 1, size, size, first_max);
    const float most = row[*first_max];
    const float shift = (most - most == 0.0f) ? most : 0.0f;
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i < size; ++i) w[i] = exp_nonpositive((row[i] - shift) / t);
    for (i = 0; i + 8 <= size; i += 8)
        for (int k = 0; k < 8; ++k) lanes[k] += (double)w[i + k];
    double total = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; i < size; ++i) total += (double)w[i];
    return total;
}

/* The smallest index whose float64 running sum of w passes u * total, else the last of positive weight. */
static int64_t running_draw(const float *w, int64_t size, double total, float u) {
    const double threshold = (double)u * total;
    double running = 0.0;
    int64_t last_positive = 0;
    for (int64_t i = 0; i < size; ++i) {
        if (w[i] > 0.0f) {
            last_positive = i;
            running += (double)w[i];
            if (running > threshold) return i;
        }
    }
    return last_positive;
}

/* One draw per row from the tempered softmax of float32 logits [rows, size] (row r at x + r * ldx): weights
 * w_i = e^((x_i - max) / T_r) (a row whose maximum is not finite is shifted by 0), and the smallest index
 * whose running sum (float64, in index order) exceeds u_r times the total; where rounding leaves no such
 * index, the last of positive weight; a row of no positive weight (all -inf or NaN) gives its first maximum.
 * The law is softmax((x - max) / T) up to float rounding: what torch's softmax and an inverse-CDF draw over
 * it give, in one sweep for the weights and one for the draw instead of a dozen passes over the row.
 * `scratch` holds `size` floats. */
void spec_fast_tempered_draw(const float *x, int64_t rows, int64_t size, int64_t ldx, const float *temperature,
                             const float *u, float *scratch, int64_t *out) {
    for (int64_t r = 0; r < rows; ++r) {
        int64_t first_max = 0;
        const double total = tempered_weights(x + r * ldx, size, temperature[r], scratch, &first_max);
        /* no positive weight, or an infinite or NaN total: the first maximum */
        out[r] = total > 0.0 && total - total == 0.0 ? running_draw(scratch, size, total, u[r]) : first_max;
    }
}

/* G's order of a row's tokens for top-k and top-p: the larger logit first, the smaller id among equal
 * logits (torch's stable descending sort); a NaN logit counts as -inf. Token i's place in that order is the
 * unsigned 64-bit key (descending-logit bits << 32) | i, so the order is the keys' and every comparison below
 * is one integer comparison. */
static inline uint64_t order_key(const float *row, int64_t i) {
    float v = row[i];
    if (v != v) v = -INFINITY;
    if (v == 0.0f) v = 0.0f; /* -0 ties +0, as the logits compare */
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    bits = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u; /* ascending with the float */
    return ((uint64_t)~bits << 32) | (uint64_t)(uint32_t)i;
}

static inline int64_t key_id(uint64_t key) { return (int64_t)(key & 0xffffffffu); }

static inline void swap_keys(uint64_t *keys, int64_t i, int64_t j) {
    const uint64_t t = keys[i];
    keys[i] = keys[j];
    keys[j] = t;
}

/* Lomuto partition of keys[lo, hi) around the median of its first, middle and last keys: returns the
 * pivot's final place, the smaller keys left of it. */
static int64_t partition_keys(uint64_t *keys, int64_t lo, int64_t hi) {
    const int64_t a = lo, b = lo + (hi - lo) / 2, c = hi - 1;
    int64_t m;
    if (keys[a] < keys[b]) m = keys[b] < keys[c] ? b : (keys[a] < keys[c] ? c : a);
    else m = keys[a] < keys[c] ? a : (keys[b] < keys[c] ? c : b);
    swap_keys(keys, m, hi - 1);
    const uint64_t pivot = keys[hi - 1];
    int64_t store = lo;
    for (int64_t i = lo; i < hi - 1; ++i)
        if (keys[i] < pivot) swap_keys(keys, i, store++);
    swap_keys(keys, store, hi - 1);
    return store;
}

/* Rearranges keys[lo, hi) so that keys[lo, nth] are its nth - lo + 1 smallest (quickselect). */
static void select_first(uint64_t *keys, int64_t lo, int64_t hi, int64_t nth) {
    while (hi - lo > 1) {
        const int64_t at = partition_keys(keys, lo, hi);
        if (at == nth) return;
        if (nth < at) hi = at;
        else lo = at + 1;
    }
}

/* Sorts keys[lo, hi) ascending. */
static void sort_keys(uint64_t *keys, int64_t lo, int64_t hi) {
    while (hi - lo > 16) {
        const int64_t at = partition_keys(keys, lo, hi);
        if (at - lo < hi - at) { /* the smaller side by recursion: the depth stays logarithmic */
            sort_keys(keys, lo, at);
            lo = at + 1;
        } else {
            sort_keys(keys, at + 1, hi);
            hi = at;
        }
    }
    for (int64_t i = lo + 1; i < hi; ++i)
        for (int64_t j = i; j > lo && keys[j] < keys[j - 1]; --j) swap_keys(keys, j, j - 1);
}

/* Restores the max-heap keys[0, n) below position i (its root: the heap's last token in G's order). */
static void heap_down(uint64_t *keys, int64_t n, int64_t i) {
    for (;;) {
        const int64_t left = 2 * i + 1, right = left + 1;
        int64_t larger = i;
        if (left < n && keys[larger] < keys[left]) larger = left;
        if (right < n && keys[larger] < keys[right]) larger = right;
        if (larger == i) return;
        swap_keys(keys, i, larger);
        i = larger;
    }
}

/* The keys of a row's first k tokens in G's order into keys[0, k) (1 <= k < size), then of every further
 * token whose logit equals the k-th's (top-k keeps ties); returns their count. A small k keeps a heap of k
 * over one sweep; from size / 16 on, where the heap would be replaced too often, a quickselect. */
static int64_t top_k_keys(const float *row, int64_t size, int64_t k, uint64_t *keys) {
    uint64_t kth;
    if (k > size / 16) {
        for (int64_t i = 0; i < size; ++i) keys[i] = order_key(row, i);
        select_first(keys, 0, size, k - 1);
        kth = keys[k - 1];
    } else {
        for (int64_t i = 0; i < k; ++i) keys[i] = order_key(row, i);
        for (int64_t i = k / 2 - 1; i >= 0; --i) heap_down(keys, k, i);
        float root = row[key_id(keys[0])];
        for (int64_t i = k; i < size; ++i) {
            if (row[i] < root) continue; /* after the root in G's order: most tokens stop here */
            const uint64_t key = order_key(row, i);
            if (key < keys[0]) {
                keys[0] = key;
                heap_down(keys, k, 0);
                root = row[key_id(keys[0])];
            }
        }
        kth = keys[0];
    }
    int64_t count = k;
    /* ties: the same logit bits, a larger id (those before the k-th in G's order are among the k already) */
    const float kth_logit = row[key_id(kth)];
    for (int64_t i = key_id(kth) + 1; i < size; ++i)
        if ((row[i] == kth_logit || row[i] != row[i]) && order_key(row, i) >> 32 == kth >> 32)
            keys[count++] = order_key(row, i);
    return count;
}

/* One draw per row from G with top-k and top-p (decoding_operator's law): the tempered weights of
 * spec_fast_tempered_draw, cut to the tokens whose logit is at least the top_k-th largest (1 <= top_k < size;
 * every tie of it kept), then to the first tokens in G's order whose preceding mass among those is below
 * top_p of their total (top_p < 1), and the smallest index whose running sum over the kept weights (float64,
 * in index order) exceeds u times their total. Only the candidates the cuts need are ordered: top-k keeps a
 * heap of k tokens over one sweep (or a quickselect for a large k); top-p first drops every token whose logit
 * lies so far below the maximum that all of them together weigh less than a quarter of 1 - top_p of the
 * total (they are cut whatever their order: the tokens above them already hold more than top_p of the mass),
 * then orders the first 64, 256, 1024, ... of the rest in turn until the mass is reached. The law is G's up
 * to float rounding (the weights, and the top-p boundary, are computed as spec_fast_tempered_draw computes
 * them); rows without either cut draw exactly as spec_fast_tempered_draw does. A row without positive weight
 * gives its first maximum. `weights` holds `size` floats, `keys` `size` 64-bit integers; size < 2^32. */
void spec_fast_filtered_draw(const float *x, int64_t rows, int64_t size, int64_t ldx, const float *temperature,
                             const int64_t *top_k, const double *top_p, const float *u, float *weights,
                             uint64_t *keys, int64_t *out) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * ldx;
        int64_t first_max = 0;
        double total = tempered_weights(row, size, temperature[r], weights, &first_max);
        if (!(total > 0.0 && total - total == 0.0)) {
            out[r] = first_max;
            continue;
        }
        const int cut_k = top_k[r] >= 1 && top_k[r] < size, cut_p = top_p[r] < 1.0;
        if (!cut_k && !cut_p) {
            out[r] = running_draw(weights, size, total, u[r]);
            continue;
        }
        int64_t count = 0;
        if (cut_k) {
            count = top_k_keys(row, size, top_k[r], keys);
            total = 0.0; /* the mass top-p divides: the top-k tokens' */
            for (int64_t i = 0; i < count; ++i) total += (double)weights[key_id(keys[i])];
        } else {
            /* a logit below `lowest` weighs at most e^((lowest - max) / T) = (1 - top_p) total / (4 size) (< 1, the
             * maximum's weight: total <= size), so all of them weigh less than (1 - top_p) total / 4: every token
             * at or above it comes before them, and those already hold more than top_p of the mass */
            const double spread = (double)temperature[r] * log((1.0 - top_p[r]) * total / (4.0 * (double)size));
            const float lowest = nextafterf((float)((double)row[first_max] + spread), -INFINITY);
            for (int64_t i = 0; i < size; ++i)
                if (row[i] >= lowest) keys[count++] = order_key(row, i); /* a NaN is left out: it weighs 0 */
        }
        int64_t kept = count;
        if (cut_p) {
            const double limit = top_p[r] * total;
            double before = 0.0;
            int64_t lo = 0, chunk = 64;
            while (lo < count && kept == count) {
                const int64_t hi = count - lo > chunk ? lo + chunk : count;
                if (hi < count) select_first(keys, lo, count, hi - 1);
                sort_keys(keys, lo, hi);
                for (int64_t i = lo; i < hi; ++i) {
                    if (before >= limit) {
                        kept = i; /* >= 1: the first token's preceding mass is 0 */
                        break;
                    }
                    before += (double)weights[key_id(keys[i])];
                }
                lo = hi;
                chunk *= 4;
            }
        }
        if (kept < 1) { /* no logit at or above `lowest`: a NaN maximum */
            out[r] = first_max;
            continue;
        }
        if (kept > size / 16) { /* many kept: zero the others' weights and draw over the row, not a sort */
            uint64_t last = keys[0];
            for (int64_t i = 1; i < kept; ++i) last = keys[i] > last ? keys[i] : last;
            for (int64_t i = 0; i < size; ++i)
                if (order_key(row, i) > last) weights[i] = 0.0f;
            double sum = 0.0;
            for (int64_t i = 0; i < size; ++i) sum += (double)weights[i];
            out[r] = running_draw(weights, size, sum, u[r]);
            continue;
        }
        /* the kept tokens in index order: the running sum of spec_fast_tempered_draw over their weights alone */
        for (int64_t i = 0; i < kept; ++i) keys[i] &= 0xffffffffu;
        sort_keys(keys, 0, kept);
        double mass = 0.0;
        for (int64_t i = 0; i < kept; ++i) mass += (double)weights[keys[i]];
        const double threshold = (double)u[r] * mass;
        double running = 0.0;
        int64_t pick = key_id(keys[0]);
        for (int64_t i = 0; i < kept; ++i) {
            const float w = weights[keys[i]];
            if (w > 0.0f) {
                pick = key_id(keys[i]);
                running += (double)w;
                if (running > threshold) break;
            }
        }
        out[r] = pick;
    }
}

/* p = w / total in float32 for rows of logits [rows, size] as spec_fast_naive_chain computes it (zeros where
 * the row has no positive weight). */
void spec_fast_tempered_probs(const float *x, int64_t rows, int64_t size, int64_t ldx, const float *temperature,
                              float *out) {
    for (int64_t r = 0; r < rows; ++r) {
        int64_t first_max = 0;
        float *p = out + r * size;
        const double total = tempered_weights(x + r * ldx, size, temperature[r], p, &first_max);
        const int usable = total > 0.0 && total - total == 0.0;
        for (int64_t i = 0; i < size; ++i) p[i] = usable ? (float)((double)p[i] / total) : 0.0f;
    }
}

/* Naive verification of one chain per row against the tempered softmax of the target's logits (the engine's
 * sampled chains without top-k or top-p): logits [rows, slots, size] (row r, slot s at x + r * ldr + s * lds),
 * child [rows, slots] (the drafted token below each slot, -1 at a leaf), the draft's law q [rows, slots, size]
 * (q + r * qldr + s * qlds), uniforms u0, u1 [rows, slots]. Slot by slot, p = w / total (float32), the drafted
 * token x is accepted where u0 * q(x) < p(x) in float64; the row stops at its first rejection, drawing from
 * Res(p, q) = (p - q)+ with u1 (p itself where that has no mass), or at a leaf, drawing from p with u0: the
 * decisions of verify_tree("naive") on these p, its draws up to the rounding of the running sums. Writes each
 * row's stop slot and next token; `scratch` holds 2 * size floats. */
void spec_fast_naive_chain(const float *x, int64_t rows, int64_t slots, int64_t size, int64_t ldr, int64_t lds,
                           const float *temperature, const int64_t *child, const float *q, int64_t qldr,
                           int64_t qlds, const float *u0, const float *u1, float *scratch, int64_t *stop,
                           int64_t *token) {
    float *w = scratch, *residual = scratch + size;
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t s = 0; s < slots; ++s) {
            int64_t first_max = 0;
            const double total = tempered_weights(x + r * ldr + s * lds, size, temperature[r], w, &first_max);
            const int64_t drafted = child[r * slots + s];
            const int usable = total > 0.0 && total - total == 0.0;
            const int leaf = drafted < 0 || drafted >= size || s + 1 >= slots;
            if (!usable) { /* no positive weight (all -inf, or NaN): the first maximum */
                stop[r] = s;
                token[r] = first_max;
                break;
            }
            const float *q_row = q + r * qldr + s * qlds;
            if (!leaf) {
                const float p_x = (float)((double)w[drafted] / total);
                if ((double)u0[r * slots + s] * (double)q_row[drafted] < (double)p_x) continue; /* accepted */
                double mass = 0.0;
                for (int64_t i = 0; i < size; ++i) {
                    const float p = (float)((double)w[i] / total);
                    const float d = p - q_row[i];
                    residual[i] = d > 0.0f ? d : 0.0f;
                    mass += (double)residual[i];
                }
                stop[r] = s;
                token[r] = mass > 0.0 ? running_draw(residual, size, mass, u1[r * slots + s])
                                      : running_draw(w, size, total, u1[r * slots + s]);
                break;
            }
            stop[r] = s;
            token[r] = running_draw(w, size, total, u0[r * slots + s]);
            break;
        }
    }
}

/* The version of this file's interface; native.py refuses a library that reports another. */
int64_t spec_fast_kernels_version(void) { return 16; }
