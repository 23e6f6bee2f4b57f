/* One Llama-family decoder layer of the lean forward on the CPU, in one call.
 *
 * Per token, the Python layer issues about twenty torch operations (two norms, rotary embedding, cache
 * writes, attention, SiLU, residual adds) around its four matrix products; at SmolLM2's size each costs
 * more in dispatch than in arithmetic, and together they took half of a one-token pass. Here the whole
 * layer runs in C on the residual stream x [M, H] (M = B x Q rows, in place):
 *
 *   h = rms_norm(x) ; qkv = h Wqkv^T (+ bias) ; rotate q, k ; store k, v in the cache at past + q
 *   a = attention(q, cached k, v; mask) ; x += a Wo^T (+ bias)
 *   h = rms_norm(x) ; [g, u] = h Wgu^T ; x += (silu(g) * u) Wdown^T
 *
 * The products are those of kernels.c (packed float32) and blocks.c (Q4_1, Q8_0). Attention is computed per
 * key/value head for a chunk of one cache row's query rows at a time (the query heads of a group, and the
 * chunk's rows, share each key read), each score, sum and weighted sum in a fixed order over the cache slots,
 * skipping the slots the mask excludes (their softmax weight would be exactly zero): a query's output depends
 * only on its own vector and the keys and values it attends, never on which other rows share the call. Together
 * with the batch-invariant products this makes a verification pass give every token bit for bit the
 * logits a plain decoding step gives it. The arithmetic is float32 (HF's precision); the cache holds keys and
 * values as float32 or, with kv_half, as IEEE float16 (kv_at below).
 * The products and the attention tasks are shared among `threads` OpenMP threads, each output computed
 * whole by one thread, so the thread count changes no result.
 *
 * Layouts: x [M, H] row-major; cos, sin [M, D] (the rotary table's rows for each token's position, the
 * attention scaling folded in); mask [B, Q, past + Q] additive float32 or NULL (causal); keys and values
 * [B, H_kv, capacity, D] float32 (or float16 bits) with capacity >= past + Q (the caller grows the buffers).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

void spec_fast_mm_f32(const float *x, int64_t m_size, int64_t ldx, int64_t k_size, const float *packed,
                      int64_t n_size, float *y, int64_t ldy, int64_t threads);
int64_t spec_fast_mm_blocks(int64_t kind, const float *x, int64_t m_size, int64_t ldx, int64_t k_size,
                            const uint8_t *packed, int64_t n_size, float *y, int64_t ldy, int64_t threads);
void spec_fast_first_max(const float *x, int64_t rows, int64_t size, int64_t ldx, int64_t *out);

#define LANES 16
typedef float f32x16 __attribute__((vector_size(64), aligned(4)));

/* The weights of one layer; native.py mirrors this struct with ctypes (same field order). */
typedef struct {
    int64_t hidden, heads, kv_heads, head_dim, intermediate;
    int64_t qkv_kind, o_kind, gate_up_kind, down_kind; /* 0: packed float32, 4: Q4_1, 8: Q8_0 */
    const void *qkv, *o, *gate_up, *down;
    const float *qkv_bias, *o_bias; /* NULL: no bias */
    const float *norm1, *norm2;
    double eps1, eps2;
} spec_fast_layer_weights;

/* head sizes up to this keep the attention's weighted sum in registers (larger ones take a plain loop) */
#define MAX_DIM 256
/* query heads per key/value head that the AVX-512 scoring keeps in registers (more take the scalar path) */
#define MAX_GROUP 8
/* query heads (query rows of one cache row times a group's heads) whose scores one sweep over a key/value head's
 * keys computes together (more rows take more sweeps) */
#define MAX_SHARED 16
/* slots ahead whose keys and values the AVX-512 attention asks for while it reads the current one (a
 * prefetch past the end of the cache never faults) */
#ifndef KV_AHEAD
#define KV_AHEAD 16
#endif

/* The cache in float16 (kv_half; llama.cpp's default cache type) halves the bytes every attention step reads,
 * which grow with the context and the batch. An entry is rounded to float16 once, to nearest-even, when the
 * layer stores it, and widened exactly whenever it is read: a token's cached keys and values are the same bits
 * whichever pass stored them, so a pass still gives every token what a one-token step gives it. */
float spec_fast_half_to_float(uint16_t h);

/* float32 -> IEEE float16 bits, rounded to nearest-even with overflow to infinity (what VCVTPS2PH does in that
 * rounding mode; the portable build has no such instruction) */
static uint16_t float_to_half(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof(bits));
    const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu)); /* NaN, quiet */
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up round to infinity */
    if (magnitude < 0x38800000u) { /* below 2^-14: a subnormal float16 (units of 2^-24), or zero */
        float scaled;
        memcpy(&scaled, &magnitude, sizeof(scaled));
        return (uint16_t)(sign | (uint16_t)nearbyintf(scaled * 16777216.f)); /* exact scaling; 1024 is 2^-14 */
    }
    const uint32_t rebased = magnitude - 0x38000000u; /* exponent bias 127 -> 15 */
    return (uint16_t)(sign | ((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13)); /* a carry bumps the exponent */
}

/* out[i] = the float16 bits of x[i] as the cache stores them (for the tests, which hold both builds to
 * torch's conversion) */
void spec_fast_round_half(const float *x, int64_t n, uint16_t *out) {
    for (int64_t i = 0; i < n; ++i) out[i] = float_to_half(x[i]);
}

/* Cache element `index` (in elements) of a float32 or float16 buffer, as float32 */
static inline float kv_at(const void *base, int64_t index, int half) {
    return half ? spec_fast_half_to_float(((const uint16_t *)base)[index]) : ((const float *)base)[index];
}

/* The address of cache element `index` */
static inline const void *kv_address(const void *base, int64_t index, int half) {
    return (const char *)base + index * (half ? 2 : 4);
}

