/* Matrix products of the lean forward on the CPU, for any number of rows M, memory-bound at small M.
 *
 * A float32 weight W [N, K] is packed into column blocks of 64 outputs, each block stored k-major:
 * packed[b][k][j] = W[64 b + j][k] (zero beyond N), so one block is one contiguous stream of K x 64 floats.
 * y[m][n] = sum_k x[m][k] W[n][k] then reads every weight exactly once per group of up to four rows: for each
 * k, 64 weights are loaded and multiplied into 64 accumulators per row. At M = 1 the product streams the
 * weights at memory speed; rows 2-4 ride on the same loads, so a pass over 2-4 tokens costs about what a
 * pass over one costs (BLAS kernels on this CPU charge 1.5x-2x for 2-3 rows).
 *
 * Every output is accumulated over k = 0, 1, ..., K-1 in that order, in its own accumulator, whatever M is
 * and wherever the row sits in the batch: a row's result does not depend on the other rows. That is what
 * makes a verification pass give a token exactly the logits a plain decoding step gives it.
 *
 * Built by spec_fast/lean/native.py with the machine's C compiler (-O3 -march=native) and loaded with
 * ctypes; nothing here depends on Python or torch.
 */
#include <stdint.h>
#include <string.h>

#define BLOCK 64

static inline __attribute__((always_inline)) void block_rows(int rows, const float *restrict x, int64_t ldx, int64_t k_size,
                              const float *restrict w, float *restrict y, int64_t ldy, int64_t width) {
    float acc[4][BLOCK];
    memset(acc, 0, sizeof(acc));
    for (int64_t k = 0; k < k_size; ++k) {
        const float *restrict wk = w + k * BLOCK;
        for (int m = 0; m < rows; ++m) {
            const float xv = x[m * ldx + k];
            for (int j = 0; j < BLOCK; ++j) {
                acc[m][j] += xv * wk[j];
            }
        }
    }
    for (int m = 0; m < rows; ++m) {
        memcpy(y + m * ldy, acc[m], (size_t)width * sizeof(float));
    }
}

/* One instantiation per row count, so each inner loop has a compile-time bound. */
#define ROWS(R)                                                                                          \
    static void rows_##R(const float *restrict x, int64_t ldx, int64_t k_size, const float *restrict w,  \
                         float *restrict y, int64_t ldy, int64_t width) {                                \
        block_rows(R, x, ldx, k_size, w, y, ldy, width);                                                 \
    }
ROWS(1)
ROWS(2)
ROWS(3)
ROWS(4)

/* y [M, ldy] (first n_size columns written) = x [M, K] (row stride ldx) times the packed weight
 * [ceil(n_size / 64), K, 64]. */
void spec_fast_mm_f32(const float *x, int64_t m_size, int64_t ldx, int64_t k_size, const float *packed,
                      int64_t n_size, float *y, int64_t ldy) {
    const int64_t blocks = (n_size + BLOCK - 1) / BLOCK;
    for (int64_t b = 0; b < blocks; ++b) {
        const float *w = packed + b * k_size * BLOCK;
        const int64_t width = n_size - b * BLOCK < BLOCK ? n_size - b * BLOCK : BLOCK;
        /* the block (at most K x 256 bytes) stays in cache while every group of rows reads it */
        for (int64_t m0 = 0; m0 < m_size; m0 += 4) {
            const int64_t rows = m_size - m0 < 4 ? m_size - m0 : 4;
            const float *xm = x + m0 * ldx;
            float *ym = y + m0 * ldy + b * BLOCK;
            switch (rows) {
                case 1: rows_1(xm, ldx, k_size, w, ym, ldy, width); break;
                case 2: rows_2(xm, ldx, k_size, w, ym, ldy, width); break;
                case 3: rows_3(xm, ldx, k_size, w, ym, ldy, width); break;
                default: rows_4(xm, ldx, k_size, w, ym, ldy, width); break;
            }
        }
    }
}

/* The version of this file's interface; native.py refuses a library that reports another. */
int64_t spec_fast_kernels_version(void) { return 1; }
