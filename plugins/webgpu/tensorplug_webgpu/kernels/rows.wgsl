// Row-wise kernels: normalisation, softmax, reductions, sorting and rope (the port of
// rows.tpk). One work-group handles one row at a time; the group reductions run in
// uniform control flow (every item of the group reaches each barrier).

//@kernel k_norm
//@writes d
//@include reduce

ENTRY {
    let n = ne_of(args.a, 0u);
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        var mean = 0.0f;
        if (args.rms == 0) {
            var s = 0.0f;
            for (var i0 = lid.x; i0 < n; i0 += WG) { s += a_ld(offs(args.a, i0, c.x, c.y, c.z), args.a.type_); }
            mean = group_sum(s, lid.x) / f32(n);
        }
        var v = 0.0f;
        for (var i0 = lid.x; i0 < n; i0 += WG) {
            let x = a_ld(offs(args.a, i0, c.x, c.y, c.z), args.a.type_) - mean;
            v += x * x;
        }
        let scale = 1.0f / sqrt(group_sum(v, lid.x) / f32(n) + args.eps);
        for (var i0 = lid.x; i0 < n; i0 += WG) {
            let x = a_ld(offs(args.a, i0, c.x, c.y, c.z), args.a.type_) - mean;
            d_st(offs(args.d, i0, c.x, c.y, c.z), args.d.type_, x * scale);
        }
    }
}

//@kernel k_soft_max
//@include reduce

ENTRY {
    let n = ne_of(args.a, 0u);
    let has_mask = args.has_mask != 0;
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        let mc = vec3<u32>(c.x, c.y % ne_of(args.m, 2u), c.z % ne_of(args.m, 3u));
        let slope = alibi_slope(args.max_bias, i32(c.y), args.n_head_log2, args.m0, args.m1);
        var mx = LOWEST;
        for (var i0 = lid.x; i0 < n; i0 += WG) {
            var v = a_ld(offs(args.a, i0, c.x, c.y, c.z), args.a.type_) * args.scale;
            if (has_mask) { v += slope * m_ld(offs(args.m, i0, mc.x, mc.y, mc.z), args.m.type_); }
            mx = max(mx, v);
        }
        mx = group_max(mx, lid.x);
        var s = 0.0f;
        for (var i0 = lid.x; i0 < n; i0 += WG) {
            var v = a_ld(offs(args.a, i0, c.x, c.y, c.z), args.a.type_) * args.scale;
            if (has_mask) { v += slope * m_ld(offs(args.m, i0, mc.x, mc.y, mc.z), args.m.type_); }
            let e = exp(v - mx);
            s += e;
            d_st32(offs(args.d, i0, c.x, c.y, c.z), bitcast<u32>(e));
        }
        let inv = 1.0f / group_sum(s, lid.x);
        for (var i0 = lid.x; i0 < n; i0 += WG) {
            let db = offs(args.d, i0, c.x, c.y, c.z);
            d_st32(db, bitcast<u32>(bitcast<f32>(d_w(db)) * inv));
        }
    }
}

//@kernel k_sum_rows
//@writes d
//@include reduce

ENTRY {
    let l = lid.x;
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        var s = 0.0f;
        for (var i0 = l; i0 < ne_of(args.a, 0u); i0 += WG) { s += a_ld(offs(args.a, i0, c.x, c.y, c.z), args.a.type_); }
        let total = group_sum(s, l);
        if (l == 0u) { d_st(offs(args.d, 0u, c.x, c.y, c.z), args.d.type_, total); }
    }
}

//@kernel k_argmax
var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<i32, WG>;

fn group_max_int(v: i32, l: u32) -> i32 {
    ri[l] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (l < s) { ri[l] = max(ri[l], ri[l + s]); }
        workgroupBarrier();
    }
    let r = ri[0];
    workgroupBarrier();
    return r;
}

fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }

ENTRY {
    let l = lid.x;
    let n = ne_of(args.a, 0u);
    for (var row = wid.y; row < nrows_of(args.a); row += nwg.y) {
        let c = row_coords(args.a, row);
        var last_num = -1;
        for (var i0 = l; i0 < n; i0 += WG) {
            if (!is_nan(a_ld(offs(args.a, i0, c.x, c.y, c.z), T_F32))) { last_num = i32(i0); }
        }
        last_num = group_max_int(last_num, l);
        var last_nan = -1;
        for (var i0 = i32(l); i0 < last_num; i0 += i32(WG)) {
            if (is_nan(a_ld(offs(args.a, u32(i0), c.x, c.y, c.z), T_F32))) { last_nan = i0; }
        }
        last_nan = group_max_int(last_nan, l);
        var best = LOWEST;
        var bi = -1;
        for (var i0 = last_nan + 1 + i32(l); i0 <= last_num; i0 += i32(WG)) {
            let v = a_ld(offs(args.a, u32(i0), c.x, c.y, c.z), T_F32);
            if (bi < 0 || v >= best) { best = v; bi = i0; }
        }
        rv[l] = best;
        ri[l] = bi;
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (l < s) {
                let v = rv[l + s];
                let i = ri[l + s];
                if (i >= 0 && (ri[l] < 0 || v > rv[l] || (v == rv[l] && i > ri[l]))) {
                    rv[l] = v;
                    ri[l] = i;
                }
            }
            workgroupBarrier();
        }
        if (l == 0u) { d_st32(offs(args.d, c.x, c.y, c.z, 0u), bitcast<u32>(max(ri[0], 0))); }
        workgroupBarrier();
    }
}

//@kernel k_top_k
var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<i32, WG>;

fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }

// numbers before NaNs, larger first, then lower index
fn ranks_before(x: f32, i: i32, y: f32, j: i32) -> bool {
    let xn = is_nan(x);
    let yn = is_nan(y);
    if (xn != yn) { return yn; }
    if (!xn && x != y) { return x > y; }
    return i < j;
}

ENTRY {
    let l = lid.x;
    let n = ne_of(args.a, 0u);
    for (var row = wid.y; row < nrows_of(args.a); row += nwg.y) {
        let c = row_coords(args.a, row);
        var prev_v = 0.0f;
        var prev_i = -1;
        for (var j = 0; j < args.k; j++) {
            var best = 0.0f;
            var bi = -1;
            for (var i0 = l; i0 < n; i0 += WG) {
                let v = a_ld(offs(args.a, i0, c.x, c.y, c.z), T_F32);
                let ii = i32(i0);
                if ((prev_i < 0 || ranks_before(prev_v, prev_i, v, ii)) &&
                    (bi < 0 || ranks_before(v, ii, best, bi))) {
                    best = v;
                    bi = ii;
                }
            }
            rv[l] = best;
            ri[l] = bi;
            workgroupBarrier();
            for (var s = WG / 2u; s > 0u; s >>= 1u) {
                if (l < s && ri[l + s] >= 0 &&
                    (ri[l] < 0 || ranks_before(rv[l + s], ri[l + s], rv[l], ri[l]))) {
                    rv[l] = rv[l + s];
                    ri[l] = ri[l + s];
                }
                workgroupBarrier();
            }
            prev_v = rv[0];
            prev_i = ri[0];
            if (l == 0u) { d_st32(offs(args.d, u32(j), c.x, c.y, c.z), bitcast<u32>(prev_i)); }
            workgroupBarrier();
        }
    }
}

//@kernel k_argsort_init
ENTRY {
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        for (var i = lid.x; i < ne_of(args.d, 0u); i += WG) { d_st32(offs(args.d, i, c.x, c.y, c.z), i); }
    }
}

//@kernel k_argsort_step
fn out_of_order(c: vec3<u32>, x: u32, y: u32) -> bool {
    let vx = a_ld(offs(args.a, x, c.x, c.y, c.z), T_F32);
    let vy = a_ld(offs(args.a, y, c.x, c.y, c.z), T_F32);
    if (vx == vy) { return x > y; }
    return select(vx > vy, vx < vy, args.desc != 0);
}

ENTRY {
    let n = ne_of(args.a, 0u);
    let k = u32(args.k);
    let j = u32(args.j);
    for (var row = wid.y; row < nrows_of(args.a); row += nwg.y) {
        let c = row_coords(args.a, row);
        for (var t = lid.x; t < u32(args.npad) / 2u; t += WG) {
            let lo = (t / j) * 2u * j + t % j;
            let hi = select(lo + j, lo ^ (k - 1u), j == k / 2u);
            if (hi < n) {
                let px = offs(args.d, lo, c.x, c.y, c.z);
                let py = offs(args.d, hi, c.x, c.y, c.z);
                let x = d_w(px);
                let y = d_w(py);
                if (out_of_order(c, x, y)) { d_st32(px, y); d_st32(py, x); }
            }
        }
    }
}

//@kernel k_rope
//@writes d
fn rope_yarn_ramp(low: f32, high: f32, i0: u32) -> f32 {
    let y = f32(i0 / 2u) - low;
    let r = y / max(0.001f, high - low);
    return 1.0f - min(1.0f, max(0.0f, r));
}

ENTRY {
    let n_dims = u32(args.n_dims);
    let half_dims = n_dims / 2u;
    let neox = args.neox != 0;
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        let p = f32(bitcast<i32>(pos_w(args.pos.off.x + c.y * args.pos.nb[0].x)));
        for (var t = lid.x; t < half_dims + ne_of(args.d, 0u) - n_dims; t += WG) {
            if (t >= half_dims) {
                let i0 = n_dims + t - half_dims;
                d_st(offs(args.d, i0, c.x, c.y, c.z), args.d.type_, a_ld(offs(args.a, i0, c.x, c.y, c.z), args.a.type_));
                continue;
            }
            let ix = select(2u * t, t, neox);
            let iy = select(2u * t + 1u, t + half_dims, neox);
            var theta_extrap = p * pow(args.theta_scale, f32(t));
            if (args.has_ff != 0) { theta_extrap /= bitcast<f32>(ff_w(args.ff.off.x + t * args.ff.nb[0].x)); }
            let theta_interp = args.freq_scale * theta_extrap;
            var theta = theta_interp;
            var mscale = args.attn_factor;
            if (args.ext_factor != 0.0f) {
                let mix = rope_yarn_ramp(args.corr0, args.corr1, 2u * t) * args.ext_factor;
                theta = theta_interp * (1.0f - mix) + theta_extrap * mix;
                mscale *= 1.0f + 0.1f * log(1.0f / args.freq_scale);
            }
            let cs = cos(theta) * mscale;
            let sn = sin(theta) * mscale;
            let x0 = a_ld(offs(args.a, ix, c.x, c.y, c.z), args.a.type_);
            let x1 = a_ld(offs(args.a, iy, c.x, c.y, c.z), args.a.type_);
            d_st(offs(args.d, ix, c.x, c.y, c.z), args.d.type_, x0 * cs - x1 * sn);
            d_st(offs(args.d, iy, c.x, c.y, c.z), args.d.type_, x0 * sn + x1 * cs);
        }
    }
}
