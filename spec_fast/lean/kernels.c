/* Matrix products of the lean forward on the CPU, for any number of rows M, memory-bound at small M.
 *
 * A float32 weight W [N, K] is packed into column blocks of 64 outputs, each block stored k-major:
 * packed[b][k][j] = W[64 b + j][k] (zero beyond N), so one block is one contiguous stream of K x 64 floats.
 * y[m][n] = sum_k x[m][k] W[n][k] then reads every weight exactly once per group of up to four rows: for each
 * k, 64 weights are loaded and multiplied into 64 accumulators per row. At M = 1 the product streams the
 * weights at memory speed; rows 2-4 ride on the same loads, so a pass over 2-4 tokens costs about what a
 * pass over one costs (BLAS kernels on this CPU charge 1.5x-2x for 2-3 rows).
 *
 * Block-quantised weights as GGUF stores them, in groups of 32 inputs: Q4_1 (w = d q + m, q in 0..15) and
 * Q8_0 (w = d q, q in -128..127), with d and m per output and group. Packed per block of 64 outputs and
 * group g: the 32 x 64 quantised values (Q4_1: byte j of input k holds outputs j and j + 32 in its low and
 * high nibble; Q8_0: one byte per value, stored as q + 128 with m = -128 d, so that both kinds widen
 * unsigned bytes), then d[64] and m[64] as float32. Per row and output,
 * s_g = sum over the group's inputs of x q (in input order), then acc += d s_g + m sum_g x: the product of x
 * with the weights d q + m, which are the GGUF's weights exactly; only the rounding of the sum differs from
 * a product with those weights de-quantised to float32.
 *
 * Every output is accumulated in a fixed order (k = 0, 1, ..., K-1; for the block kinds group by group)
 * in its own accumulator, whatever M is and wherever the row sits in the batch: a row's result does not
 * depend on the other rows. That is what makes a verification pass give a token exactly the logits a plain
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

#define BLOCK 64
#define LANES 16
#define VECS (BLOCK / LANES)
#define GROUP 32
#define Q4_GROUP_BYTES (GROUP * BLOCK / 2 + 2 * BLOCK * 4)
#define Q8_GROUP_BYTES (GROUP * BLOCK + 2 * BLOCK * 4)

typedef float f32x16 __attribute__((vector_size(64), aligned(4)));
typedef uint8_t u8x16 __attribute__((vector_size(16), aligned(1)));
typedef int32_t i32x16 __attribute__((vector_size(64), aligned(4)));

/* 16 bytes to 16 floats, and 16 bytes to the floats of their low and high nibbles. GCC 12 widens a loaded
 * byte vector one byte at a time, so x86 gets the two instructions it needs by intrinsics; other targets
 * take the generic vector code. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline f32x16 from_m512(__m512 v) { f32x16 out; memcpy(&out, &v, sizeof(out)); return out; }
static inline f32x16 widen_u8(const uint8_t *p) {
    return from_m512(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))));
}
static inline void widen_nibbles(const uint8_t *p, f32x16 *low, f32x16 *high) {
    const __m512i wide = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *low = from_m512(_mm512_cvtepi32_ps(_mm512_and_si512(wide, _mm512_set1_epi32(15))));
    *high = from_m512(_mm512_cvtepi32_ps(_mm512_srli_epi32(wide, 4)));
}
#elif defined(__AVX2__)
#include <immintrin.h>
static inline f32x16 from_m256(__m256 lo, __m256 hi) {
    f32x16 out;
    memcpy(&out, &lo, 32);
    memcpy((char *)&out + 32, &hi, 32);
    return out;
}
static inline __m256i widen8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline f32x16 widen_u8(const uint8_t *p) {
    return from_m256(_mm256_cvtepi32_ps(widen8(p)), _mm256_cvtepi32_ps(widen8(p + 8)));
}
static inline void widen_nibbles(const uint8_t *p, f32x16 *low, f32x16 *high) {
    const __m256i a = widen8(p), b = widen8(p + 8), mask = _mm256_set1_epi32(15);
    *low = from_m256(_mm256_cvtepi32_ps(_mm256_and_si256(a, mask)), _mm256_cvtepi32_ps(_mm256_and_si256(b, mask)));
    *high = from_m256(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)));
}
#else
static inline f32x16 widen_u8(const uint8_t *p) {
    u8x16 v;
    memcpy(&v, p, sizeof(v));
    return __builtin_convertvector(__builtin_convertvector(v, i32x16), f32x16);
}
static inline void widen_nibbles(const uint8_t *p, f32x16 *low, f32x16 *high) {
    u8x16 v;
    memcpy(&v, p, sizeof(v));
    *low = __builtin_convertvector(__builtin_convertvector(v & 15, i32x16), f32x16);
    *high = __builtin_convertvector(__builtin_convertvector(v >> 4, i32x16), f32x16);
}
#endif

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

static inline __attribute__((always_inline)) void q4_rows(int rows, const float *restrict x, int64_t ldx,
                                                          int64_t groups, const uint8_t *restrict packed,
                                                          float *restrict y, int64_t ldy, int64_t width) {
    f32x16 acc[4][VECS];
    memset(acc, 0, sizeof(acc));
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *restrict nibbles = packed + g * Q4_GROUP_BYTES;
        const float *restrict d = (const float *)(nibbles + GROUP * BLOCK / 2);
        const float *restrict m = d + BLOCK;
        f32x16 part[4][VECS];
        float sum_x[4] = {0.f, 0.f, 0.f, 0.f};
        memset(part, 0, sizeof(part));
        for (int k = 0; k < GROUP; ++k) {
            /* outputs 0-15 and 16-31 in the low nibbles, 32-47 and 48-63 in the high ones */
            f32x16 wk[VECS];
            widen_nibbles(nibbles + k * (BLOCK / 2), &wk[0], &wk[2]);
            widen_nibbles(nibbles + k * (BLOCK / 2) + LANES, &wk[1], &wk[3]);
            for (int r = 0; r < rows; ++r) {
                const float xv = x[r * ldx + g * GROUP + k];
                sum_x[r] += xv;
                for (int c = 0; c < VECS; ++c) part[r][c] += xv * wk[c];
            }
        }
        for (int c = 0; c < VECS; ++c) {
            const f32x16 dc = load16(d + c * LANES), mc = load16(m + c * LANES);
            for (int r = 0; r < rows; ++r) acc[r][c] += dc * part[r][c] + mc * sum_x[r];
        }
    }
    store_rows(rows, acc, y, ldy, width);
}

