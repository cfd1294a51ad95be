// Fused attention softmax(q·kᵀ·scale + slope·mask)·v (ggml_flash_attn_ext).
//
// ggml order: q [D, n_q, H, B] f32, k [D, n_kv, H_kv, B], v [Dv, n_kv, H_kv, B] (f32,
// f16 or bf16), mask [n_kv, >= n_q, 1|H, 1|B] with zero strides on broadcast axes,
// d [Dv, H, n_q, B] f32. One work-group per (query, head, batch): the keys are taken
// WG at a time, each work-item scoring one key, and the running maximum and sum of the
// online softmax rescale the output accumulated in local memory.

kernel void k_flash_attn(float scale, float max_bias, float m0, float m1, int n_head_log2,
                         float softcap, int has_mask, TENSOR(q), TENSOR(k), TENSOR(v),
                         TENSOR(m), TENSOR(d), local float *lq, local float *lacc) {
    local float ls[WG];
    local float red[WG];
    const int D = q_ne.x, Dv = v_ne.x, n_kv = k_ne.y;
    const int rh = q_ne.z / k_ne.z;
    const int l = get_local_id(0);
    FOR_ROWS(row, q_ne) {
        ROW_COORDS(q_ne, row, iq, h, ib);
        const int hk = h / rh;
        const global uchar *qr = BASE(q) + OFFS(q_nb, 0, iq, h, ib);
        const global uchar *mr = BASE(m) + OFFS(m_nb, 0, iq, h, ib);
        FOR_COLS(i, D) lq[i] = *(const global float *)(qr + i * q_nb.x);
        FOR_COLS(i, Dv) lacc[i] = 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        const float slope = alibi_slope(max_bias, h, n_head_log2, m0, m1);
        float run_max = -INFINITY, run_sum = 0.0f;
        for (int c0 = 0; c0 < n_kv; c0 += WG) {
            const int j = c0 + l;
            float s = -INFINITY;
            if (j < n_kv) {
                const global uchar *kr = BASE(k) + OFFS(k_nb, 0, j, hk, ib);
                float dot = 0.0f;
                for (int i = 0; i < D; i++) dot += lq[i] * load_scalar(kr + i * k_nb.x, k_t);
                s = dot * scale;
                if (softcap > 0.0f) s = softcap * tanh(s / softcap);
                if (has_mask) s += slope * load_scalar(mr + j * m_nb.x, m_t);
            }
            const float new_max = fmax(run_max, wg_max(s, red));
            const float p = new_max == -INFINITY ? 0.0f : exp(s - new_max);
            ls[l] = p;
            const float chunk_sum = wg_sum(p, red);  // its barriers publish ls
            const float corr = run_max == -INFINITY ? 0.0f : exp(run_max - new_max);
            run_sum = run_sum * corr + chunk_sum;
            run_max = new_max;
            const int nc = MINI(WG, n_kv - c0);
            FOR_COLS(i, Dv) {
                const global uchar *vc = BASE(v) + OFFS(v_nb, i, c0, hk, ib);
                float acc = lacc[i] * corr;
                for (int jj = 0; jj < nc; jj++) acc += ls[jj] * load_scalar(vc + jj * v_nb.y, v_t);
                lacc[i] = acc;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        const float inv = run_sum > 0.0f ? 1.0f / run_sum : 0.0f;
        global uchar *dr = BASE(d) + OFFS(d_nb, 0, h, iq, ib);
        FOR_COLS(i, Dv) *(global float *)(dr + i * d_nb.x) = lacc[i] * inv;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
