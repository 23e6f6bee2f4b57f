/* Products with GGUF block-quantised weights (Q4_1, Q8_0) on integer dot products, for any number of rows.
 *
 * A float product of these weights costs one fused multiply-add per weight and row: at 2-5 rows (a
 * verification pass) the CPU's float units, not memory, set the pace, and every extra token of a pass cost
 * about a third of a one-token pass on SmolLM2. Here, as in llama.cpp, each row of activations is quantised
 * to int8 in groups of 32 inputs (x ~ dx xq, dx = max|x| / 127, xq rounded to nearest), and each group's
 * sum of weight values times xq is an exact integer (AVX512-VNNI: 64 byte products per instruction). Per
 * output and group, with the weights w = d q + m:
 *
 *     y += (d dx) sum_k q_k xq_k + m sx,        sx = dx sum_k xq_k
 *
 * (Q8_0's q in -128..127 is stored as the byte q + 128 with m = -128 d, so both kinds multiply unsigned
 * bytes.) The integer sums are exact and the float steps per output run in one fixed order, so each row's
 * result depends only on that row: a verification pass gives every token exactly what a one-token pass gives
 * it, on any CPU (the VNNI and the portable code compute the same integers).
 *
 * Layout of a weight [N, K] (K a multiple of 32), per block of 64 outputs and group g of 32 inputs: the
 * values in 8 quads of 4 inputs, each quad output-major with its 4 inputs adjacent (byte 4 j + i holds input
 * 4 quad + i of output j: one 32-bit lane of an accumulator per output); Q4_1 packs outputs j and j + 32 into
 * the low and high nibble of one byte (128 bytes a quad), Q8_0 one byte per value (256 bytes a quad); then
 * d[64] as float16 and, for Q4_1 only, m[64] as float16 (Q8_0's m = -128 d is exact in float32 and computed
 * here). GGUF stores d and m as float16, so nothing is rounded, and a group takes the bytes GGUF's blocks
 * take (1280 for Q4_1, 2176 for Q8_0): one pass streams the file's bytes, not a wider copy of them (float32
 * scales made it 20% and 18% more). spec_fast/lean/native.py (pack_blocks) writes it.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define SPEC_FAST_VNNI 1
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__) && !defined(SPEC_FAST_NO_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#define SPEC_FAST_AMX 1
#endif
#endif

#define BLOCK 64
#define PREFETCH_GROUPS 8
/* row counts from which the VNNI path sweeps a block twice, half of its outputs at a time (block_rows_halves).
 * Not on AMD Zen (the compilers' znver tuning macros): it runs a 512-bit instruction as two 256-bit halves, so
 * the second sweep's repeated unpacking of the Q4_1 nibbles cost more there than the register spills it saves:
 * a whole SmolLM2 pass over 3 tokens took 11.3 ms with the two sweeps and 8.6 ms without them on a Zen 4
 * core (bench/results/pass_width.md), while on the Intel core it was tuned on the sweeps were the faster. */
#ifndef HALVES_FROM
#if defined(__znver3__) || defined(__znver4__) || defined(__znver5__)
#define HALVES_FROM 99
#else
#define HALVES_FROM 3
#endif
#endif
/* Software prefetch of the weights (prefetch_ahead) from PREFETCH_FROM_ROWS rows on, with cache hint
 * PREFETCH_HINT. On AMD Zen the hardware prefetchers alone streamed the weights of a 1-2 row product faster
 * than with the prefetches, and from 3 rows a prefetch into L2 (T1) beat one into L1 (T0): a whole SmolLM2 pass
 * over 1 / 5 tokens on a Zen 4 core, bench/results/pass_width.md. On the Intel core they were tuned on, every
 * row count asked for every line into L1. */
#ifndef PREFETCH_FROM_ROWS
#if defined(__znver3__) || defined(__znver4__) || defined(__znver5__)
#define PREFETCH_FROM_ROWS 3
#else
#define PREFETCH_FROM_ROWS 1
#endif
#endif
#ifndef PREFETCH_HINT
#if defined(__znver3__) || defined(__znver4__) || defined(__znver5__)
#define PREFETCH_HINT _MM_HINT_T1
#else
#define PREFETCH_HINT _MM_HINT_T0
#endif
#endif
#define LANES 16
#define VECS (BLOCK / LANES)
#define GROUP 32
#define QUADS (GROUP / 4)
#define Q4_QUAD_BYTES (BLOCK * 4 / 2)
#define Q8_QUAD_BYTES (BLOCK * 4)
#define Q4_GROUP_BYTES (QUADS * Q4_QUAD_BYTES + 2 * BLOCK * 2)
#define Q8_GROUP_BYTES (QUADS * Q8_QUAD_BYTES + BLOCK * 2)