/* dim values of src stored as cache elements index .. index + dim - 1 */
static void store_kv(void *base, int64_t index, const float *src, int64_t dim, int half) {
    if (!half) {
        memcpy((float *)base + index, src, (size_t)dim * sizeof(float));
        return;
    }
    uint16_t *out = (uint16_t *)base + index;
    for (int64_t i = 0; i < dim; ++i) out[i] = float_to_half(src[i]);
}

/* An additive mask at or below this excludes the slot (torch's finfo(float32).min and -inf both do). */
#define EXCLUDED (-1e30f)

/* y = x W^T (+ bias); 0, or -1 when a block product could not allocate its scratch memory */
static int64_t linear(int64_t kind, const void *w, const float *bias, const float *x, int64_t rows,
                      int64_t k_size, int64_t n_size, float *y, int64_t threads) {
    if (kind == 0) {
        spec_fast_mm_f32(x, rows, k_size, k_size, (const float *)w, n_size, y, n_size, threads);
    } else if (spec_fast_mm_blocks(kind, x, rows, k_size, k_size, (const uint8_t *)w, n_size, y, n_size,
                                   threads) != 0) {
        return -1;
    }
    if (bias != NULL) {
        for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < n_size; ++j) y[r * n_size + j] += bias[j];
        }
    }
    return 0;
}

/* HF's RMSNorm: x / sqrt(mean(x^2) + eps), then times the weight (the mean accumulated in double). */
static void rms_norm(const float *x, int64_t rows, int64_t size, const float *weight, double eps, float *out) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = x + r * size;
        double squares = 0.0;
        for (int64_t j = 0; j < size; ++j) squares += (double)row[j] * (double)row[j];
        const float scale = (float)(1.0 / sqrt(squares / (double)size + eps));
        for (int64_t j = 0; j < size; ++j) out[r * size + j] = weight[j] * (row[j] * scale);
    }
}

/* x <- x cos + rotate_half(x) sin for one head vector of even length dim (HF's rotate_half convention). */
static void rotate(float *x, const float *cos, const float *sin, int64_t dim) {
    const int64_t half = dim / 2;
    float turned[dim];
    for (int64_t i = 0; i < half; ++i) {
        turned[i] = -x[i + half];
        turned[i + half] = x[i];
    }
    for (int64_t i = 0; i < dim; ++i) x[i] = x[i] * cos[i] + turned[i] * sin[i];
}

static inline float dot(const float *a, const float *b, int64_t size) {
    f32x16 acc = {0};
    int64_t i = 0;
    for (; i + LANES <= size; i += LANES) {
        f32x16 va, vb;
        memcpy(&va, a + i, sizeof(va));
        memcpy(&vb, b + i, sizeof(vb));
        acc += va * vb;
    }
    /* a fixed pairwise reduction of the 16 lanes (a sequential one is a 16-add dependency chain) */
    float lanes[LANES];
    memcpy(lanes, &acc, sizeof(lanes));
    for (int width = LANES / 2; width > 0; width /= 2) {
        for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
    }
    float sum = lanes[0];
    for (; i < size; ++i) sum += a[i] * b[i];
    return sum;
}

/* exp(v - shift) of 16 lanes, the same function in every lane (so a value's exp does not depend on which lane it sits
 * in): AVX-512 range reduction and polynomial (Cephes' expf coefficients, about 1 ulp), expf elsewhere. */
#if defined(__AVX512F__)
#include <immintrin.h>
/* v <- exp(v - shift), and exactly 0 where v is -inf (an excluded slot) */
static inline void exp16_shifted(float *v, float shift) {
    const __m512 raw = _mm512_loadu_ps(v);
    const __mmask16 kept = _mm512_cmp_ps_mask(raw, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
    __m512 x = _mm512_max_ps(_mm512_sub_ps(raw, _mm512_set1_ps(shift)), _mm512_set1_ps(-104.f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    _mm512_storeu_ps(v, _mm512_maskz_mov_ps(kept, _mm512_scalef_ps(p, n)));
}
#else
static inline void exp16_shifted(float *v, float shift) {
    for (int l = 0; l < LANES; ++l) v[l] = v[l] == -INFINITY ? 0.f : expf(v[l] - shift);
}
#endif

/* out = silu(gate) * up = gate / (1 + exp(-gate)) * up, element by element (each element's value depends on
 * that element only). With AVX-512 the exponential is exp16_shifted's, 16 lanes at a time, instead of one expf
 * call per element through the PLT. */
static void silu_times(const float *gate, const float *up, int64_t size, float *out) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + LANES <= size; i += LANES) {
        float e[LANES];
        _mm512_storeu_ps(e, _mm512_sub_ps(_mm512_setzero_ps(), _mm512_loadu_ps(gate + i)));
        exp16_shifted(e, 0.f);
        const __m512 g = _mm512_loadu_ps(gate + i);
        const __m512 activated = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), _mm512_loadu_ps(e)));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(activated, _mm512_loadu_ps(up + i)));
    }
#endif
    for (; i < size; ++i) out[i] = gate[i] / (1.f + expf(-gate[i])) * up[i];
}

static inline int excluded(const float *mask, int64_t j, int64_t limit) {
    return mask == NULL ? j >= limit : mask[j] <= EXCLUDED;
}

/* the slots past the last one a query can attend: with a causal limit (no mask) none at or past it */
static inline int64_t attended_end(const float *mask, int64_t limit, int64_t slots) {
    return mask == NULL && limit < slots ? limit : slots;
}

#if defined(__AVX512F__)
/* 16 cache elements from `index` as float32 (float16 widened exactly) */
static inline __attribute__((always_inline)) __m512 load_kv16(const void *base, int64_t index, int half) {
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)kv_address(base, index, 1)))
                : _mm512_loadu_ps((const float *)base + index);
}

/* asks for the cache lines of the dim elements from `index` */
static inline __attribute__((always_inline)) void prefetch_kv(const void *base, int64_t index, int64_t dim, int half) {
    const char *first = (const char *)kv_address(base, index, half);
    for (int64_t offset = 0; offset < dim * (half ? 2 : 4); offset += 64) _mm_prefetch(first + offset, _MM_HINT_T0);
}