static inline __attribute__((always_inline)) void q8_rows(int rows, const float *restrict x, int64_t ldx,
                                                          int64_t groups, const uint8_t *restrict packed,
                                                          float *restrict y, int64_t ldy, int64_t width) {
    f32x16 acc[4][VECS];
    memset(acc, 0, sizeof(acc));
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *restrict values = packed + g * Q8_GROUP_BYTES;
        const float *restrict d = (const float *)(values + GROUP * BLOCK);
        const float *restrict m = d + BLOCK;
        f32x16 part[4][VECS];
        float sum_x[4] = {0.f, 0.f, 0.f, 0.f};
        memset(part, 0, sizeof(part));
        for (int k = 0; k < GROUP; ++k) {
            f32x16 wk[VECS];
            for (int c = 0; c < VECS; ++c) {
                wk[c] = widen_u8(values + k * BLOCK + c * LANES);
            }
            for (int r = 0; r < rows; ++r) {
                const float xv = x[r * ldx + g * GROUP + k];
                sum_x[r] += xv;
                for (int c = 0; c < VECS; ++c) part[r][c] += xv * wk[c];
            }
        }
        for (int c = 0; c < VECS; ++c) {
            const f32x16 dc = load16(d + c * LANES), mc = load16(m + c * LANES);
            for (int r = 0; r < rows; ++r) acc[r][c] += dc * part[r][c] + mc * sum_x[r];
        }
    }
    store_rows(rows, acc, y, ldy, width);
}

/* One instantiation per kind and row count, so every loop has compile-time bounds. */
#define ROWS(NAME, R, T)                                                                                  \
    static void NAME##_##R(const float *restrict x, int64_t ldx, int64_t size, const T *restrict w,       \
                           float *restrict y, int64_t ldy, int64_t width) {                               \
        NAME##_rows(R, x, ldx, size, w, y, ldy, width);                                                    \
    }
ROWS(f32, 1, float)
ROWS(f32, 2, float)
ROWS(f32, 3, float)
ROWS(f32, 4, float)
ROWS(q4, 1, uint8_t)
ROWS(q4, 2, uint8_t)
ROWS(q4, 3, uint8_t)
ROWS(q4, 4, uint8_t)
ROWS(q8, 1, uint8_t)
ROWS(q8, 2, uint8_t)
ROWS(q8, 3, uint8_t)
ROWS(q8, 4, uint8_t)

#define DISPATCH(NAME, SIZE, W)                                                                           \
    switch (rows) {                                                                                       \
        case 1: NAME##_1(xm, ldx, SIZE, W, ym, ldy, width); break;                                        \
        case 2: NAME##_2(xm, ldx, SIZE, W, ym, ldy, width); break;                                        \
        case 3: NAME##_3(xm, ldx, SIZE, W, ym, ldy, width); break;                                        \
        default: NAME##_4(xm, ldx, SIZE, W, ym, ldy, width); break;                                       \
    }

/* y [M, ldy] (first n_size columns written) = x [M, K] (row stride ldx) times the packed float32 weight
 * [ceil(n_size / 64), K, 64], on up to `threads` threads. Each block (at most K x 256 bytes) stays in cache while every group of four
 * rows reads it. */
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

/* The same for a packed Q4_1 (kind 4) or Q8_0 (kind 8) weight; K is a multiple of 32. */
void spec_fast_mm_blocks(int64_t kind, const float *x, int64_t m_size, int64_t ldx, int64_t k_size,
                         const uint8_t *packed, int64_t n_size, float *y, int64_t ldy, int64_t threads) {
    const int64_t blocks = (n_size + BLOCK - 1) / BLOCK;
    const int64_t groups = k_size / GROUP;
    const int64_t block_bytes = groups * (kind == 4 ? Q4_GROUP_BYTES : Q8_GROUP_BYTES);
#pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1 && blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t *w = packed + b * block_bytes;
        const int64_t width = n_size - b * BLOCK < BLOCK ? n_size - b * BLOCK : BLOCK;
        for (int64_t m0 = 0; m0 < m_size; m0 += 4) {
            const int64_t rows = m_size - m0 < 4 ? m_size - m0 : 4;
            const float *xm = x + m0 * ldx;
            float *ym = y + m0 * ldy + b * BLOCK;
            if (kind == 4) {
                DISPATCH(q4, groups, w)
            } else {
                DISPATCH(q8, groups, w)
            }
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

/* The version of this file's interface; native.py refuses a library that reports another. */
int64_t spec_fast_kernels_version(void) { return 6; }