typedef float f32x16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t i32x16 __attribute__((vector_size(64), aligned(4)));

static inline f32x16 load16(const float *p) { f32x16 v; memcpy(&v, p, sizeof(v)); return v; }

/* The float32 value of an IEEE float16 (exact: every float16 is a float32). */
static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 31, mantissa = h & 1023;
    uint32_t bits;
    if (exponent == 31) {
        bits = sign | 0x7f800000u | (mantissa << 13); /* inf, nan */
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else {
        const float magnitude = (float)mantissa * 5.9604644775390625e-8f; /* subnormal: mantissa 2^-24 */
        memcpy(&bits, &magnitude, sizeof(bits));
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* half_to_float for layer.c, which reads float16 cache entries with it where the CPU lacks F16C */
float spec_fast_half_to_float(uint16_t h);
float spec_fast_half_to_float(uint16_t h) { return half_to_float(h); }

/* Row r of x [rows, ldx] quantised per group of 32: xq [rows, K] int8, dx and sx [rows, K / 32]. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
/* The same numbers as the scalar loop below, 16 lanes at a time: |x| maxima ignore NaN (as fmaxf does; the
 * maximum of non-negative values does not depend on the order), t = x / d is the same float product, NaN -> 0,
 * clamped to +-127 and rounded half to even (nearbyintf in the default rounding mode), and the integer sum is
 * exact. The scalar loop called fmaxf through the PLT and rounded one value at a time. */
static void quantize_rows(const float *x, int64_t rows, int64_t ldx, int64_t k_size, int8_t *xq, float *dx,
                          float *sx) {
    const int64_t groups = k_size / GROUP;
    const __m512 sign = _mm512_set1_ps(-0.f), low = _mm512_set1_ps(-127.f), high = _mm512_set1_ps(127.f);
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < groups; ++g) {
            const float *v = x + r * ldx + g * GROUP;
            const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
            /* vmaxps returns its second operand when either is NaN: the running maximum (never NaN) */
            __m512 most = _mm512_max_ps(_mm512_andnot_ps(sign, a), _mm512_setzero_ps());
            most = _mm512_max_ps(_mm512_andnot_ps(sign, b), most);
            const float amax = _mm512_reduce_max_ps(most);
            const float d = amax / 127.f, inverse = d > 0.f ? 1.f / d : 0.f;
            const __m512 scale = _mm512_set1_ps(inverse);
            __m512i sum = _mm512_setzero_si512();
            for (int half = 0; half < 2; ++half) {
                __m512 t = _mm512_mul_ps(half ? b : a, scale);
                t = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(t, t, _CMP_ORD_Q), t); /* NaN -> 0 */
                t = _mm512_min_ps(_mm512_max_ps(t, low), high);
                const __m512 rounded = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                const __m512i q = _mm512_cvtps_epi32(rounded);
                _mm_storeu_si128((__m128i *)(void *)(xq + r * k_size + g * GROUP + 16 * half), _mm512_cvtepi32_epi8(q));
                sum = _mm512_add_epi32(sum, q);
            }
            dx[r * groups + g] = d;
            sx[r * groups + g] = d * (float)_mm512_reduce_add_epi32(sum);
        }
    }
}
#else
static void quantize_rows(const float *x, int64_t rows, int64_t ldx, int64_t k_size, int8_t *xq, float *dx,
                          float *sx) {
    const int64_t groups = k_size / GROUP;
    for (int64_t r = 0; r < rows; ++r) {
        for (int64_t g = 0; g < groups; ++g) {
            const float *v = x + r * ldx + g * GROUP;
            float amax = 0.f;
            for (int i = 0; i < GROUP; ++i) amax = fmaxf(amax, fabsf(v[i]));
            const float d = amax / 127.f, inverse = d > 0.f ? 1.f / d : 0.f;
            int32_t sum = 0;
            for (int i = 0; i < GROUP; ++i) {
                float t = v[i] * inverse;
                t = t != t ? 0.f : (t > 127.f ? 127.f : (t < -127.f ? -127.f : t)); /* NaN -> 0, never UB */
                const int32_t q = (int32_t)nearbyintf(t);
                xq[r * k_size + g * GROUP + i] = (int8_t)q;
                sum += q;
            }
            dx[r * groups + g] = d;
            sx[r * groups + g] = d * (float)sum;
        }
    }
}
#endif

