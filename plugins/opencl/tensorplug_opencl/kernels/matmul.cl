// Matrix products d = b · aᵀ (ggml_mul_mat) and the row loaders the tiled kernels use.
//
// a: [K, N, A2, A3] weights of any float or quantized type (dequantized here, in the
// kernel); b: [K, M, B2, B3] activations; d: [N, M, B2, B3] f32. Batch (i2, i3) of b
// uses batch (i2 / r2, i3 / r3) of a.

// Any types, any strides: one work-item per output value. The fallback every layout
// reaches; the tiled kernels below cover dense rows.
kernel void k_mul_mat(int r2, int r3, TENSOR(a), TENSOR(b), TENSOR(d)) {
    const global uchar *ap = BASE(a), *bp = BASE(b);
    global uchar *dp = BASE(d);
    const int K = a_ne.x;
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, t, i2, i3);
        const global uchar *br = bp + OFFS(b_nb, 0, t, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, t, i2, i3);
        FOR_COLS(o, d_ne.x) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) {
                s += load_elem(ap, a_t, a_nb, k, o, i2 / r2, i3 / r3) *
                     load_scalar(br + k * b_nb.x, b_t);
            }
            *(global float *)(dr + o * d_nb.x) = s;
        }
    }
}

// ---- block loaders for the tiled kernels ----------------------------------------------
//
// The tiled kernels walk K one 32-element block at a time. For each weight type T:
//   BLOCK_BYTES_T          bytes of one block of a row
//   scales_T(b, &d, &m)    the block's scale and minimum (once per block)
//   chunk_T(b, s, d, m)    values 8s..8s+7 of the block as float8 (s = 0..3, a constant
//                          once the caller's loop is unrolled)
// Float types have trivial "blocks" of 32 elements.

#define BLOCK_BYTES_f32 128
#define BLOCK_BYTES_f16 64
#define BLOCK_BYTES_bf16 64
#define BLOCK_BYTES_q8_0 34
#define BLOCK_BYTES_q4_0 18
#define BLOCK_BYTES_q4_1 20
#define BLOCK_BYTES_q5_0 22
#define BLOCK_BYTES_q5_1 24

inline void scales_none(const global uchar *b, float *d, float *m) {
    *d = 1.0f;
    *m = 0.0f;
}

inline void scales_d(const global uchar *b, float *d, float *m) {
    *d = load_f16_at(b);
    *m = 0.0f;
}

inline void scales_dm(const global uchar *b, float *d, float *m) {
    *d = load_f16_at(b);
    *m = load_f16_at(b + 2);
}

#define scales_f32 scales_none
#define scales_f16 scales_none
#define scales_bf16 scales_none
#define scales_q8_0 scales_d
#define scales_q4_0 scales_d
#define scales_q5_0 scales_d
#define scales_q4_1 scales_dm
#define scales_q5_1 scales_dm

inline float8 chunk_f32(const global uchar *b, int s, float d, float m) {
    return LOAD_F8(b + 32 * s);
}

inline float8 chunk_f16(const global uchar *b, int s, float d, float m) {
    return f16_to_f32_8(LOAD_US8(b + 16 * s));
}

inline float8 chunk_bf16(const global uchar *b, int s, float d, float m) {
    const uint8 h = CVT(LOAD_US8(b + 16 * s), uint8);
    return as_float8(h << 16);
}

inline float8 chunk_q8_0(const global uchar *b, int s, float d, float m) {
    return CVT(LOAD_C8(b + 2 + 8 * s), float8) * d;
}

// The 8 four-bit codes of values 8s..8s+7 of a block whose nibbles start at qs.
inline uint8 nibbles8(const global uchar *qs, int s) {
    const uint8 q = CVT(LOAD_UC8(qs + 8 * (s & 1)), uint8);
    return s < 2 ? (q & 15u) : (q >> 4);
}

// Their fifth bits (5-bit types), shifted into place (0 or 16).
inline uint8 fifth8(const global uchar *qh, int s) {
    const uint h = qh[0] | ((uint)qh[1] << 8) | ((uint)qh[2] << 16) | ((uint)qh[3] << 24);
    const uint8 shift = (uint8)(0, 1, 2, 3, 4, 5, 6, 7) + (uint)(8 * s);
    return (((uint8)h >> shift) & 1u) << 4;
}

inline float8 chunk_q4_0(const global uchar *b, int s, float d, float m) {
    return (CVT(nibbles8(b + 2, s), float8) - 8.0f) * d;
}

inline float8 chunk_q4_1(const global uchar *b, int s, float d, float m) {
    return CVT(nibbles8(b + 4, s), float8) * d + m;
}

inline float8 chunk_q5_0(const global uchar *b, int s, float d, float m) {
    const uint8 q = nibbles8(b + 6, s) | fifth8(b + 2, s);
    return (CVT(q, float8) - 16.0f) * d;
}

inline float8 chunk_q5_1(const global uchar *b, int s, float d, float m) {
    const uint8 q = nibbles8(b + 8, s) | fifth8(b + 4, s);
    return CVT(q, float8) * d + m;
}

inline float hsum8(float8 v) {
    const float4 h = v.lo + v.hi;
    return (h.x + h.y) + (h.z + h.w);
}
