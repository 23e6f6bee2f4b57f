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
int64_t spec_fast_kernels_version(void) { return 15; }