/* sums[r][c] (lane l: output 16 c + l) += the dot products of one quad: weight bytes u (VECS vectors of 64
 * bytes, output-major, 4 inputs per output) with the 4 activation bytes of each row. */
#ifdef SPEC_FAST_VNNI
typedef __m512i quad_weights_t[VECS];
static inline void quad_weights(int kind, const uint8_t *p, quad_weights_t u) {
    if (kind == 4) {
        const __m512i low_mask = _mm512_set1_epi8(15);
        const __m512i a = _mm512_loadu_si512((const void *)p), b = _mm512_loadu_si512((const void *)(p + 64));
        u[0] = _mm512_and_si512(a, low_mask);
        u[1] = _mm512_and_si512(b, low_mask);
        u[2] = _mm512_and_si512(_mm512_srli_epi16(a, 4), low_mask);
        u[3] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low_mask);
    } else {
        for (int c = 0; c < VECS; ++c) u[c] = _mm512_loadu_si512((const void *)(p + 64 * c));
    }
}
#else
typedef uint8_t quad_weights_t[VECS][64];
static inline void quad_weights(int kind, const uint8_t *p, quad_weights_t u) {
    for (int t = 0; t < 128 && kind == 4; ++t) {
        u[t / 64][t % 64] = p[t] & 15;
        u[2 + t / 64][t % 64] = p[t] >> 4;
    }
    if (kind != 4) memcpy(u, p, sizeof(quad_weights_t));
}
static inline void quad_dot(const quad_weights_t u, const int8_t *xq4, i32x16 sums[VECS]) {
    for (int c = 0; c < VECS; ++c) {
        for (int l = 0; l < LANES; ++l) {
            const uint8_t *w = u[c] + 4 * l;
            sums[c][l] += w[0] * xq4[0] + w[1] * xq4[1] + w[2] * xq4[2] + w[3] * xq4[3];
        }
    }
}
#endif

#ifdef SPEC_FAST_VNNI
/* 16 float16 at p as float32 (exact) */
static inline __m512 half16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}

/* The weights stream from memory once per pass: quad q of a group asks for its share of the cache lines of
 * the group PREFETCH_GROUPS ahead (into the next block at the end of this one), so that each line is asked
 * for once and the reads overlap the dot products (distances of 2 to 20 groups tried on whole decoding
 * passes: 8 was best; a prefetch past the end of the weight never faults). Always inlined: GCC counts a
 * prefetch as no side effect, so to it a function of prefetches alone is "const", and it deletes every
 * call (tests/engine/test_native_boundary.py checks the generated code of the block products). */
static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *values, int64_t group_bytes, int q) {
    const char *ahead = (const char *)(values + PREFETCH_GROUPS * group_bytes);
    for (int64_t line = 64 * q; line < group_bytes; line += 64 * QUADS) _mm_prefetch(ahead + line, PREFETCH_HINT);
}

/* The 4 activation bytes of quad q of a row, broadcast to every 32-bit lane */
static inline __m512i activation_quad(const int8_t *xq4) {
    int32_t packed;
    memcpy(&packed, xq4, 4);
    return _mm512_set1_epi32(packed);
}

/* The scales d and offsets m of outputs 16 c .. 16 c + 15 of a group (float16 in the layout; Q8_0's
 * m = -128 d, exact) */
static inline void output_scales(int kind, const uint8_t *d, const uint8_t *m, int c, __m512 *dc, __m512 *mc) {
    *dc = half16(d + 2 * LANES * c);
    *mc = kind == 4 ? half16(m + 2 * LANES * c) : _mm512_mul_ps(*dc, _mm512_set1_ps(-128.f));
}

/* One group's float step of a row, acc = (d dx) float(sum) + (m sx + acc), in this one fixed order for every
 * row count and both sweeps of block_rows_halves: what keeps rows independent */
static inline __m512 group_step(__m512 acc, __m512 dc, __m512 mc, __m512 scale, __m512 shift, __m512i sums) {
    return _mm512_fmadd_ps(_mm512_mul_ps(dc, scale), _mm512_cvtepi32_ps(sums), _mm512_fmadd_ps(mc, shift, acc));
}

/* Stores 16 outputs from output 16 c of a block whose first `width` outputs are written (the lanes past
 * width masked off: a copy through a stack buffer was a memcpy call) */
