// Shared definitions for every tensorplug OpenCL kernel.
//
// Tensors are passed ggml-style as five arguments (see TENSOR below): the cl.Buffer,
// the byte offset of the tensor in it, its element type (ggml type id), its extents
// ne (innermost first) and its byte strides nb. Broadcast operands arrive with a
// stride of 0 along every broadcast axis, so kernels never compute a modulo.
//
// Conversions are written with integer operations rather than vload_half/vstore_half
// and other library calls: some drivers (PoCL among them) do not inline their builtin
// library into kernels, and a call per element in an inner loop costs more than the
// arithmetic. The results are bit-exact (round to nearest even, like numpy).

#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_I8 24
#define T_I16 25
#define T_I32 26
#define T_I64 27
#define T_BF16 30

#define QK 32

#ifndef WG
#define WG 64
#endif

#define TENSOR(x) global uchar *x##_d, ulong x##_o, int x##_t, int4 x##_ne, ulong4 x##_nb
#define BASE(x) (x##_d + x##_o)
#define OFFS(nb, i0, i1, i2, i3) \
    ((ulong)(i0) * (nb).x + (ulong)(i1) * (nb).y + (ulong)(i2) * (nb).z + (ulong)(i3) * (nb).w)
#define NROWS(ne) ((long)(ne).y * (ne).z * (ne).w)

// Work layout shared by row-oriented kernels: dimension 1 strides over rows (one
// work-group per row at a time), dimension 0 over the WG work-items of the group.
#define FOR_ROWS(row, ne) \
    for (long row = get_global_id(1); row < NROWS(ne); row += get_global_size(1))
#define FOR_COLS(i, n) for (int i = get_local_id(0); i < (n); i += WG)
#define ROW_COORDS(ne, row, i1, i2, i3)           \
    const int i1 = (int)((row) % (ne).y);         \
    const int i2 = (int)(((row) / (ne).y) % (ne).z); \
    const int i3 = (int)((row) / ((long)(ne).y * (ne).z))

#define MINI(a, b) ((a) < (b) ? (a) : (b))
#define MAXI(a, b) ((a) > (b) ? (a) : (b))

// Eight-wide loads from addresses aligned only to their element, and vector
// conversions. With clang (PoCL, and the compilers of most GPU drivers) a typedef may
// lower a vector's alignment, which gives plain unaligned vector loads; elsewhere the
// standard vload8 and convert_T8 do the same through the builtin library (also with
// -DTP_PORTABLE, which the tests use to check that path).
#if defined(__clang__) && !defined(TP_PORTABLE)
typedef float8 __attribute__((aligned(4))) float8_u;
typedef ushort8 __attribute__((aligned(2))) ushort8_u;
typedef uchar8 __attribute__((aligned(1))) uchar8_u;
typedef char8 __attribute__((aligned(1))) char8_u;
#define LOAD_F8(p) (*(const global float8_u *)(p))
#define LOAD_US8(p) (*(const global ushort8_u *)(p))
#define LOAD_UC8(p) (*(const global uchar8_u *)(p))
#define LOAD_C8(p) (*(const global char8_u *)(p))
#define STORE_LOCAL_F8(p, v) (*(local float8_u *)(p) = (v))
#define CVT(v, T) __builtin_convertvector(v, T)
#else
#define LOAD_F8(p) vload8(0, (const global float *)(p))
#define LOAD_US8(p) vload8(0, (const global ushort *)(p))
#define LOAD_UC8(p) vload8(0, (const global uchar *)(p))
#define LOAD_C8(p) vload8(0, (const global char *)(p))
#define STORE_LOCAL_F8(p, v) vstore8((v), 0, (local float *)(p))
#define CVT(v, T) convert_##T(v)
#endif

// ---- f16 / bf16 <-> f32 ----------------------------------------------------------

inline float f16_to_f32(uint h) {
    const uint e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    const float sub = (float)m * 0x1p-24f;  // subnormal: exact, and a normal float
    const uint mag = e == 0u ? as_uint(sub)
                   : e == 31u ? (0x7f800000u | (m << 13))
                   : (((e + 112u) << 23) | (m << 13));
    return as_float(mag | ((h & 0x8000u) << 16));
}

#ifdef TP_DENORMS
// With denormals kept (the device says so), scaling the shifted bits by 2^112 rebiases
// normal and subnormal halves alike in one multiply; only inf/NaN need fixing up.
inline float8 f16_to_f32_8(ushort8 hv) {
    const int8 hs = CVT(as_short8(hv), int8);  // sign-extended
    const uint8 em = as_uint8(hs << 13) & 0x0fffe000u;
    float8 f = as_float8(em) * 0x1p112f;
    f = em >= 0x0f800000u ? as_float8(em | 0x7f800000u) : f;
    return as_float8(as_uint8(f) | (as_uint8(hs) & 0x80000000u));
}
#else
inline float8 f16_to_f32_8(ushort8 hv) {
    const uint8 h = CVT(hv, uint8);
    const uint8 e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    const uint8 sub = as_uint8(CVT(m, float8) * 0x1p-24f);
    const uint8 normal = ((e + 112u) << 23) | (m << 13);
    const uint8 infnan = 0x7f800000u | (m << 13);
    uint8 mag = e == 0u ? sub : normal;
    mag = e == 31u ? infnan : mag;
    return as_float8(mag | ((h & 0x8000u) << 16));
}
#endif

