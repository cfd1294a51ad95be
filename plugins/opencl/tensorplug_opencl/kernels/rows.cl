// Row-wise kernels: normalisation, softmax, reductions, sorting and rope.
//
// One work-group (WG work-items) handles one row at a time; reductions go through
// local memory. Rows may be strided; the output may alias the input.

// norm: (x - mean) / sqrt(var + eps); rms_norm: x / sqrt(mean(x^2) + eps).
kernel void k_norm(int rms, float eps, TENSOR(a), TENSOR(d)) {
    local float red[WG];
    const global uchar *ap = BASE(a);
    global uchar *dp = BASE(d);
    const int n = a_ne.x;
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        const global uchar *ar = ap + OFFS(a_nb, 0, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        float mean = 0.0f;
        if (!rms) {
            float s = 0.0f;
            FOR_COLS(i0, n) s += load_scalar(ar + i0 * a_nb.x, a_t);
            mean = wg_sum(s, red) / (float)n;
        }
        float v = 0.0f;
        FOR_COLS(i0, n) {
            const float x = load_scalar(ar + i0 * a_nb.x, a_t) - mean;
            v += x * x;
        }
        const float scale = 1.0f / sqrt(wg_sum(v, red) / (float)n + eps);
        FOR_COLS(i0, n) {
            const float x = load_scalar(ar + i0 * a_nb.x, a_t) - mean;
            store_scalar(dr + i0 * d_nb.x, d_t, x * scale);
        }
    }
}

// softmax(a*scale + slope*mask) per row; mask strides are 0 along broadcast axes.
kernel void k_soft_max(float scale, float max_bias, float m0, float m1, int n_head_log2,
                       int has_mask, TENSOR(a), TENSOR(m), TENSOR(d)) {
    local float red[WG];
    const global uchar *ap = BASE(a), *mp = BASE(m);
    global uchar *dp = BASE(d);
    const int n = a_ne.x;
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        const global uchar *ar = ap + OFFS(a_nb, 0, i1, i2, i3);
        const global uchar *mr = mp + OFFS(m_nb, 0, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        const float slope = alibi_slope(max_bias, i2, n_head_log2, m0, m1);
        float mx = -INFINITY;
        FOR_COLS(i0, n) {
            float v = load_scalar(ar + i0 * a_nb.x, a_t) * scale;
            if (has_mask) v += slope * load_scalar(mr + i0 * m_nb.x, m_t);
            mx = fmax(mx, v);
        }
        mx = wg_max(mx, red);
        float s = 0.0f;
        FOR_COLS(i0, n) {
            float v = load_scalar(ar + i0 * a_nb.x, a_t) * scale;
            if (has_mask) v += slope * load_scalar(mr + i0 * m_nb.x, m_t);
            const float e = exp(v - mx);
            s += e;
            *(global float *)(dr + i0 * d_nb.x) = e;
        }
        const float inv = 1.0f / wg_sum(s, red);
        FOR_COLS(i0, n) *(global float *)(dr + i0 * d_nb.x) *= inv;
    }
}

kernel void k_sum_rows(TENSOR(a), TENSOR(d)) {
    local float red[WG];
    const global uchar *ap = BASE(a);
    global uchar *dp = BASE(d);
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        const global uchar *ar = ap + OFFS(a_nb, 0, i1, i2, i3);
        float s = 0.0f;
        FOR_COLS(i0, a_ne.x) s += load_scalar(ar + i0 * a_nb.x, a_t);
        s = wg_sum(s, red);
        if (get_local_id(0) == 0) store_scalar(dp + OFFS(d_nb, 0, i1, i2, i3), d_t, s);
    }
}