static inline void store_outputs(float *y, int c, int64_t width, __m512 values) {
    const int64_t left = width - c * LANES, lanes = left < 0 ? 0 : (left > LANES ? LANES : left);
    _mm512_mask_storeu_ps(y + c * LANES, (__mmask16)((1u << lanes) - 1u), values);
}

/* The VNNI path keeps a group's integer sums and the float accumulators in registers and loads the scales
 * with vector loads. Written as the portable code below, the compiler reset the sums through memory (a
 * memset call per group) and copied the scales through the stack: that cost more than the group's dot
 * products, and a 1536x576 Q4_1 product ran at 20-33 GMAC/s on one core against 43 (1 row), 77 (4 rows)
 * and 139-142 (64-256 rows) this way (bench/results/kernel_blocks.md). Each row's float steps run in one fixed order,
 * acc = (d dx) float(sum) + (m sx + acc), whatever the number of rows, so rows stay independent. */
static inline __attribute__((always_inline)) void block_rows(int kind, int rows, const int8_t *restrict xq,
                                                             const float *restrict dx, const float *restrict sx,
                                                             int64_t k_size, const uint8_t *restrict packed,
                                                             float *restrict y, int64_t ldy, int64_t width) {
    const int64_t groups = k_size / GROUP;
    const int64_t quad_bytes = kind == 4 ? Q4_QUAD_BYTES : Q8_QUAD_BYTES;
    const int64_t group_bytes = kind == 4 ? Q4_GROUP_BYTES : Q8_GROUP_BYTES;
    __m512 acc[4][VECS];
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < VECS; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *restrict values = packed + g * group_bytes;
        const uint8_t *restrict d = values + QUADS * quad_bytes, *restrict m = d + 2 * BLOCK;
        __m512i sums[4][VECS];
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < VECS; ++c) sums[r][c] = _mm512_setzero_si512();
        for (int q = 0; q < QUADS; ++q) {
            quad_weights_t u;
            if (rows >= PREFETCH_FROM_ROWS) prefetch_ahead(values, group_bytes, q);
            quad_weights(kind, values + q * quad_bytes, u);
            for (int r = 0; r < rows; ++r) {
                const __m512i xb = activation_quad(xq + r * k_size + g * GROUP + 4 * q);
                for (int c = 0; c < VECS; ++c) sums[r][c] = _mm512_dpbusd_epi32(sums[r][c], u[c], xb);
            }
        }
        __m512 dc[VECS], mc[VECS];
        for (int c = 0; c < VECS; ++c) output_scales(kind, d, m, c, &dc[c], &mc[c]);
        for (int r = 0; r < rows; ++r) {
            const __m512 scale = _mm512_set1_ps(dx[r * groups + g]), shift = _mm512_set1_ps(sx[r * groups + g]);
            for (int c = 0; c < VECS; ++c) acc[r][c] = group_step(acc[r][c], dc[c], mc[c], scale, shift, sums[r][c]);
        }
    }
    for (int c = 0; c < VECS; ++c)
        for (int r = 0; r < rows; ++r) store_outputs(y + r * ldy, c, width, acc[r][c]);
}

/* block_rows for 3-4 rows in two sweeps over the block, each for half of its outputs (vectors c = half and
 * half + 2: for Q4_1 the low and high nibbles of one 64-byte load per quad). One sweep for all 64 outputs
 * holds 4 rows x 4 vectors of integer sums and as many float accumulators, the whole register file, and
 * the compiler spilled them on every quad; a half needs 8 and 8. Every output gets exactly the integer sums
 * and the float steps, in the same group order, of block_rows: the results are bit for bit the same. The
 * first sweep prefetches the next groups as block_rows does; the second reads the block from the cache. */
