// The tensorplug kernel dialect as CUDA C++ (NVRTC through cupy).
//
// Kernel bodies (src/*.tpk) are written only in the words this prelude defines, and
// the OpenCL and Metal preludes define the same words; see the package README.
#define TP_DIALECT_CUDA 1

#define TP_KERNEL extern "C" __global__ void
#define TP_REQD_GROUP(x, y, z) __launch_bounds__((x) * (y) * (z))
#define TP_FN static __device__ __forceinline__
#define TP_MAYBE_UNUSED __attribute__((unused))
#define TP_GLOBAL
#define TP_LOCAL
#define TP_SHARED __shared__
#define TP_PRIVATE
#define TP_BARRIER() __syncthreads()

#define TP_ARGS(T) const T args
#define TP_BUFFER(name, index) uchar *__restrict__ name##_buf
#define TP_IDS

#define TP_GLOBAL_ID(d) TP_GLOBAL_ID_##d
#define TP_GLOBAL_ID_0 ((int)(blockIdx.x * blockDim.x + threadIdx.x))
#define TP_GLOBAL_ID_1 ((int)(blockIdx.y * blockDim.y + threadIdx.y))
#define TP_GLOBAL_ID_2 ((int)(blockIdx.z * blockDim.z + threadIdx.z))
#define TP_LOCAL_ID(d) TP_LOCAL_ID_##d
#define TP_LOCAL_ID_0 ((int)threadIdx.x)
#define TP_LOCAL_ID_1 ((int)threadIdx.y)
#define TP_LOCAL_ID_2 ((int)threadIdx.z)
#define TP_GROUP_ID(d) TP_GROUP_ID_##d
#define TP_GROUP_ID_0 ((int)blockIdx.x)
#define TP_GROUP_ID_1 ((int)blockIdx.y)
#define TP_GROUP_ID_2 ((int)blockIdx.z)
#define TP_GLOBAL_SIZE(d) TP_GLOBAL_SIZE_##d
#define TP_GLOBAL_SIZE_0 ((int)(gridDim.x * blockDim.x))
#define TP_GLOBAL_SIZE_1 ((int)(gridDim.y * blockDim.y))
#define TP_GLOBAL_SIZE_2 ((int)(gridDim.z * blockDim.z))

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef signed char tp_i8;
typedef long long tp_i64;
typedef unsigned long long tp_u64;

#define TP_INF __int_as_float(0x7f800000)
TP_FN float tp_as_float(uint u) { return __uint_as_float(u); }
TP_FN uint tp_as_uint(float f) { return __float_as_uint(f); }

// Arithmetic that must round after every operation (NVRTC fuses a*b+c by default).
#define TP_MUL(a, b) __fmul_rn((a), (b))
#define TP_ADD(a, b) __fadd_rn((a), (b))
#define TP_SUB(a, b) __fsub_rn((a), (b))
#define TP_DIV(a, b) __fdiv_rn((a), (b))

#include "lanes_cxx.h"

#if !defined(TP_PORTABLE)
// f16 -> f32 with the hardware conversion (no cuda_fp16.h needed).
#define TP_HAS_H2F 1
TP_FN float tp_h2f(uint h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
}

// Sum and maximum over the work-group (blockDim.x == WG, a multiple of 32): warp
// shuffles, then one value per warp through scratch. Every thread gets the result.
#define TP_HAS_GROUP_REDUCE 1
TP_FN float tp_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, 32);
    return v;
}
TP_FN float tp_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, 32));
    return v;
}
TP_FN float tp_group_sum(float v, float *scratch, int lid) {
    v = tp_warp_sum(v);
    if ((lid & 31) == 0) scratch[lid >> 5] = v;
    __syncthreads();
    v = tp_warp_sum((lid & 31) < WG / 32 ? scratch[lid & 31] : 0.0f);
    __syncthreads();
    return v;
}
TP_FN float tp_group_max(float v, float *scratch, int lid) {
    v = tp_warp_max(v);
    if ((lid & 31) == 0) scratch[lid >> 5] = v;
    __syncthreads();
    v = tp_warp_max((lid & 31) < WG / 32 ? scratch[lid & 31] : -TP_INF);
    __syncthreads();
    return v;
}

// Four int8 products summed into c: one dp4a instruction (sm_61 and later).
#define TP_HAS_DOT4_I8 1
TP_FN int tp_dot4_i8(int a, int b, int c) { return __dp4a(a, b, c); }
#endif
