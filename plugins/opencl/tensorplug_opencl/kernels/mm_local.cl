// Template of the mul_mat kernels for GPUs, instantiated by the loader once per weight
// type with MM_NAME_LOCAL, MM_NAME_VEC and MM_T (the weight type's loader suffix).
//
// MM_NAME_LOCAL: a 16 x 16 work-group computes a 64 x 64 block of d, each work-item a
// 4 x 4 tile spread 16 apart (conflict-free local reads). K goes 32 at a time: the
// group dequantizes one block of 64 rows of a and loads 64 rows of b into local
// memory (one float8 chunk per work-item each, neighbouring work-items reading
// neighbouring bytes), then every work-item accumulates its tile from there.
//
// MM_NAME_VEC: one work-group per output value (matrix-vector products): its
// work-items take every WG-th block of the row and the partial sums are reduced.
//
// Both need dense rows in a and an f32 b with dense rows; K tails (float types only)
// are read one value at a time.

#define ML_CAT_(a, b) a##b
#define ML_CAT(a, b) ML_CAT_(a, b)
#define ML_BLOCK ML_CAT(BLOCK_BYTES_, MM_T)
#define ML_SCALES ML_CAT(scales_, MM_T)
#define ML_CHUNK ML_CAT(chunk_, MM_T)

kernel __attribute__((reqd_work_group_size(16, 16, 1)))
void MM_NAME_LOCAL(int r2, int r3, TENSOR(a), TENSOR(b), TENSOR(d)) {
    local float as[64][QK + 1];
    local float bs[64][QK + 1];
    const int K = a_ne.x, N = a_ne.y, M = b_ne.y;
    const int tx = get_local_id(0), ty = get_local_id(1), l = ty * 16 + tx;
    const int o0 = get_group_id(0) * 64, t0 = get_group_id(1) * 64;
    const int i2 = get_global_id(2) % d_ne.z, i3 = get_global_id(2) / d_ne.z;
    // the row and chunk this work-item loads: 64 rows x 4 chunks of 8 values
    const int lr = l / 4, lc = l % 4;
    const global uchar *arow = BASE(a) + OFFS(a_nb, 0, MINI(o0 + lr, N - 1), i2 / r2, i3 / r3);
    const global float *brow =
        (const global float *)(BASE(b) + OFFS(b_nb, 0, MINI(t0 + lr, M - 1), i2, i3));
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += QK) {
        local float *al = &as[lr][8 * lc], *bl = &bs[lr][8 * lc];
        if (k0 + QK <= K) {
            const global uchar *blk = arow + (k0 / QK) * ML_BLOCK;
            float sd, sm;
            ML_SCALES(blk, &sd, &sm);
            STORE_LOCAL_F8(al, ML_CHUNK(blk, lc, sd, sm));
            STORE_LOCAL_F8(bl, LOAD_F8(brow + k0 + 8 * lc));
        } else {  // the last, partial block of a float row
            for (int e = 0; e < 8; e++) {
                const int k = k0 + 8 * lc + e;
                al[e] = k < K ? load_scalar(arow + k * a_nb.x, a_t) : 0.0f;
                bl[e] = k < K ? brow[k] : 0.0f;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < QK; k++) {
            float x[4], y[4];
            for (int j = 0; j < 4; j++) x[j] = as[tx + 16 * j][k];
            for (int i = 0; i < 4; i++) y[i] = bs[ty + 16 * i][k];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += y[i] * x[j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 4; j++) {
            const int t = t0 + ty + 16 * i, o = o0 + tx + 16 * j;
            if (t < M && o < N) *(global float *)(BASE(d) + OFFS(d_nb, o, t, i2, i3)) = acc[i][j];
        }
    }
}

kernel void MM_NAME_VEC(int r2, int r3, TENSOR(a), TENSOR(b), TENSOR(d)) {
    local float red[WG];
    const int K = a_ne.x, nblocks = K / QK;
    const int lid = get_local_id(0);
    // "rows" of this launch are the output values: (o, t, i2, i3) = d's elements
    for (long v = get_global_id(1); v < (long)d_ne.x * NROWS(d_ne); v += get_global_size(1)) {
        const int o = (int)(v % d_ne.x);
        const long row = v / d_ne.x;
        ROW_COORDS(d_ne, row, t, i2, i3);
        const global uchar *arow = BASE(a) + OFFS(a_nb, 0, o, i2 / r2, i3 / r3);
        const global float *brow = (const global float *)(BASE(b) + OFFS(b_nb, 0, t, i2, i3));
        float8 s8 = 0.0f;
        for (int kb = lid; kb < nblocks; kb += WG) {
            const global uchar *blk = arow + kb * ML_BLOCK;
            float sd, sm;
            ML_SCALES(blk, &sd, &sm);
            for (int c = 0; c < 4; c++) {
                s8 += ML_CHUNK(blk, c, sd, sm) * LOAD_F8(brow + kb * QK + 8 * c);
            }
        }
        float s = hsum8(s8);
        for (int k = nblocks * QK + lid; k < K; k += WG) {
            s += load_scalar(arow + k * a_nb.x, a_t) * brow[k];
        }
        s = wg_sum(s, red);
        if (lid == 0) *(global float *)(BASE(d) + OFFS(d_nb, o, t, i2, i3)) = s;
    }
}

#undef ML_CHUNK
#undef ML_SCALES
#undef ML_BLOCK
#undef ML_CAT
#undef ML_CAT_