static inline __attribute__((always_inline)) void block_rows_halves(int kind, int rows, const int8_t *restrict xq,
                                                                    const float *restrict dx,
                                                                    const float *restrict sx, int64_t k_size,
                                                                    const uint8_t *restrict packed,
                                                                    float *restrict y, int64_t ldy, int64_t width) {
    const int64_t groups = k_size / GROUP;
    const int64_t quad_bytes = kind == 4 ? Q4_QUAD_BYTES : Q8_QUAD_BYTES;
    const int64_t group_bytes = kind == 4 ? Q4_GROUP_BYTES : Q8_GROUP_BYTES;
    const __m512i low_mask = _mm512_set1_epi8(15);
    for (int half = 0; half < 2; ++half) {
        __m512 acc[4][2];
        for (int r = 0; r < rows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int64_t g = 0; g < groups; ++g) {
            const uint8_t *restrict values = packed + g * group_bytes;
            const uint8_t *restrict d = values + QUADS * quad_bytes, *restrict m = d + 2 * BLOCK;
            __m512i sums[4][2];
            for (int r = 0; r < rows; ++r) sums[r][0] = sums[r][1] = _mm512_setzero_si512();
            for (int q = 0; q < QUADS; ++q) {
                if (half == 0 && rows >= PREFETCH_FROM_ROWS) prefetch_ahead(values, group_bytes, q);
                const uint8_t *quad = values + q * quad_bytes;
                __m512i u[2];
                if (kind == 4) {
                    const __m512i both = _mm512_loadu_si512((const void *)(quad + 64 * half));
                    u[0] = _mm512_and_si512(both, low_mask);
                    u[1] = _mm512_and_si512(_mm512_srli_epi16(both, 4), low_mask);
                } else {
                    u[0] = _mm512_loadu_si512((const void *)(quad + 64 * half));
                    u[1] = _mm512_loadu_si512((const void *)(quad + 64 * (half + 2)));
                }
                for (int r = 0; r < rows; ++r) {
                    const __m512i xb = activation_quad(xq + r * k_size + g * GROUP + 4 * q);
                    sums[r][0] = _mm512_dpbusd_epi32(sums[r][0], u[0], xb);
                    sums[r][1] = _mm512_dpbusd_epi32(sums[r][1], u[1], xb);
                }
            }
            __m512 dc[2], mc[2];
            for (int i = 0; i < 2; ++i) output_scales(kind, d, m, half + 2 * i, &dc[i], &mc[i]);
            for (int r = 0; r < rows; ++r) {
                const __m512 scale = _mm512_set1_ps(dx[r * groups + g]), shift = _mm512_set1_ps(sx[r * groups + g]);
                for (int i = 0; i < 2; ++i) acc[r][i] = group_step(acc[r][i], dc[i], mc[i], scale, shift, sums[r][i]);
            }
        }
        for (int i = 0; i < 2; ++i)
            for (int r = 0; r < rows; ++r) store_outputs(y + r * ldy, half + 2 * i, width, acc[r][i]);
    }
}
#else
static inline __attribute__((always_inline)) void block_rows(int kind, int rows, const int8_t *restrict xq,
                                                             const float *restrict dx, const float *restrict sx,
                                                             int64_t k_size, const uint8_t *restrict packed,
                                                             float *restrict y, int64_t ldy, int64_t width) {
    const int64_t groups = k_size / GROUP;
    const int64_t quad_bytes = kind == 4 ? Q4_QUAD_BYTES : Q8_QUAD_BYTES;
    const int64_t group_bytes = kind == 4 ? Q4_GROUP_BYTES : Q8_GROUP_BYTES;
    f32x16 acc[4][VECS];
    memset(acc, 0, sizeof(acc));
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *restrict values = packed + g * group_bytes;
        const uint8_t *restrict scale_bytes = values + QUADS * quad_bytes;
        float d[BLOCK], m[BLOCK];
        for (int j = 0; j < BLOCK; ++j) {
            uint16_t h;
            memcpy(&h, scale_bytes + 2 * j, 2);
            d[j] = half_to_float(h);
            if (kind == 4) memcpy(&h, scale_bytes + 2 * BLOCK + 2 * j, 2);
            m[j] = kind == 4 ? half_to_float(h) : d[j] * -128.f;
        }
        i32x16 sums[4][VECS];
        memset(sums, 0, sizeof(sums));
        for (int q = 0; q < QUADS; ++q) {
            quad_weights_t u;
            quad_weights(kind, values + q * quad_bytes, u);
            for (int r = 0; r < rows; ++r) quad_dot(u, xq + r * k_size + g * GROUP + 4 * q, sums[r]);
        }
        for (int r = 0; r < rows; ++r) {
            const float scale = dx[r * groups + g], shift = sx[r * groups + g];
            for (int c = 0; c < VECS; ++c) {
                const f32x16 dc = load16(d + c * LANES), mc = load16(m + c * LANES);
                acc[r][c] += (dc * scale) * __builtin_convertvector(sums[r][c], f32x16) + mc * shift;
            }
        }
    }
    for (int r = 0; r < rows; ++r) {
        float out[BLOCK];
        memcpy(out, acc[r], sizeof(out));
        memcpy(y + r * ldy, out, (size_t)width * sizeof(float));
    }
}
#endif