/* prefetch_kv into the L2 cache only: for values the weighted sum reads after the scores and the softmax */
static inline __attribute__((always_inline)) void prefetch_kv_l2(const void *base, int64_t index, int64_t dim,
                                                                 int half) {
    const char *first = (const char *)kv_address(base, index, half);
    for (int64_t offset = 0; offset < dim * (half ? 2 : 4); offset += 64) _mm_prefetch(first + offset, _MM_HINT_T1);
}
#endif

/* o [dim] = inverse * sum over the attended slots j, in slot order, of p[j] v_j (dim a multiple of 16, at most
 * MAX_DIM). Each step is one fused multiply-add per lane, acc = p[j] v + acc. With AVX-512 the sums stay in
 * registers: a generic vector loop here kept them in memory and re-read each value through a stack copy
 * whose two 32-byte stores a 64-byte load could not forward from, which made this loop most of the attention's
 * time in a profile of decoding. */
static inline __attribute__((always_inline)) void weighted_sum(const float *p, const void *values, int64_t slots,
                                                               const float *mask, int64_t limit, int64_t dim,
                                                               float inverse, float *o, int half) {
    const int64_t vecs = dim / LANES;
#if defined(__AVX512F__)
    __m512 acc[MAX_DIM / LANES];
    for (int64_t c = 0; c < vecs; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t j = 0, end = attended_end(mask, limit, slots); j < end; ++j) {
        if (excluded(mask, j, limit)) continue;
        const __m512 weight = _mm512_set1_ps(p[j]);
        for (int64_t c = 0; c < vecs; ++c)
            acc[c] = _mm512_fmadd_ps(weight, load_kv16(values, j * dim + c * LANES, half), acc[c]);
    }
    for (int64_t c = 0; c < vecs; ++c)
        _mm512_storeu_ps(o + c * LANES, _mm512_mul_ps(acc[c], _mm512_set1_ps(inverse)));
#else
    f32x16 acc[MAX_DIM / LANES];
    for (int64_t c = 0; c < vecs; ++c) acc[c] = (f32x16){0};
    for (int64_t j = 0, end = attended_end(mask, limit, slots); j < end; ++j) {
        if (excluded(mask, j, limit)) continue;
        for (int64_t c = 0; c < vecs; ++c) {
            f32x16 v;
            for (int l = 0; l < LANES; ++l) v[l] = kv_at(values, j * dim + c * LANES + l, half);
            acc[c] += p[j] * v;
        }
    }
    for (int64_t c = 0; c < vecs; ++c) {
        const f32x16 scaled = acc[c] * inverse;
        memcpy(o + c * LANES, &scaled, sizeof(scaled));
    }
#endif
}

#if defined(__AVX512F__)
/* weighted_sum for every head of a group in one sweep over the values: o + h dim = (1 / t_h) * sum over the
 * attended slots j, in slot order, of p[h stride + j] v_j, where t_h = the sum of p[h stride + j] over the same
 * slots in the same order (the softmax's normaliser, computed here instead of in a sweep of its own). Each
 * value is read once for the group instead of once per head, and every head's sums take the steps of
 * weighted_sum in the same order, acc = p v + acc: the same bits. For compile-time `group` and `dim` (group *
 * dim / 16 accumulators in registers). With next_keys (the keys the layer's next attention task scores; NULL
 * for the last), slot j's key there is asked for into L2 as slot j's value is read, so the next scores pass
 * starts from L2 instead of waiting for memory (bench/results/attention.md). */
static inline __attribute__((always_inline)) void group_weighted_sums(const float *p, int64_t stride,
                                                                      const void *values, const void *next_keys,
                                                                      int64_t slots,
                                                                      const float *mask, int64_t limit, int group,
                                                                      int dim, float *out, int half) {
    const int vecs = dim / LANES;
    __m512 acc[MAX_GROUP][MAX_DIM / LANES];
    float total[MAX_GROUP];
    for (int h = 0; h < group; ++h) {
        total[h] = 0.f;
        for (int c = 0; c < vecs; ++c) acc[h][c] = _mm512_setzero_ps();
    }
    for (int64_t j = 0, end = attended_end(mask, limit, slots); j < end; ++j) {
        if (excluded(mask, j, limit)) continue;
        __m512 v[MAX_DIM / LANES];
        prefetch_kv(values, (j + KV_AHEAD) * dim, dim, half);
        if (next_keys != NULL) prefetch_kv_l2(next_keys, j * dim, dim, half);
        for (int c = 0; c < vecs; ++c) v[c] = load_kv16(values, j * dim + c * LANES, half);
        for (int h = 0; h < group; ++h) {
            const float w = p[h * stride + j];
            total[h] += w;
            const __m512 weight = _mm512_set1_ps(w);
            for (int c = 0; c < vecs; ++c) acc[h][c] = _mm512_fmadd_ps(weight, v[c], acc[h][c]);
        }
    }
    for (int h = 0; h < group; ++h) {
        const __m512 inverse = _mm512_set1_ps(1.f / total[h]);
        for (int c = 0; c < vecs; ++c) _mm512_storeu_ps(out + h * dim + c * LANES, _mm512_mul_ps(acc[h][c], inverse));
    }
}
#endif

#if defined(__AVX512F__)
/* The scores of attend_group (below) on AVX-512: the group's queries stay in registers and each key is read
 * from the cache once for all of them; a score is the lanes' products summed by one fixed reduction
 * (_mm512_reduce_add_ps), as the scalar path sums them in one fixed order. This took a sixth of the time of
 * the scalar path, whose per-slot reduction through memory made attention cost about a third of a decoding
 * pass at 150 slots. Keys are loaded where they are used: staged in an array of a run-time length, each was
 * copied by a memcpy call per slot. */
