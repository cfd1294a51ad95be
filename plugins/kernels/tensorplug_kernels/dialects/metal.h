// The tensorplug kernel dialect as Metal Shading Language.
//
// Kernel bodies (src/*.tpk) are written only in the words this prelude defines, and
// the OpenCL and CUDA preludes define the same words; see the package README.
// Build with fast math off (MTLCompileOptions.mathMode = safe): the kernels reproduce
// references that round like IEEE single precision.
#include <metal_stdlib>
using namespace metal;
#define TP_DIALECT_METAL 1

#define TP_KERNEL kernel void
#define TP_REQD_GROUP(x, y, z)
#define TP_FN static inline
#define TP_MAYBE_UNUSED __attribute__((unused))
#define TP_GLOBAL device
#define TP_LOCAL threadgroup
#define TP_SHARED threadgroup
#define TP_PRIVATE thread
#define TP_BARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)

// The args struct is buffer 0; the tensors' buffers follow in declaration order.
#define TP_ARGS(T) constant T &args [[buffer(0)]]
#define TP_BUFFER(name, index) device uchar *name##_buf [[buffer(index)]]
#define TP_IDS                                                                      \
    , uint3 tp_gid3 [[thread_position_in_grid]], uint3 tp_lid3 [[thread_position_in_threadgroup]], \
    uint3 tp_grp3 [[threadgroup_position_in_grid]], uint3 tp_gsz3 [[threads_per_grid]]

#define TP_GLOBAL_ID(d) TP_LANE3_##d(tp_gid3)
#define TP_LOCAL_ID(d) TP_LANE3_##d(tp_lid3)
#define TP_GROUP_ID(d) TP_LANE3_##d(tp_grp3)
#define TP_GLOBAL_SIZE(d) TP_LANE3_##d(tp_gsz3)
#define TP_LANE3_0(v) ((int)(v).x)
#define TP_LANE3_1(v) ((int)(v).y)
#define TP_LANE3_2(v) ((int)(v).z)

typedef char tp_i8;
typedef long tp_i64;
typedef ulong tp_u64;

#define TP_INF INFINITY
TP_FN float tp_as_float(uint u) { return as_type<float>(u); }
TP_FN uint tp_as_uint(float f) { return as_type<uint>(f); }

// Arithmetic that must round after every operation (quantizers): contraction off
// inside these functions only. Not yet verified on a Mac.
TP_FN float tp_mul_rn(float a, float b) {
#pragma METAL fp contract(off)
    return a * b;
}
TP_FN float tp_add_rn(float a, float b) {
#pragma METAL fp contract(off)
    return a + b;
}
TP_FN float tp_sub_rn(float a, float b) {
#pragma METAL fp contract(off)
    return a - b;
}
#define TP_MUL(a, b) tp_mul_rn((a), (b))
#define TP_ADD(a, b) tp_add_rn((a), (b))
#define TP_SUB(a, b) tp_sub_rn((a), (b))
#define TP_DIV(a, b) ((a) / (b))

#include "lanes_cxx.h"

#if !defined(TP_PORTABLE)
#define TP_HAS_H2F 1
TP_FN float tp_h2f(uint h) { return float(as_type<half>(ushort(h))); }

// Sum and maximum over the threadgroup (WG threads, a multiple of 32): simdgroup
// reductions, then one value per simdgroup through scratch.
#define TP_HAS_GROUP_REDUCE 1
TP_FN float tp_group_sum(float v, threadgroup float *scratch, int lid) {
    v = simd_sum(v);
    if ((lid & 31) == 0) scratch[lid >> 5] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    v = simd_sum((lid & 31) < WG / 32 ? scratch[lid & 31] : 0.0f);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return v;
}
TP_FN float tp_group_max(float v, threadgroup float *scratch, int lid) {
    v = simd_max(v);
    if ((lid & 31) == 0) scratch[lid >> 5] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    v = simd_max((lid & 31) < WG / 32 ? scratch[lid & 31] : -TP_INF);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return v;
}
#endif
// No 8-bit dot-product instruction in MSL: tp_dot4_i8 is the portable fallback.