#ifdef SPEC_FAST_AMX
/* The same products on AMX tiles, 16 rows at a time (a prompt's prefill, wide passes). One tile instruction
 * multiplies 16 rows by 16 outputs over a group's 32 inputs. TDPBSUD sums signed activation bytes times
 * unsigned weight bytes into int32 exactly, as VPDPBUSD does: every group's integer sums are the same
 * integers, and the float steps (group_step, in the same order) are the same, so the results are bit for bit
 * those of block_rows, and each row still depends only on itself.
 *
 * Each group's sums must leave the tiles for their float step (the scales change every 32 inputs), and the
 * tile loads, stores and products this takes per group cost more than VNNI's whole group at 2-8 rows (a
 * version that used the tiles from 2 rows was slower there); from 16 rows the tiles are faster
 * (bench/results/kernel_blocks_amx/). So only whole chunks of 16 rows use the tiles.
 *
 * Tiles: 0-3 the sums of outputs 16 c .. 16 c + 15 ([16, 16] int32), 4 the group's activations ([16, 32]
 * int8, one row of xq each), 5-7 the weights of 16 outputs ([8 quads, 16 outputs x 4 inputs] bytes, the
 * quads' output-major layout: Q8_0's packed bytes as they are, Q4_1's nibbles spread into a buffer first). */
#define AMX_ROWS 16
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config_t;

/* 1 where the kernel let this process use the tile registers (asked once; Linux refuses on a CPU or VM
 * without them), else 0 */
static int amx_permitted(void) {
    static int state = -1; /* racing first calls ask twice and get the same answer */
    if (state < 0) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return state;
}

static void amx_configure(void) {
    amx_config_t config;
    memset(&config, 0, sizeof(config));
    config.palette = 1;
    for (int t = 0; t < 4; ++t) {
        config.rows[t] = AMX_ROWS;
        config.colsb[t] = LANES * 4;
    }
    config.rows[4] = AMX_ROWS;
    config.colsb[4] = GROUP;
    for (int t = 5; t < 8; ++t) {
        config.rows[t] = QUADS;
        config.colsb[t] = LANES * 4;
    }
    _tile_loadconfig(&config);
}

/* Q4_1's quad bytes 0-63 hold outputs 0-15 (low nibbles) and 32-47 (high), bytes 64-127 outputs 16-31 and
 * 48-63: spread to one byte per value in output order, as Q8_0 stores them */
static inline void spread_nibbles(const uint8_t *restrict values, uint8_t *restrict spread) {
    const __m512i low_mask = _mm512_set1_epi8(15);
    for (int q = 0; q < QUADS; ++q) {
        const uint8_t *quad = values + q * Q4_QUAD_BYTES;
        uint8_t *out = spread + q * Q8_QUAD_BYTES;
        const __m512i a = _mm512_loadu_si512((const void *)quad), b = _mm512_loadu_si512((const void *)(quad + 64));
        _mm512_store_si512((void *)out, _mm512_and_si512(a, low_mask));
        _mm512_store_si512((void *)(out + 64), _mm512_and_si512(b, low_mask));
        _mm512_store_si512((void *)(out + 128), _mm512_and_si512(_mm512_srli_epi16(a, 4), low_mask));
        _mm512_store_si512((void *)(out + 192), _mm512_and_si512(_mm512_srli_epi16(b, 4), low_mask));
    }
}

/* The float steps of group g (every row and output) from its integer sums [rows, 64] */
static inline void amx_group_steps(int kind, int rows, const uint8_t *values, int64_t g, int64_t groups,
                                   const float *restrict dx, const float *restrict sx, const int32_t *sums,
                                   float *restrict acc) {
    const int64_t quad_bytes = kind == 4 ? Q4_QUAD_BYTES : Q8_QUAD_BYTES;
    const uint8_t *d = values + QUADS * quad_bytes, *m = d + 2 * BLOCK;
    __m512 dc[VECS], mc[VECS];
    for (int c = 0; c < VECS; ++c) output_scales(kind, d, m, c, &dc[c], &mc[c]);
    for (int r = 0; r < rows; ++r) {
        const __m512 scale = _mm512_set1_ps(dx[r * groups + g]), shift = _mm512_set1_ps(sx[r * groups + g]);
        for (int c = 0; c < VECS; ++c) {
            float *a = acc + r * BLOCK + c * LANES;
            const __m512i s = _mm512_load_si512((const void *)(sums + r * BLOCK + c * LANES));
            _mm512_store_ps(a, group_step(_mm512_load_ps(a), dc[c], mc[c], scale, shift, s));
        }
    }
}