static inline __attribute__((always_inline)) void group_scores(const float *q, int64_t group, const void *keys,
                                                               int64_t slots, const float *mask, int64_t limit,
                                                               int64_t dim, float scale, float *scores,
                                                               int64_t stride, float *best, int half) {
    const int64_t vecs = dim / LANES;
    __m512 queries[MAX_GROUP][MAX_DIM / LANES];
    for (int64_t h = 0; h < group; ++h)
        for (int64_t c = 0; c < vecs; ++c) queries[h][c] = _mm512_loadu_ps(q + h * dim + c * LANES);
    for (int64_t j = 0; j < stride; ++j) {
        if (j >= slots || excluded(mask, j, limit)) {
            for (int64_t h = 0; h < group; ++h) scores[h * stride + j] = -INFINITY;
            continue;
        }
        const int64_t key = j * dim;
        prefetch_kv(keys, key + KV_AHEAD * dim, dim, half);
        for (int64_t h = 0; h < group; ++h) {
            __m512 acc = _mm512_mul_ps(queries[h][0], load_kv16(keys, key, half));
            for (int64_t c = 1; c < vecs; ++c)
                acc = _mm512_fmadd_ps(queries[h][c], load_kv16(keys, key + c * LANES, half), acc);
            const float s = _mm512_reduce_add_ps(acc) * scale + (mask == NULL ? 0.f : mask[j]);
            if (s > best[h]) best[h] = s;
            scores[h * stride + j] = s;
        }
    }
}
#endif

#if defined(__AVX512F__)
/* The 16 sums _mm512_reduce_add_ps(v[i]) in one vector, v[i]'s in lane 4 (i % 4) + i / 4, by the same pairwise
 * tree (lanes l and l + 8, then l and l + 4, l and l + 2, l and l + 1; a float sum does not depend on the order
 * of its two operands), each level's additions for several vectors in one instruction: 15 additions and 30
 * shuffles where 16 reductions take 64 and 48 */
