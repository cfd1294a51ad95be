// The tensorplug kernel dialect as OpenCL C (pyopencl; checked numerically on PoCL).
//
// Kernel bodies (src/*.tpk) are written only in the words this prelude defines, and
// the CUDA and Metal preludes define the same words; see the package README.
#define TP_DIALECT_OPENCL 1

#define TP_KERNEL kernel void
#define TP_REQD_GROUP(x, y, z) __attribute__((reqd_work_group_size(x, y, z)))
#define TP_FN inline
#define TP_MAYBE_UNUSED __attribute__((unused))
#define TP_GLOBAL global
#define TP_LOCAL local
#define TP_SHARED local
#define TP_PRIVATE
#define TP_BARRIER() barrier(CLK_LOCAL_MEM_FENCE)

#define TP_ARGS(T) const T args
#define TP_BUFFER(name, index) global uchar *name##_buf
#define TP_IDS

#define TP_GLOBAL_ID(d) ((int)get_global_id(d))
#define TP_LOCAL_ID(d) ((int)get_local_id(d))
#define TP_GROUP_ID(d) ((int)get_group_id(d))
#define TP_GLOBAL_SIZE(d) ((int)get_global_size(d))

typedef char tp_i8;
typedef long tp_i64;
typedef ulong tp_u64;

#define TP_INF INFINITY
TP_FN float tp_as_float(uint u) { return as_float(u); }
TP_FN uint tp_as_uint(float f) { return as_uint(f); }

// Arithmetic that must round after every operation (never fused into an fma), for
// code that reproduces a reference bit for bit (quantizers). Functions, with the
// pragma inside: contraction stays on everywhere else (a*b+c in the matmuls).
TP_FN float tp_mul_rn(float a, float b) {
#pragma OPENCL FP_CONTRACT OFF
    return a * b;
}
TP_FN float tp_add_rn(float a, float b) {
#pragma OPENCL FP_CONTRACT OFF
    return a + b;
}
TP_FN float tp_sub_rn(float a, float b) {
#pragma OPENCL FP_CONTRACT OFF
    return a - b;
}
#define TP_MUL(a, b) tp_mul_rn((a), (b))
#define TP_ADD(a, b) tp_add_rn((a), (b))
#define TP_SUB(a, b) tp_sub_rn((a), (b))
#define TP_DIV(a, b) ((a) / (b))

// ---- eight-wide float and integer lanes --------------------------------------------
// Native vectors. Loads from addresses aligned only to their element: with clang (PoCL
// and most GPU drivers) a typedef lowers the vector's alignment and gives plain
// unaligned vector loads; elsewhere, or with -DTP_PORTABLE, the builtin vload8.
typedef float8 tp_f32x8;
typedef uint8 tp_u32x8;

#if defined(__clang__) && !defined(TP_PORTABLE)
typedef float8 __attribute__((aligned(4))) tp_f8_u;
typedef ushort8 __attribute__((aligned(2))) tp_us8_u;
typedef uchar8 __attribute__((aligned(1))) tp_uc8_u;
typedef char8 __attribute__((aligned(1))) tp_c8_u;
#define TP_LD_F8(p) (*(const global tp_f8_u *)(p))
#define TP_LD_US8(p) (*(const global tp_us8_u *)(p))
#define TP_LD_UC8(p) (*(const global tp_uc8_u *)(p))
#define TP_LD_C8(p) (*(const global tp_c8_u *)(p))
#define TP_ST_LOCAL_F8(p, v) (*(local tp_f8_u *)(p) = (v))
#define TP_CVT(v, T) __builtin_convertvector(v, T)
#else
#define TP_LD_F8(p) vload8(0, (const global float *)(p))
#define TP_LD_US8(p) vload8(0, (const global ushort *)(p))
#define TP_LD_UC8(p) vload8(0, (const global uchar *)(p))
#define TP_LD_C8(p) vload8(0, (const global char *)(p))
#define TP_ST_LOCAL_F8(p, v) vstore8((v), 0, (local float *)(p))
#define TP_CVT(v, T) convert_##T(v)
#endif

TP_FN tp_f32x8 tp_load_f32x8(const global float *p) { return TP_LD_F8(p); }
TP_FN tp_u32x8 tp_load_u16x8(const global uchar *p) { return TP_CVT(TP_LD_US8(p), uint8); }
TP_FN tp_u32x8 tp_load_u8x8(const global uchar *p) { return TP_CVT(TP_LD_UC8(p), uint8); }
TP_FN tp_f32x8 tp_load_i8x8_f32(const global uchar *p) { return TP_CVT(TP_LD_C8(p), float8); }
TP_FN void tp_store_local_f32x8(local float *p, tp_f32x8 v) { TP_ST_LOCAL_F8(p, v); }
TP_FN tp_f32x8 tp_f32x8_splat(float v) { return (float8)(v); }
TP_FN tp_u32x8 tp_u32x8_splat(uint v) { return (uint8)(v); }
TP_FN tp_u32x8 tp_u32x8_iota(uint base) { return (uint8)(0, 1, 2, 3, 4, 5, 6, 7) + base; }
TP_FN tp_f32x8 tp_u32x8_to_f32(tp_u32x8 v) { return TP_CVT(v, float8); }
TP_FN tp_f32x8 tp_u32x8_as_f32(tp_u32x8 v) { return as_float8(v); }
TP_FN float tp_f32x8_sum(tp_f32x8 v) {
    const float4 h = v.lo + v.hi;
    return (h.x + h.y) + (h.z + h.w);
}
TP_FN tp_f32x8 tp_f32x8_load_private(const float *a) { return vload8(0, a); }

// Eight f16 values loaded as f32, with vector selects. With denormals kept (the
// device says so), scaling the shifted bits by 2^112 rebiases normal and subnormal
// halves alike in one multiply; only inf/NaN need fixing up.
#if defined(TP_DENORMS) && !defined(TP_PORTABLE)
#define TP_HAS_LOAD_F16X8 1
TP_FN tp_f32x8 tp_load_f16x8(const global uchar *p) {
    const int8 hs = TP_CVT(as_short8(TP_LD_US8(p)), int8);  // sign-extended
    const uint8 em = as_uint8(hs << 13) & 0x0fffe000u;
    float8 f = as_float8(em) * 0x1p112f;
    f = em >= 0x0f800000u ? as_float8(em | 0x7f800000u) : f;
    return as_float8(as_uint8(f) | (as_uint8(hs) & 0x80000000u));
}
#elif !defined(TP_PORTABLE)
#define TP_HAS_LOAD_F16X8 1
TP_FN tp_f32x8 tp_load_f16x8(const global uchar *p) {
    const uint8 h = TP_CVT(TP_LD_US8(p), uint8);
    const uint8 e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    const uint8 sub = as_uint8(TP_CVT(m, float8) * 0x1p-24f);
    const uint8 normal = ((e + 112u) << 23) | (m << 13);
    const uint8 infnan = 0x7f800000u | (m << 13);
    uint8 mag = e == 0u ? sub : normal;
    mag = e == 31u ? infnan : mag;
    return as_float8(mag | ((h & 0x8000u) << 16));
}
#endif
// Not native here (PoCL has neither cl_khr_subgroups nor cl_khr_integer_dot_product):
// group reductions, 8-bit dot products and scalar f16 conversions come from the
// portable fallbacks, which is how CI checks those fallbacks numerically.