/* One block of 64 outputs for rows 0..AMX_ROWS-1 (the tiles configured by amx_configure). The loop is
 * pipelined by one group: while the tiles multiply group g, the vector units spread group g + 1's nibbles
 * and run group g - 1's float steps, so that a tile load does not wait for the stores that wrote its bytes
 * nor a vector load for the tile store of its sums. */
static void block_rows_amx(int kind, const int8_t *restrict xq, const float *restrict dx,
                           const float *restrict sx, int64_t k_size, const uint8_t *restrict packed,
                           float *restrict y, int64_t ldy, int64_t width) {
    const int64_t groups = k_size / GROUP;
    const int64_t group_bytes = kind == 4 ? Q4_GROUP_BYTES : Q8_GROUP_BYTES;
    _Alignas(64) uint8_t spread[2][QUADS * Q8_QUAD_BYTES];
    _Alignas(64) int32_t sums[2][AMX_ROWS * BLOCK];
    _Alignas(64) float acc[AMX_ROWS * BLOCK];
    const int rows = AMX_ROWS;
    memset(acc, 0, sizeof(acc));
    if (kind == 4) spread_nibbles(packed, spread[0]);
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *restrict values = packed + g * group_bytes;
        for (int q = 0; q < QUADS; ++q) prefetch_ahead(values, group_bytes, q);
        const uint8_t *weights = kind == 4 ? spread[g & 1] : values;
        _tile_loadd(4, xq + g * GROUP, k_size);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(5, weights, Q8_QUAD_BYTES);
        _tile_dpbsud(0, 4, 5);
        _tile_loadd(6, weights + 64, Q8_QUAD_BYTES);
        _tile_dpbsud(1, 4, 6);
        _tile_loadd(7, weights + 128, Q8_QUAD_BYTES);
        _tile_dpbsud(2, 4, 7);
        _tile_loadd(5, weights + 192, Q8_QUAD_BYTES);
        _tile_dpbsud(3, 4, 5);
        int32_t *out = sums[g & 1];
        _tile_stored(0, out, BLOCK * 4);
        _tile_stored(1, out + 16, BLOCK * 4);
        _tile_stored(2, out + 32, BLOCK * 4);
        _tile_stored(3, out + 48, BLOCK * 4);
        if (kind == 4 && g + 1 < groups) spread_nibbles(values + group_bytes, spread[(g + 1) & 1]);
        if (g > 0) amx_group_steps(kind, rows, values - group_bytes, g - 1, groups, dx, sx, sums[(g - 1) & 1], acc);
    }
    amx_group_steps(kind, rows, packed + (groups - 1) * group_bytes, groups - 1, groups, dx, sx,
                    sums[(groups - 1) & 1], acc);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < VECS; ++c)
            store_outputs(y + r * ldy, c, width, _mm512_load_ps(acc + r * BLOCK + c * LANES));
}
#endif

/* Whether the products may use AMX tiles (spec_fast_block_products: 1 allowed, 0 VNNI only; tests and
 * benchmarks switch it to compare both) */
static int amx_allowed = 1;

/* request 0 or 1 switches AMX off or on (where the build and the kernel have it), anything else only asks;
 * returns 1 where the products now use AMX for chunks of 16 rows */
int64_t spec_fast_block_products(int64_t request) {
    if (request == 0 || request == 1) amx_allowed = (int)request;
#ifdef SPEC_FAST_AMX
    return amx_allowed && amx_permitted();
#else
    return 0;
#endif
}

/* One instantiation per kind and row count, so every loop has compile-time bounds. */
#ifdef SPEC_FAST_VNNI
/* Q4_1 only: the Q8_0 LM head streams 28 MB from memory, and its second sweep (from the cache, half of every
 * quad's lines) cost more than the spills it saved at 3-16 rows
 * (bench/results/kernel_blocks_halves/both_kinds/kernel_blocks.md) */
#define BLOCK_ROWS(KIND, R, ...)                                                                          \
    ((KIND) == 4 && (R) >= HALVES_FROM ? block_rows_halves(KIND, R, __VA_ARGS__) : block_rows(KIND, R, __VA_ARGS__))
#else
#define BLOCK_ROWS(KIND, R, ...) block_rows(KIND, R, __VA_ARGS__)
#endif
#define ROWS(KIND, R)                                                                                     \
    static void rows_##KIND##_##R(const int8_t *xq, const float *dx, const float *sx, int64_t k_size,     \
                                  const uint8_t *w, float *y, int64_t ldy, int64_t width) {               \
        BLOCK_ROWS(KIND, R, xq, dx, sx, k_size, w, y, ldy, width);                                        \
    }