static inline __attribute__((always_inline)) __m512 sums16(const __m512 v[LANES]) {
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < 8; ++i)
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 4; ++i)
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    for (int i = 0; i < 2; ++i)
        y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* group_scores 16 slots at a time: each slot's products and its fixed reduction are group_scores' (the same
 * bits), the 16 reductions of a head done together by sums16, and the scale, mask and exclusion applied to
 * the 16 scores at once. Reducing each score on its own and keeping the running maximum in scalar code took
 * two thirds of the attention's time at 544 slots (about 3.1 of 4.6 us per slot and row of a SmolLM2 pass,
 * scratch). A slot at or past `slots` in the last block reads slot slots - 1 (within the cache) and scores
 * -inf; the mask is read only below `slots`. While it reads a block's keys it asks for the values of the
 * same slots ahead into L2 (a group's values at 600 slots are 150 KB): the weighted sum after the softmax then
 * reads them from L2 instead of streaming them from memory on their own, and both streams are in flight
 * together (bench/results/attention.md).
 * It scores `rows` consecutive query rows of one cache row at once (a verification pass's tokens, a prompt's
 * chunk; one row for a one-token pass): row r's queries at q + r q_stride, its mask row at mask + r slots
 * (or its limit limit + r), its group's scores at scores + r group stride and maxima at best + r group. Each
 * block of 16 keys is read from the cache once for the rows * group query heads instead of once per row, and
 * every score takes the same steps whatever the rows beside it: the same bits as scoring each row alone. */
static inline __attribute__((always_inline)) void block_scores(const float *q, int64_t q_stride, int64_t rows,
                                                               int64_t group, const void *keys, const void *values,
                                                               int64_t slots, const float *mask, int64_t limit,
                                                               int dim, float scale, float *scores, int64_t stride,
                                                               float *best, int half) {
    const int vecs = dim / LANES;
    __m512 most[MAX_SHARED];
    for (int64_t h = 0; h < rows * group; ++h) most[h] = _mm512_set1_ps(-INFINITY);
    for (int64_t j0 = 0; j0 < stride; j0 += LANES) {
        if (mask == NULL && j0 >= limit + rows - 1) { /* past every row's causal limit */
            for (int64_t h = 0; h < rows * group; ++h)
                _mm512_storeu_ps(scores + h * stride + j0, _mm512_set1_ps(-INFINITY));
            continue;
        }
        const int64_t left = slots - j0;
        const __mmask16 present = (__mmask16)(left >= LANES ? 0xFFFFu : (1u << left) - 1u);
        /* lane 4 (i % 4) + i / 4 of sums16 holds input i: input i is slot j0 + 4 (i % 4) + i / 4 */
        int64_t key[LANES];
        for (int i = 0; i < LANES; ++i) {
            const int64_t slot = j0 + 4 * (i % 4) + i / 4;
            key[i] = (slot < slots ? slot : slots - 1) * dim;
            prefetch_kv(keys, (j0 + KV_AHEAD + i) * dim, dim, half);
            prefetch_kv_l2(values, (j0 + KV_AHEAD + i) * dim, dim, half);
        }
        for (int64_t r = 0; r < rows; ++r) {
            const float *row_mask = mask == NULL ? NULL : mask + r * slots;
            const int64_t open = (row_mask == NULL ? limit + r : slots) - j0;
            __mmask16 attended = (__mmask16)(open >= LANES ? 0xFFFFu : (open <= 0 ? 0u : (1u << open) - 1u)) & present;
            __m512 added = _mm512_setzero_ps();
            if (row_mask != NULL) {
                added = _mm512_maskz_loadu_ps(present, row_mask + j0);
                attended &= _mm512_cmp_ps_mask(added, _mm512_set1_ps(EXCLUDED), _CMP_NLE_UQ);
            }
            for (int64_t h = 0; h < group; ++h) {
                const float *own_q = q + r * q_stride + h * dim;
                __m512 query[MAX_DIM / LANES], sums[LANES];
                for (int c = 0; c < vecs; ++c) query[c] = _mm512_loadu_ps(own_q + c * LANES);
                for (int i = 0; i < LANES; ++i) {
                    __m512 acc = _mm512_mul_ps(query[0], load_kv16(keys, key[i], half));
                    for (int c = 1; c < vecs; ++c)
                        acc = _mm512_fmadd_ps(query[c], load_kv16(keys, key[i] + c * LANES, half), acc);
                    sums[i] = acc;
                }
                const __m512 raw = _mm512_add_ps(_mm512_mul_ps(sums16(sums), _mm512_set1_ps(scale)), added);
                const __m512 s = _mm512_mask_blend_ps(attended, _mm512_set1_ps(-INFINITY), raw);
                most[r * group + h] = _mm512_max_ps(s, most[r * group + h]);
                _mm512_storeu_ps(scores + (r * group + h) * stride + j0, s);
            }
        }
    }
    for (int64_t h = 0; h < rows * group; ++h) best[h] = _mm512_reduce_max_ps(most[h]);
}
#endif

/* The rest of attend_group once its scores and their maxima `best` are in `scores` (overwritten with the
 * weights): the softmax and the weighted sums of the values into out [group, dim]. */
static inline __attribute__((always_inline)) void finish_group(const float *best, int64_t group, const void *values,
                                                               const void *next_keys, int64_t slots,
                                                               const float *mask, int64_t limit, int64_t dim,
                                                               float *scores, int64_t stride, float *out, int half) {
    for (int64_t i = 0; i < group * dim; ++i) out[i] = 0.f;
    if (best[0] == -INFINITY) return; /* nothing attended (a fully masked padding row): zeros */
    for (int64_t h = 0; h < group; ++h)
        for (int64_t j0 = 0; j0 < stride; j0 += LANES) exp16_shifted(scores + h * stride + j0, best[h]);
    /* each head's sum of the weights runs in slot order, so that it does not depend on which slots the pass put
     * the attended entries in (an excluded slot's weight is exactly 0 and changes no sum) */
#if defined(__AVX512F__)
    /* 64-wide heads in groups of 3 (SmolLM2) or 4: 12 or 16 accumulators and 4 values fit the 32 registers
     * (128-wide groups of 4 would spill them every slot, so they keep the per-head sums); the sums of the
     * weights ride along in the same sweep */
    if (dim == 64 && group == 3) {
        group_weighted_sums(scores, stride, values, next_keys, slots, mask, limit, 3, 64, out, half);
        return;
    }
    if (dim == 64 && group == 4) {
        group_weighted_sums(scores, stride, values, next_keys, slots, mask, limit, 4, 64, out, half);
        return;
    }
#endif
    float inverse[group];
    for (int64_t h = 0; h < group; ++h) {
        float total = 0.f;
        for (int64_t j = 0; j < slots; ++j) total += scores[h * stride + j];
        inverse[h] = 1.f / total;
    }
    for (int64_t h = 0; h < group; ++h) {
        const float *p = scores + h * stride;
        float *o = out + h * dim;
        if (dim % LANES == 0 && dim <= MAX_DIM) {
            /* the weighted sum in registers (o would be reloaded around every store otherwise), with the
             * head size a compile-time constant for the common sizes */
            if (dim == 64) {
                weighted_sum(p, values, slots, mask, limit, 64, inverse[h], o, half);
            } else if (dim == 128) {
                weighted_sum(p, values, slots, mask, limit, 128, inverse[h], o, half);
            } else {
                weighted_sum(p, values, slots, mask, limit, dim, inverse[h], o, half);
            }
        } else {
            for (int64_t j = 0, end = attended_end(mask, limit, slots); j < end; ++j) {
                if (excluded(mask, j, limit)) continue;
                for (int64_t i = 0; i < dim; ++i) o[i] += p[j] * kv_at(values, j * dim + i, half);
            }
            for (int64_t i = 0; i < dim; ++i) o[i] *= inverse[h];
        }
    }
}

/* Attention of the `group` query heads that share one key/value head (grouped-query attention): head h's
 * query at q + h dim, its output at out + h dim. out = softmax over the attended slots of (q . k_j) scale +
 * mask_j, times v_j; a slot is attended when mask is NULL and j < limit, or when mask[j] is above EXCLUDED.
 * Each key and value is read once for the whole group. Per head, the scores, their maximum, the sum of the
 * weights and the weighted sum of values run in slot order over the attended slots only (an excluded slot
 * has weight exactly 0), and the exponential of a slot's score does not depend on the other slots: the
 * output depends only on the attended keys and values. scores: group x stride floats (stride >= slots
 * rounded up to 16). */
static inline __attribute__((always_inline)) void attend_group(const float *q, int64_t group, const void *keys,
                                                               const void *values, const void *next_keys,
                                                               int64_t slots, const float *mask,
                                                               int64_t limit, int64_t dim, float scale,
                                                               float *scores, int64_t stride, float *out, int half) {
    float best[group];
    for (int64_t h = 0; h < group; ++h) best[h] = -INFINITY;
#if defined(__AVX512F__)
    if (dim % LANES == 0 && dim <= MAX_DIM && group <= MAX_GROUP) {
        if (dim == 64) {
            block_scores(q, 0, 1, group, keys, values, slots, mask, limit, 64, scale, scores, stride, best, half);
        } else if (dim == 128) {
            block_scores(q, 0, 1, group, keys, values, slots, mask, limit, 128, scale, scores, stride, best, half);
        } else {
            group_scores(q, group, keys, slots, mask, limit, dim, scale, scores, stride, best, half);
        }
    } else
#endif
    {
        float key[dim]; /* a float16 key widened once for the group */
        for (int64_t j = 0; j < stride; ++j) {
            const int skip = j >= slots || excluded(mask, j, limit);
            if (!skip && half)
                for (int64_t i = 0; i < dim; ++i) key[i] = kv_at(keys, j * dim + i, 1);
            for (int64_t h = 0; h < group; ++h) {
                float s = -INFINITY;
                if (!skip) {
                    const float *k = half ? key : (const float *)keys + j * dim;
                    s = dot(q + h * dim, k, dim) * scale + (mask == NULL ? 0.f : mask[j]);
                    if (s > best[h]) best[h] = s;
                }
                scores[h * stride + j] = s;
            }
        }
    }
    finish_group(best, group, values, next_keys, slots, mask, limit, dim, scores, stride, out, half);
}

/* attend_group for `rows` consecutive query rows of one cache row that share a key/value head: row i's
 * queries at q + i q_stride, its output at out + i out_stride, its mask row at mask + i slots (or its limit
 * limit + i). With AVX-512 and 64- or 128-wide heads the rows' scores come from one sweep over the keys
 * (block_scores), a verification pass's tokens and a prompt's chunk reading each key once instead of
 * once per token; every row's output is still the one attend_group gives it alone, bit for bit.
 * next_keys goes to the last row's weighted sums. scores: rows x group x stride floats. */
static inline __attribute__((always_inline)) void attend_rows(const float *q, int64_t q_stride, int64_t rows,
                                                              int64_t group, const void *keys, const void *values,
                                                              const void *next_keys, int64_t slots,
                                                              const float *mask, int64_t limit, int64_t dim,
                                                              float scale, float *scores, int64_t stride,
                                                              float *out, int64_t out_stride, int half) {
#if defined(__AVX512F__)
    if (rows > 1 && rows * group <= MAX_SHARED && (dim == 64 || dim == 128)) {
        float best[MAX_SHARED];
        if (dim == 64)
            block_scores(q, q_stride, rows, group, keys, values, slots, mask, limit, 64, scale, scores, stride,
                         best, half);
        else
            block_scores(q, q_stride, rows, group, keys, values, slots, mask, limit, 128, scale, scores, stride,
                         best, half);
        for (int64_t r = 0; r < rows; ++r)
            finish_group(best + r * group, group, values, r + 1 == rows ? next_keys : NULL, slots,
                         mask == NULL ? NULL : mask + r * slots, limit + r, dim, scores + r * group * stride, stride,
                         out + r * out_stride, half);
        return;
    }
#endif
    for (int64_t r = 0; r < rows; ++r)
        attend_group(q + r * q_stride, group, keys, values, r + 1 == rows ? next_keys : NULL, slots,
                     mask == NULL ? NULL : mask + r * slots, limit + r, dim, scale, scores, stride,
                     out + r * out_stride, half);
}

/* One decoder layer over x [batch * num_query, hidden] in place (see the header). Returns 0, or -1 when
 * scratch memory could not be allocated (x is then partly updated: the caller passes a copy and drops it). */
int64_t spec_fast_layer(const spec_fast_layer_weights *w, float *x, int64_t batch, int64_t num_query,
                        const float *cos, const float *sin, const float *mask, int64_t past, void *keys,
                        void *values, int64_t capacity, int64_t threads, int64_t kv_half) {
    const int half = kv_half != 0;
    const int64_t rows = batch * num_query, hidden = w->hidden, dim = w->head_dim;
    const int64_t heads = w->heads, kv_heads = w->kv_heads, group = heads / kv_heads;
    const int64_t qkv_width = (heads + 2 * kv_heads) * dim, inter = w->intermediate, slots = past + num_query;
    if (threads < 1) threads = 1;
    const int64_t stride = (slots + LANES - 1) / LANES * LANES;
    /* query rows per attention task: as many as share a key sweep, fewer where threads would go idle (at least
     * two tasks per thread) */
    int64_t chunk_rows = group <= MAX_SHARED ? MAX_SHARED / group : 1;
    if (threads > 1) {
        const int64_t wanted = (2 * threads + batch * kv_heads - 1) / (batch * kv_heads); /* chunks per row */
        const int64_t fitting = (num_query + wanted - 1) / wanted;
        if (fitting < chunk_rows) chunk_rows = fitting;
    }
    if (chunk_rows > num_query) chunk_rows = num_query;
    if (chunk_rows < 1) chunk_rows = 1;
    const int64_t chunks = (num_query + chunk_rows - 1) / chunk_rows, tasks = batch * chunks * kv_heads;
    const size_t floats = (size_t)(rows * hidden + rows * qkv_width + rows * heads * dim + rows * hidden +
                                   rows * 2 * inter + rows * inter + threads * chunk_rows * group * stride);
    float *scratch = malloc(floats * sizeof(float));
    if (scratch == NULL) return -1;
    float *normed = scratch, *qkv = normed + rows * hidden, *attended = qkv + rows * qkv_width;
    float *projected = attended + rows * heads * dim, *gate_up = projected + rows * hidden;
    float *activated = gate_up + rows * 2 * inter, *scores = activated + rows * inter;
    const float scale = 1.f / sqrtf((float)dim);

    rms_norm(x, rows, hidden, w->norm1, w->eps1, normed);
    if (linear(w->qkv_kind, w->qkv, w->qkv_bias, normed, rows, hidden, qkv_width, qkv, threads) != 0) {
        free(scratch);
        return -1;
    }
    for (int64_t m = 0; m < rows; ++m) {
        const int64_t b = m / num_query, slot = past + m % num_query;
        float *row = qkv + m * qkv_width;
        for (int64_t h = 0; h < heads + kv_heads; ++h) rotate(row + h * dim, cos + m * dim, sin + m * dim, dim);
        for (int64_t g = 0; g < kv_heads; ++g) {
            const int64_t at = ((b * kv_heads + g) * capacity + slot) * dim;
            store_kv(keys, at, row + (heads + g) * dim, dim, half);
            store_kv(values, at, row + (heads + kv_heads + g) * dim, dim, half);
        }
    }
    /* one task per (cache row, chunk of its query rows, key/value head), each with its own thread's score
     * buffer: a chunk's rows share each key read (attend_rows), and with several threads the chunks are cut
     * small enough for every thread to get tasks */
#pragma omp parallel for schedule(static) num_threads((int)threads) if (threads > 1 && tasks > 1)
    for (int64_t task = 0; task < tasks; ++task) {
        const int64_t b = task / (chunks * kv_heads), chunk = task / kv_heads % chunks, g = task % kv_heads;
        const int64_t q = chunk * chunk_rows, count = num_query - q < chunk_rows ? num_query - q : chunk_rows;
        const int64_t m = b * num_query + q;
        const float *mask_rows = mask == NULL ? NULL : mask + m * slots;
        const int64_t at = (b * kv_heads + g) * capacity * dim;
#ifdef _OPENMP
        float *own_scores = scores + (int64_t)omp_get_thread_num() * chunk_rows * group * stride;
#else
        float *own_scores = scores;
#endif
        const void *own_keys = kv_address(keys, at, half), *own_values = kv_address(values, at, half);
        /* the keys of the next task (its row's b, its head): the weighted sums ask for them ahead */
        const int64_t next = task + 1;
        const int64_t next_at = (next / (chunks * kv_heads) * kv_heads + next % kv_heads) * capacity * dim;
        const void *next_keys = next < tasks ? kv_address(keys, next_at, half) : NULL;
        float *own_out = attended + (m * heads + g * group) * dim;
        const float *own_q = qkv + m * qkv_width + g * group * dim;
        /* one instance per cache type, each with compile-time element reads */
        if (half)
            attend_rows(own_q, qkv_width, count, group, own_keys, own_values, next_keys, slots, mask_rows,
                        past + q + 1, dim, scale, own_scores, stride, own_out, heads * dim, 1);
        else
            attend_rows(own_q, qkv_width, count, group, own_keys, own_values, next_keys, slots, mask_rows,
                        past + q + 1, dim, scale, own_scores, stride, own_out, heads * dim, 0);
    }
    if (linear(w->o_kind, w->o, w->o_bias, attended, rows, heads * dim, hidden, projected, threads) != 0) {
        free(scratch);
        return -1;
    }
    for (int64_t i = 0; i < rows * hidden; ++i) x[i] += projected[i];

    rms_norm(x, rows, hidden, w->norm2, w->eps2, normed);
    if (linear(w->gate_up_kind, w->gate_up, NULL, normed, rows, hidden, 2 * inter, gate_up, threads) != 0) {
        free(scratch);
        return -1;
    }
    for (int64_t m = 0; m < rows; ++m) {
        const float *gate = gate_up + m * 2 * inter, *up = gate + inter;
        silu_times(gate, up, inter, activated + m * inter);
    }
    if (linear(w->down_kind, w->down, NULL, activated, rows, inter, hidden, projected, threads) != 0) {
        free(scratch);
        return -1;
    }
    for (int64_t i = 0; i < rows * hidden; ++i) x[i] += projected[i];
    free(scratch);
    return 0;
}

/* out [rows, size] = rms_norm(x) with `weight` (the model's final norm): the arithmetic of every layer's norms,
 * so a final norm computed here or after spec_fast_layers has the same bits */
void spec_fast_rms_norm(const float *x, int64_t rows, int64_t size, const float *weight, double eps, float *out) {
    rms_norm(x, rows, size, weight, eps, out);
}

/* The `count` layers of a model one after another over x in place, each exactly one spec_fast_layer call
 * (layer l with weights[l], keys[l], values[l], capacities[l], halves[l]), then, with `norm` not NULL,
 * normed = rms_norm(x) with that weight (the final norm). One call per pass instead of one per layer plus a
 * torch norm: after a pass has streamed the weights through the caches, each of those calls found its Python
 * and dispatch paths in memory again. Returns 0, or -1 as spec_fast_layer (x is then partly updated). */
int64_t spec_fast_layers(int64_t count, const spec_fast_layer_weights *const *weights, float *x, int64_t batch,
                         int64_t num_query, const float *cos, const float *sin, const float *mask, int64_t past,
                         void *const *keys, void *const *values, const int64_t *capacities, const int64_t *halves,
                         int64_t threads, const float *norm, double eps, float *normed) {
    for (int64_t l = 0; l < count; ++l) {
        if (spec_fast_layer(weights[l], x, batch, num_query, cos, sin, mask, past, keys[l], values[l], capacities[l],
                            threads, halves[l]) != 0)
            return -1;
    }
    if (norm != NULL && count > 0) rms_norm(x, batch * num_query, weights[0]->hidden, norm, eps, normed);
    return 0;
}

/* spec_fast_layers with the final norm (into normed), then the logits of every row, logits [rows, vocab] =
 * the block product of normed with the head's `head_kind` blocks (spec_fast_mm_blocks, the bits of that call on
 * its own), then, with first_max not NULL, each row's index of its first maximum logit (spec_fast_first_max's).
 * A plain decoding step's whole pass in one call: the separate head product and argmax each found their Python
 * and dispatch paths out of the caches after the layers' weights had streamed through them. Returns 0, or -1
 * when scratch memory could not be allocated (x is then partly updated). */
int64_t spec_fast_layers_head(int64_t count, const spec_fast_layer_weights *const *weights, float *x, int64_t batch,
                              int64_t num_query, const float *cos, const float *sin, const float *mask, int64_t past,
                              void *const *keys, void *const *values, const int64_t *capacities,
                              const int64_t *halves, int64_t threads, const float *norm, double eps, float *normed,
                              int64_t head_kind, const uint8_t *head, int64_t vocab, float *logits,
                              int64_t *first_max) {
    if (count < 1 || norm == NULL) return -1;
    if (spec_fast_layers(count, weights, x, batch, num_query, cos, sin, mask, past, keys, values, capacities, halves,
                         threads, norm, eps, normed) != 0)
        return -1;
    const int64_t rows = batch * num_query, hidden = weights[0]->hidden;
    if (spec_fast_mm_blocks(head_kind, normed, rows, hidden, hidden, head, vocab, logits, vocab, threads) != 0)
        return -1;
    if (first_max != NULL && rows > 0 && vocab > 0) spec_fast_first_max(logits, rows, vocab, vocab, first_max);
    return 0;
}

/* The commit of a pass's kept cache entries for rows of different lengths: in every layer l and row b, the
 * entry at slot source[b, i] moves to slot target[b, i] for i < counts[b] (keys[l] and values[l] are
 * [B, H_kv, capacity, D] buffers of element_bytes-wide elements). A row's kept entries are all read before
 * any is written (its targets may overlap its sources). One call for every layer replaces a gather and a
 * scatter per buffer and layer in torch. Returns 0; -1 when scratch memory could not be allocated, -2 when an
 * index is outside [0, capacity) or a count outside [0, most] (nothing is written then). */
int64_t spec_fast_move_entries(int64_t layers, void *const *keys, void *const *values, int64_t batch,
                               int64_t heads, int64_t capacity, int64_t dim, const int64_t *source,
                               const int64_t *target, const int64_t *counts, int64_t most, int64_t element_bytes) {
    for (int64_t b = 0; b < batch; ++b) {
        if (counts[b] < 0 || counts[b] > most) return -2;
        for (int64_t i = 0; i < counts[b]; ++i) {
            const int64_t from = source[b * most + i], to = target[b * most + i];
            if (from < 0 || from >= capacity || to < 0 || to >= capacity) return -2;
        }
    }
    const int64_t entry = dim * element_bytes; /* bytes of one slot of one head */
    char *staged = malloc((size_t)(most > 0 ? most : 1) * (size_t)(heads * entry));
    if (staged == NULL) return -1;
    for (int64_t l = 0; l < 2 * layers; ++l) {
        char *buffer = l < layers ? keys[l] : values[l - layers];
        for (int64_t b = 0; b < batch; ++b) {
            for (int64_t h = 0; h < heads; ++h) {
                char *head = buffer + ((b * heads + h) * capacity) * entry;
                for (int64_t i = 0; i < counts[b]; ++i)
                    memcpy(staged + (h * most + i) * entry, head + source[b * most + i] * entry, (size_t)entry);
            }
            for (int64_t h = 0; h < heads; ++h) {
                char *head = buffer + ((b * heads + h) * capacity) * entry;
                for (int64_t i = 0; i < counts[b]; ++i)
                    memcpy(head + target[b * most + i] * entry, staged + (h * most + i) * entry, (size_t)entry);
            }
        }
    }
    free(staged);
    return 0;
}

/* A recurrent draft head's step (spec_fast.drafts.heads, kind "rnn") over `rows` entries, in one call:
 *
 *   x = [embeds | prev] Wfc^T ; x += (silu(rms_norm(x) Wgate^T) * (rms_norm(x) Wup^T)) Wdown^T
 *   features = rms_norm(x) with `norm`
 *
 * and then, for the `head_count` rows listed in head_rows, logits [head_count, subset] = features[row] times
 * the subset LM head (head_kind 0: packed float32, else GGUF blocks) and, with first_max not NULL, each such
 * row's index of its first maximum logit. embeds, prev and features are [rows, hidden]; the four products
 * take weight_kind weights (packed float32 or blocks), gate and up [inter, hidden], down [hidden, inter], fc
 * [hidden, 2 hidden]. The arithmetic of the decoder layers' MLP (the same norm, SiLU and products), so each
 * row's result depends on that row alone. A draft level of one row cost about 2 ms through a dozen torch
 * operations and four product calls around a 0.3 ms weight read. Returns 0, -1 when scratch memory could not
 * be allocated, -2 for a head row outside [0, rows). */
int64_t spec_fast_feature_mlp(int64_t rows, int64_t hidden, int64_t inter, const float *embeds, const float *prev,
                              int64_t weight_kind, const void *fc, const float *mlp_norm, const void *gate,
                              const void *up, const void *down, const float *norm, double eps, float *features,
                              int64_t head_kind, const void *head, int64_t subset, int64_t head_count,
                              const int64_t *head_rows, float *logits, int64_t *first_max, int64_t threads) {
    for (int64_t i = 0; i < head_count; ++i) {
        if (head_rows[i] < 0 || head_rows[i] >= rows) return -2;
    }
    if (rows < 1) return 0;
    const int64_t n = rows > head_count ? rows : head_count;
    float *scratch = malloc((size_t)n * (size_t)(4 * hidden + 3 * inter) * sizeof(float));
    if (scratch == NULL) return -1;
    float *joined = scratch, *x = joined + rows * 2 * hidden, *normed = x + rows * hidden;
    float *g = normed + rows * hidden, *u = g + rows * inter, *activated = u + rows * inter;
    int64_t status = 0;
    for (int64_t r = 0; r < rows; ++r) {
        memcpy(joined + r * 2 * hidden, embeds + r * hidden, (size_t)hidden * sizeof(float));
        memcpy(joined + r * 2 * hidden + hidden, prev + r * hidden, (size_t)hidden * sizeof(float));
    }
    status |= linear(weight_kind, fc, NULL, joined, rows, 2 * hidden, hidden, x, threads);
    rms_norm(x, rows, hidden, mlp_norm, eps, normed);
    status |= linear(weight_kind, gate, NULL, normed, rows, hidden, inter, g, threads);
    status |= linear(weight_kind, up, NULL, normed, rows, hidden, inter, u, threads);
    for (int64_t r = 0; r < rows; ++r) silu_times(g + r * inter, u + r * inter, inter, activated + r * inter);
    status |= linear(weight_kind, down, NULL, activated, rows, inter, hidden, normed, threads);
    for (int64_t i = 0; i < rows * hidden; ++i) x[i] += normed[i];
    rms_norm(x, rows, hidden, norm, eps, features);
    if (status == 0 && head != NULL && head_count > 0) {
        for (int64_t i = 0; i < head_count; ++i)
            memcpy(normed + i * hidden, features + head_rows[i] * hidden, (size_t)hidden * sizeof(float));
        status |= linear(head_kind, head, NULL, normed, head_count, hidden, subset, logits, threads);
        if (status == 0 && first_max != NULL && subset > 0) spec_fast_first_max(logits, head_count, subset, subset,
                                                                               first_max);
    }
    free(scratch);
    return status != 0 ? -1 : 0;
}
