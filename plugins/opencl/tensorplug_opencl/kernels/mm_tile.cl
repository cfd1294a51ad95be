// Template of the register-tiled mul_mat, instantiated by the loader once per weight
// type and tile shape, with:
//   MM_NAME  the kernel's name          MM_T   the weight type's loader suffix (q4_0, ...)
//   MM_TM    rows of b per work-item    MM_TN  rows of a per work-item
//
// Each work-item computes an MM_TM x MM_TN tile of d as dot products along K, eight
// lanes at a time, with MM_TM*MM_TN float8 accumulators in registers. a is read one
// 32-element block at a time (its scales once per block, dequantized eight values at a
// time, each chunk reused for MM_TM rows of b); a and b are read straight from memory,
// whose caches hold the rows a work-group shares. Needs dense rows in a and an f32 b
// with dense rows; a K that is not a multiple of 32 (float types only) ends with
// 8-wide and scalar steps.

#define MM_CAT_(a, b) a##b
#define MM_CAT(a, b) MM_CAT_(a, b)

kernel void MM_NAME(int r2, int r3, TENSOR(a), TENSOR(b), TENSOR(d)) {
    const int K = a_ne.x, N = a_ne.y, M = b_ne.y;
    const int o0 = get_global_id(0) * MM_TN, t0 = get_global_id(1) * MM_TM;
    const int i2 = get_global_id(2) % d_ne.z, i3 = get_global_id(2) / d_ne.z;
    if (o0 >= N || t0 >= M) return;
    const global uchar *ar[MM_TN];
    const global float *br[MM_TM];
    float8 acc[MM_TM][MM_TN];
#pragma unroll
    for (int j = 0; j < MM_TN; j++) {
        ar[j] = BASE(a) + OFFS(a_nb, 0, MINI(o0 + j, N - 1), i2 / r2, i3 / r3);
    }
#pragma unroll
    for (int i = 0; i < MM_TM; i++) {
        br[i] = (const global float *)(BASE(b) + OFFS(b_nb, 0, MINI(t0 + i, M - 1), i2, i3));
#pragma unroll
        for (int j = 0; j < MM_TN; j++) acc[i][j] = 0.0f;
    }
    const int nblocks = K / QK;
    for (int kb = 0; kb < nblocks; kb++) {
        float sd[MM_TN], sm[MM_TN];
#pragma unroll
        for (int j = 0; j < MM_TN; j++) {
            MM_CAT(scales_, MM_T)(ar[j] + kb * MM_CAT(BLOCK_BYTES_, MM_T), &sd[j], &sm[j]);
        }
#pragma unroll
        for (int s = 0; s < QK / 8; s++) {
            float8 x[MM_TN];
#pragma unroll
            for (int j = 0; j < MM_TN; j++) {
                x[j] = MM_CAT(chunk_, MM_T)(ar[j] + kb * MM_CAT(BLOCK_BYTES_, MM_T), s, sd[j],
                                            sm[j]);
            }
#pragma unroll
            for (int i = 0; i < MM_TM; i++) {
                const float8 y = LOAD_F8(br[i] + kb * QK + 8 * s);
#pragma unroll
                for (int j = 0; j < MM_TN; j++) acc[i][j] += x[j] * y;
            }
        }
    }
    // float types: the rest of K, eight at a time then one at a time
    int k = nblocks * QK;
    for (; k + 8 <= K; k += 8) {
#pragma unroll
        for (int i = 0; i < MM_TM; i++) {
            const float8 y = LOAD_F8(br[i] + k);
#pragma unroll
            for (int j = 0; j < MM_TN; j++) {
                // (never reached for quantized a, whose rows hold whole blocks)
                const global uchar *p = ar[j] + k * (MM_CAT(BLOCK_BYTES_, MM_T) / QK);
                acc[i][j] += MM_CAT(chunk_, MM_T)(p, 0, 1.0f, 0.0f) * y;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MM_TM; i++) {
#pragma unroll
        for (int j = 0; j < MM_TN; j++) {
            float s = hsum8(acc[i][j]);
            for (int kk = k; kk < K; kk++) {
                s += load_scalar(ar[j] + kk * a_nb.x, a_t) * br[i][kk];
            }
            if (t0 + i < M && o0 + j < N) {
                *(global float *)(BASE(d) + OFFS(d_nb, o0 + j, t0 + i, i2, i3)) = s;
            }
        }
    }
}

#undef MM_CAT
#undef MM_CAT_