ROWS(4, 1)
ROWS(4, 2)
ROWS(4, 3)
ROWS(4, 4)
ROWS(8, 1)
ROWS(8, 2)
ROWS(8, 3)
ROWS(8, 4)

/* y [M, ldy] (first n_size columns written) = x [M, K] (row stride ldx) times a packed Q4_1 (kind 4) or
 * Q8_0 (kind 8) weight's transpose, on up to `threads` threads (blocks of 64 outputs shared among them; each
 * output computed whole by one thread). K is a multiple of 32. Returns 0, or -1 when scratch memory could not
 * be allocated (y unwritten). */
int64_t spec_fast_mm_blocks(int64_t kind, const float *x, int64_t m_size, int64_t ldx, int64_t k_size,
                            const uint8_t *packed, int64_t n_size, float *y, int64_t ldy, int64_t threads) {
    const int64_t blocks = (n_size + BLOCK - 1) / BLOCK;
    const int64_t groups = k_size / GROUP;
    const int64_t block_bytes = groups * (kind == 4 ? Q4_GROUP_BYTES : Q8_GROUP_BYTES);
    if (m_size <= 0) return 0;
    int8_t *xq = malloc((size_t)(m_size * k_size) + 2 * sizeof(float) * (size_t)(m_size * groups));
    if (xq == NULL) return -1;
    float *dx = (float *)(void *)(xq + m_size * k_size), *sx = dx + m_size * groups;
    /* xq holds m_size * k_size bytes, a multiple of 32: dx is aligned for floats */
    quantize_rows(x, m_size, ldx, k_size, xq, dx, sx);
    /* rows [0, vector_from) in chunks of AMX_ROWS on the tiles, the rest (fewer than AMX_ROWS) by VNNI */
    int64_t vector_from = 0;
#ifdef SPEC_FAST_AMX
    if (m_size >= AMX_ROWS && spec_fast_block_products(-1)) {
        const int64_t chunks = m_size / AMX_ROWS;
        vector_from = chunks * AMX_ROWS;
#pragma omp parallel num_threads((int)threads) if (threads > 1 && blocks > 1)
        {
            int configured = 0; /* the tile configuration is per thread */
#pragma omp for schedule(static)
            for (int64_t b = 0; b < blocks; ++b) {
                const int64_t width = n_size - b * BLOCK < BLOCK ? n_size - b * BLOCK : BLOCK;
                if (!configured) {
                    amx_configure();
                    configured = 1;
                }
                /* every chunk of rows reads the block while it is in the cache */
                for (int64_t m0 = 0; m0 < vector_from; m0 += AMX_ROWS)
                    block_rows_amx((int)kind, xq + m0 * k_size, dx + m0 * groups, sx + m0 * groups,
                                   k_size, packed + b * block_bytes, y + m0 * ldy + b * BLOCK, ldy, width);
            }
            if (configured) _tile_release();
        }
    }
#endif
#pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1 && blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t *w = packed + b * block_bytes;
        const int64_t width = n_size - b * BLOCK < BLOCK ? n_size - b * BLOCK : BLOCK;
        for (int64_t m0 = vector_from; m0 < m_size; m0 += 4) {
            const int64_t rows = m_size - m0 < 4 ? m_size - m0 : 4;
            const int8_t *xm = xq + m0 * k_size;
            const float *dm = dx + m0 * groups, *sm = sx + m0 * groups;
            float *ym = y + m0 * ldy + b * BLOCK;
            if (kind == 4) {
                switch (rows) {
                    case 1: rows_4_1(xm, dm, sm, k_size, w, ym, ldy, width); break;
                    case 2: rows_4_2(xm, dm, sm, k_size, w, ym, ldy, width); break;
                    case 3: rows_4_3(xm, dm, sm, k_size, w, ym, ldy, width); break;
                    default: rows_4_4(xm, dm, sm, k_size, w, ym, ldy, width); break;
                }
            } else {
                switch (rows) {
                    case 1: rows_8_1(xm, dm, sm, k_size, w, ym, ldy, width); break;
                    case 2: rows_8_2(xm, dm, sm, k_size, w, ym, ldy, width); break;
                    case 3: rows_8_3(xm, dm, sm, k_size, w, ym, ldy, width); break;
                    default: rows_8_4(xm, dm, sm, k_size, w, ym, ldy, width); break;
                }
            }
        }
    }
    free(xq);
    return 0;
}