inline ushort f32_to_f16(float f) {
    uint a = as_uint(f);
    const uint sign = (a >> 16) & 0x8000u;
    a &= 0x7fffffffu;
    uint r;
    if (a >= 0x47800000u) {          // >= 65536: inf, or NaN kept quiet
        r = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (a < 0x38800000u) {    // below 2^-14: an f16 subnormal or zero
        r = as_uint(as_float(a) + 0.5f) - 0x3f000000u;
    } else {                         // normal: rebias and round to nearest even
        r = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
    }
    return (ushort)(r | sign);
}

inline float bf16_to_f32(uint h) { return as_float(h << 16); }

inline ushort f32_to_bf16(float f) {
    const uint x = as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (ushort)((x >> 16) | 0x40u);
    return (ushort)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---- typed scalar access ------------------------------------------------------------

inline int is_quant(int t) {
    return t == T_Q4_0 || t == T_Q4_1 || t == T_Q5_0 || t == T_Q5_1 || t == T_Q8_0;
}

inline float load_scalar(const global uchar *p, int t) {
    switch (t) {
    case T_F32: return *(const global float *)p;
    case T_F16: return f16_to_f32(*(const global ushort *)p);
    case T_BF16: return bf16_to_f32(*(const global ushort *)p);
    case T_I8: return (float)*(const global char *)p;
    case T_I16: return (float)*(const global short *)p;
    case T_I32: return (float)*(const global int *)p;
    case T_I64: return (float)*(const global long *)p;
    }
    return 0.0f;
}

inline void store_scalar(global uchar *p, int t, float v) {
    switch (t) {
    case T_F32: *(global float *)p = v; break;
    case T_F16: *(global ushort *)p = f32_to_f16(v); break;
    case T_BF16: *(global ushort *)p = f32_to_bf16(v); break;
    }
}

inline float load_f16_at(const global uchar *p) { return f16_to_f32(p[0] | ((uint)p[1] << 8)); }

// Element j (0..31) of a quantized block, dequantized (ggml-common.h layouts).
inline float dequant_one(const global uchar *b, int j, int t) {
    const float d = load_f16_at(b);
    const int lo = j < 16, k = j & 15;
    switch (t) {
    case T_Q8_0: return d * (float)((const global char *)(b + 2))[j];
    case T_Q4_0: {
        const uint q = lo ? (b[2 + k] & 15u) : (b[2 + k] >> 4);
        return d * (float)((int)q - 8);
    }
    case T_Q4_1: {
        const uint q = lo ? (b[4 + k] & 15u) : (b[4 + k] >> 4);
        return d * (float)q + load_f16_at(b + 2);
    }
    case T_Q5_0: {
        const uint qh = b[2] | ((uint)b[3] << 8) | ((uint)b[4] << 16) | ((uint)b[5] << 24);
        const uint q = (lo ? (b[6 + k] & 15u) : (b[6 + k] >> 4)) | (((qh >> j) & 1u) << 4);
        return d * (float)((int)q - 16);
    }
    case T_Q5_1: {
        const uint qh = b[4] | ((uint)b[5] << 8) | ((uint)b[6] << 16) | ((uint)b[7] << 24);
        const uint q = (lo ? (b[8 + k] & 15u) : (b[8 + k] >> 4)) | (((qh >> j) & 1u) << 4);
        return d * (float)q + load_f16_at(b + 2);
    }
    }
    return 0.0f;
}

// Element (i0, i1, i2, i3) of a tensor of any type as f32.
inline float load_elem(const global uchar *p, int t, ulong4 nb, int i0, int i1, int i2, int i3) {
    if (is_quant(t)) return dequant_one(p + OFFS(nb, i0 / QK, i1, i2, i3), i0 % QK, t);
    return load_scalar(p + OFFS(nb, i0, i1, i2, i3), t);
}

// ---- work-group reductions (every work-item of the group must call them) ------------

inline float wg_sum(float v, local float *red) {
    const int l = get_local_id(0);
    red[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) red[l] += red[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline float wg_max(float v, local float *red) {
    const int l = get_local_id(0);
    red[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) red[l] = red[l] > red[l + s] ? red[l] : red[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

// ALiBi slope of head h (soft_max and flash_attn_ext): m0^(h+1) for the first
// n_head_log2 heads, then m1^(2(h - n_head_log2) + 1).
inline float alibi_slope(float max_bias, int h, int n_head_log2, float m0, float m1) {
    if (max_bias <= 0.0f) return 1.0f;
    return h < n_head_log2 ? pown(m0, h + 1) : pown(m1, 2 * (h - n_head_log2) + 1);
}