// Index of the largest value of each row, the first one on ties.
kernel void k_argmax(TENSOR(a), TENSOR(d)) {
    local float rv[WG];
    local int ri[WG];
    const global uchar *ap = BASE(a);
    global uchar *dp = BASE(d);
    const int l = get_local_id(0);
    FOR_ROWS(row, a_ne) {
        ROW_COORDS(a_ne, row, i1, i2, i3);
        const global uchar *ar = ap + OFFS(a_nb, 0, i1, i2, i3);
        float best = -INFINITY;
        int bi = -1;
        FOR_COLS(i0, a_ne.x) {
            const float v = *(const global float *)(ar + i0 * a_nb.x);
            if (bi < 0 || v > best) { best = v; bi = i0; }
        }
        rv[l] = best;
        ri[l] = bi;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = WG / 2; s > 0; s >>= 1) {
            if (l < s) {
                const float v = rv[l + s];
                const int i = ri[l + s];
                if (i >= 0 && (ri[l] < 0 || v > rv[l] || (v == rv[l] && i < ri[l]))) {
                    rv[l] = v;
                    ri[l] = i;
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        // a 1-d input is one row whose result has shape (1,): d is indexed like a's rows
        if (l == 0) *(global int *)(dp + OFFS(d_nb, i1, i2, i3, 0)) = ri[0];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

// ---- argsort: a bitonic network whose comparators all put the smaller key first, so
// the row can be padded to a power of two with virtual +inf keys that never move.
// Keys compare by value, then by index, which makes the sort stable.

inline int out_of_order(const global uchar *ar, ulong nb0, int desc, int x, int y) {
    const float vx = *(const global float *)(ar + x * nb0);
    const float vy = *(const global float *)(ar + y * nb0);
    if (vx == vy) return x > y;
    return desc ? vx < vy : vx > vy;
}

// Comparator t of the stage (k, j): the pair (lo, hi) it orders.
inline int2 bitonic_pair(int t, int k, int j) {
    const int lo = (t / j) * 2 * j + t % j;
    return (int2)(lo, j == k / 2 ? lo ^ (k - 1) : lo + j);
}

// Whole rows in local memory (npad <= the local budget the host checked).
kernel void k_argsort_local(int desc, int npad, TENSOR(a), TENSOR(d), local int *idx) {
    const global uchar *ap = BASE(a);
    global uchar *dp = BASE(d);
    const int n = a_ne.x;
    FOR_ROWS(row, a_ne) {
        ROW_COORDS(a_ne, row, i1, i2, i3);
        const global uchar *ar = ap + OFFS(a_nb, 0, i1, i2, i3);
        FOR_COLS(i, n) idx[i] = i;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 2; k <= npad; k <<= 1) {
            for (int j = k / 2; j > 0; j >>= 1) {
                FOR_COLS(t, npad / 2) {
                    const int2 p = bitonic_pair(t, k, j);
                    if (p.y < n) {
                        const int x = idx[p.x], y = idx[p.y];
                        if (out_of_order(ar, a_nb.x, desc, x, y)) { idx[p.x] = y; idx[p.y] = x; }
                    }
                }
                barrier(CLK_LOCAL_MEM_FENCE);
            }
        }
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        FOR_COLS(i, n) *(global int *)(dr + i * d_nb.x) = idx[i];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

// Rows too long for local memory: d holds the indices, one launch per stage (k, j).
kernel void k_argsort_init(TENSOR(d)) {
    global uchar *dp = BASE(d);
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        FOR_COLS(i, d_ne.x) *(global int *)(dr + i * d_nb.x) = i;
    }
}

kernel void k_argsort_step(int desc, int npad, int k, int j, TENSOR(a), TENSOR(d)) {
    const global uchar *ap = BASE(a);
    global uchar *dp = BASE(d);
    const int n = a_ne.x;
    FOR_ROWS(row, a_ne) {
        ROW_COORDS(a_ne, row, i1, i2, i3);
        const global uchar *ar = ap + OFFS(a_nb, 0, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        FOR_COLS(t, npad / 2) {
            const int2 p = bitonic_pair(t, k, j);
            if (p.y < n) {
                global int *px = (global int *)(dr + p.x * d_nb.x);
                global int *py = (global int *)(dr + p.y * d_nb.x);
                const int x = *px, y = *py;
                if (out_of_order(ar, a_nb.x, desc, x, y)) { *px = y; *py = x; }
            }
        }
    }
}

// ---- rope ---------------------------------------------------------------------------

inline float rope_yarn_ramp(float low, float high, int i0) {
    const float y = (float)(i0 / 2) - low;
    const float r = y / fmax(0.001f, high - low);
    return 1.0f - fmin(1.0f, fmax(0.0f, r));
}

// a is [head_dim, n_head, n_tokens, batch] (ggml order); one work-item per rotated pair
// or per passed-through element, so a in-place rope reads both halves before writing.
kernel void k_rope(int n_dims, int neox, float theta_scale, float freq_scale, float ext_factor,
                   float attn_factor, float corr0, float corr1, int has_ff,
                   TENSOR(a), TENSOR(pos), TENSOR(ff), TENSOR(d)) {
    const global uchar *ap = BASE(a), *pp = BASE(pos), *fp = BASE(ff);
    global uchar *dp = BASE(d);
    const int half_dims = n_dims / 2;
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        const global uchar *ar = ap + OFFS(a_nb, 0, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        const float p = (float)*(const global int *)(pp + i2 * pos_nb.x);
        FOR_COLS(t, half_dims + d_ne.x - n_dims) {
            if (t >= half_dims) {
                const int i0 = n_dims + t - half_dims;
                store_scalar(dr + i0 * d_nb.x, d_t, load_scalar(ar + i0 * a_nb.x, a_t));
                continue;
            }
            const int ix = neox ? t : 2 * t, iy = neox ? t + half_dims : 2 * t + 1;
            float theta_extrap = p * pow(theta_scale, (float)t);
            if (has_ff) theta_extrap /= *(const global float *)(fp + t * ff_nb.x);
            const float theta_interp = freq_scale * theta_extrap;
            float theta = theta_interp, mscale = attn_factor;
            if (ext_factor != 0.0f) {
                const float mix = rope_yarn_ramp(corr0, corr1, 2 * t) * ext_factor;
                theta = theta_interp * (1.0f - mix) + theta_extrap * mix;
                mscale *= 1.0f + 0.1f * log(1.0f / freq_scale);
            }
            const float c = cos(theta) * mscale, s = sin(theta) * mscale;
            const float x0 = load_scalar(ar + ix * a_nb.x, a_t);
            const float x1 = load_scalar(ar + iy * a_nb.x, a_t);
            store_scalar(dr + ix * d_nb.x, d_t, x0 * c - x1 * s);
            store_scalar(dr + iy * d_nb.x, d_t, x0 * s + x1 * c);
        }
    }
}
