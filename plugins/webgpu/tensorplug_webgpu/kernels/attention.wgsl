// Fused attention softmax(q·kᵀ·scale + slope·mask)·v (ggml_flash_attn_ext), the port of
// attention.tpk: one work-group per (query, head, batch), the keys taken WG at a time
// (an item scores one key), the running maximum and sum of the online softmax
// rescaling the output accumulated in workgroup memory.

//@kernel k_flash_attn
const FA_MAX_D: u32 = 512u;

var<workgroup> lq: array<f32, FA_MAX_D>;
var<workgroup> lacc: array<f32, FA_MAX_D>;
var<workgroup> ls: array<f32, WG>;
//@include reduce

ENTRY {
    let D = ne_of(args.q, 0u);
    let Dv = ne_of(args.v, 0u);
    let n_kv = ne_of(args.k, 1u);
    let rh = ne_of(args.q, 2u) / ne_of(args.k, 2u);
    let l = lid.x;
    let neg_inf = bitcast<f32>(0xff800000u | (l & 0u));  // -inf, made at run time
    for (var row = wid.y; row < nrows_of(args.q); row += nwg.y) {
        let c = row_coords(args.q, row);  // (query, head, batch)
        let hk = c.y / rh;
        for (var i = l; i < D; i += WG) { lq[i] = q_ld(offs(args.q, i, c.x, c.y, c.z), T_F32); }
        for (var i = l; i < Dv; i += WG) { lacc[i] = 0.0f; }
        workgroupBarrier();
        let slope = alibi_slope(args.max_bias, i32(c.y), args.n_head_log2, args.m0, args.m1);
        var run_max = neg_inf;
        var run_sum = 0.0f;
        for (var c0 = 0u; c0 < n_kv; c0 += WG) {
            let j = c0 + l;
            var s = neg_inf;
            if (j < n_kv) {
                var dot = 0.0f;
                for (var i = 0u; i < D; i++) {
                    dot += lq[i] * k_ld(offs(args.k, i, j, hk, c.z), args.k.type_);
                }
                s = dot * args.scale;
                if (args.softcap > 0.0f) { s = args.softcap * tanh(s / args.softcap); }
                if (args.has_mask != 0) {
                    s += slope * m_ld(offs(args.m, j, c.x, c.y, c.z), args.m.type_);
                }
            }
            let new_max = max(run_max, group_max(s, l));
            var p = 0.0f;
            if (!(new_max == neg_inf && s == s)) { p = exp(s - new_max); }
            ls[l] = p;
            let chunk_sum = group_sum(p, l);  // its barriers publish ls
            let corr = select(exp(run_max - new_max), 0.0f, run_max == neg_inf);
            run_sum = run_sum * corr + chunk_sum;
            run_max = new_max;
            let nc = min(WG, n_kv - c0);
            for (var i = l; i < Dv; i += WG) {
                var acc = lacc[i] * corr;
                for (var jj = 0u; jj < nc; jj++) {
                    acc += ls[jj] * v_ld(offs(args.v, i, c0 + jj, hk, c.z), args.v.type_);
                }
                lacc[i] = acc;
            }
            workgroupBarrier();
        }
        let inv = select(1.0f / run_sum, 0.0f, run_sum == 0.0f);
        for (var i = l; i < Dv; i += WG) {
            d_st32(offs(args.d, i, c.y, c.x, c.z), bitcast<u32>(lacc[i] * inv));
        }
        workgroupBarrier();
    }
}
