// Elementwise arithmetic, copies with conversion, gathers and scatters: the WGSL port
// of the kernel library's elementwise.tpk, with the same arguments structs (generated
// from it) and the same work layout (a work-group per row, its items over the row).
// Sections start at "//@kernel <name>"; "//@writes <binding>" names what a kernel
// stores into (bound atomically when its values are narrower than a word).

//@kernel k_binary
//@writes d
ENTRY {
    let tile0 = args.b.ne[0] != args.d.ne[0];
    let nb0 = u32(args.b.ne[0]);
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        let bc = vec3<u32>(c.x % ne_of(args.b, 1u), c.y % ne_of(args.b, 2u), c.z % ne_of(args.b, 3u));
        for (var i0 = lid.x; i0 < ne_of(args.d, 0u); i0 += WG) {
            let x = a_ld(offs(args.a, i0, c.x, c.y, c.z), args.a.type_);
            let j0 = select(i0, i0 % nb0, tile0);
            let y = b_ld(offs(args.b, j0, bc.x, bc.y, bc.z), args.b.type_);
            var r: f32;
            switch args.op {
                case 0 { r = x + y; }
                case 1 { r = x - y; }
                case 2 { r = x * y; }
                default { r = x / y; }
            }
            d_st(offs(args.d, i0, c.x, c.y, c.z), args.d.type_, r);
        }
    }
}

//@kernel k_unary
//@writes d
fn gelu(x: f32) -> f32 {
    if (x <= -10.0f) { return 0.0f; }
    if (x >= 10.0f) { return x; }
    return 0.5f * x * (1.0f + tanh(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
}

fn unary_fn(f: i32, x: f32, p0: f32, p1: f32) -> f32 {
    switch f {
        case 0 { return abs(x); }
        case 1 { return -x; }
        case 2 { return select(0.0f, x, x > 0.0f); }
        case 3 { return gelu(x); }
        case 4 { return x / (1.0f + exp(-x)); }
        case 5 { return exp(x); }
        case 6 { return tanh(x); }
        case 7 { return 1.0f / (1.0f + exp(-x)); }
        case 8 { return x * p0 + p1; }
        case 9 { return x / (1.0f + exp(-1.702f * x)); }
        case 10 { return 0.5f * x * one_plus_erf(x * 0.70710678118654752f); }
        case 11 {
            let m = select(p1, x, x < p1);
            return select(p0, m, m > p0);
        }
        default { return x; }
    }
}

ENTRY {
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        for (var i0 = lid.x; i0 < ne_of(args.d, 0u); i0 += WG) {
            let x = a_ld(offs(args.a, i0, c.x, c.y, c.z), args.a.type_);
            d_st(offs(args.d, i0, c.x, c.y, c.z), args.d.type_, unary_fn(args.fn_, x, args.p0, args.p1));
        }
    }
}

//@kernel k_glu
//@writes d
fn gelu(x: f32) -> f32 {
    if (x <= -10.0f) { return 0.0f; }
    if (x >= 10.0f) { return x; }
    return 0.5f * x * (1.0f + tanh(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
}

fn glu_fn(f: i32, v: f32, w: f32) -> f32 {
    switch f {
        case 1 { return select(0.0f, v, v > 0.0f) * w; }
        case 2 { if (v <= -10.0f) { return 0.0f; } return gelu(v) * w; }
        case 3 { return 0.5f * v * one_plus_erf(v * 0.70710678118654752f) * w; }
        case 4 { return v / (1.0f + exp(-1.702f * v)) * w; }
        default { return v / (1.0f + exp(-v)) * w; }
    }
}

ENTRY {
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        for (var i0 = lid.x; i0 < ne_of(args.d, 0u); i0 += WG) {
            let v = x_ld(offs(args.x, i0, c.x, c.y, c.z), args.x.type_);
            let w = g_ld(offs(args.g, i0, c.x, c.y, c.z), args.g.type_);
            d_st(offs(args.d, i0, c.x, c.y, c.z), args.d.type_, glu_fn(args.fn_, v, w));
        }
    }
}

//@kernel k_cpy
//@writes d
// Coordinates in t of the element with C-order index k (copies between shapes).
fn unflatten(t: TpTensor, k: u32) -> vec4<u32> {
    let n0 = ne_of(t, 0u);
    let n1 = ne_of(t, 1u);
    let n2 = ne_of(t, 2u);
    return vec4<u32>(k % n0, (k / n0) % n1, (k / (n0 * n1)) % n2, k / (n0 * n1 * n2));
}

ENTRY {
    let n0 = ne_of(args.d, 0u);
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        for (var i0 = lid.x; i0 < n0; i0 += WG) {
            var v: f32;
            if (args.reshape != 0) {
                let j = unflatten(args.s, row * n0 + i0);
                v = s_elem(args.s, j.x, j.y, j.z, j.w);
            } else {
                v = s_elem(args.s, i0, c.x, c.y, c.z);
            }
            d_st(offs(args.d, i0, c.x, c.y, c.z), args.d.type_, v);
        }
    }
}

//@kernel k_cpy_raw
//@writes d
fn unflatten(t: TpTensor, k: u32) -> vec4<u32> {
    let n0 = ne_of(t, 0u);
    let n1 = ne_of(t, 1u);
    let n2 = ne_of(t, 2u);
    return vec4<u32>(k % n0, (k / n0) % n1, (k / (n0 * n1)) % n2, k / (n0 * n1 * n2));
}

ENTRY {
    let n0 = ne_of(args.d, 0u);
    let ts = u32(args.ts);
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        for (var i0 = lid.x; i0 < n0; i0 += WG) {
            var so: u32;
            if (args.reshape != 0) {
                let j = unflatten(args.s, row * n0 + i0);
                so = offs(args.s, j.x, j.y, j.z, j.w);
            } else {
                so = offs(args.s, i0, c.x, c.y, c.z);
            }
            copy_from_s(offs(args.d, i0, c.x, c.y, c.z), so, ts);
        }
    }
}

//@kernel k_cpy_quantize
//@writes d
//@include quantize
fn unflatten(t: TpTensor, k: u32) -> vec4<u32> {
    let n0 = ne_of(t, 0u);
    let n1 = ne_of(t, 1u);
    let n2 = ne_of(t, 2u);
    return vec4<u32>(k % n0, (k / n0) % n1, (k / (n0 * n1)) % n2, k / (n0 * n1 * n2));
}

// Float s into quantized d, one work-item per 32-element block of d.
ENTRY {
    let n0 = ne_of(args.d, 0u);
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        for (var ib = lid.x; ib < n0 / QK; ib += WG) {
            var x: array<f32, 32>;
            for (var j = 0u; j < QK; j++) {
                let i0 = ib * QK + j;
                if (args.reshape != 0) {
                    let k = unflatten(args.s, row * n0 + i0);
                    x[j] = s_elem(args.s, k.x, k.y, k.z, k.w);
                } else {
                    x[j] = s_elem(args.s, i0, c.x, c.y, c.z);
                }
            }
            quantize_block(x, offs(args.d, ib, c.x, c.y, c.z), args.d.type_);
        }
    }
}

//@kernel k_get_rows
//@writes d
ENTRY {
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        let idx = bitcast<i32>(r_w(offs(args.r, c.x, c.y, c.z, 0u)));
        let ok = idx >= 0 && idx < args.a.ne[1];
        if (!ok && lid.x == 0u) { report_bad_index(idx); }
        let ui = u32(select(0, idx, ok));
        for (var i0 = lid.x; i0 < ne_of(args.d, 0u); i0 += WG) {
            let db = offs(args.d, i0, c.x, c.y, c.z);
            if (args.a.type_ == T_I32) {
                d_st32(db, select(0u, a_w(offs(args.a, i0, ui, c.y, c.z)), ok));
            } else {
                d_st(db, args.d.type_, select(0.0f, a_elem(args.a, i0, ui, c.y, c.z), ok));
            }
        }
    }
}

//@kernel k_set_rows_check
ENTRY {
    for (var row = wid.y; row < nrows_of(args.b); row += nwg.y) {
        let c = row_coords(args.b, row);
        let idx = r_ldi(offs(args.r, c.x, c.y, c.z, 0u), args.r.type_);
        if ((idx < 0 || idx >= args.d.ne[1]) && lid.x == 0u) { report_bad_index(idx); }
    }
}

//@kernel k_set_rows
//@writes d
//@include quantize
ENTRY {
    if (err_w(0u) != 0u) { return; }
    for (var row = wid.y; row < nrows_of(args.b); row += nwg.y) {
        let c = row_coords(args.b, row);
        let idx = r_ldi(offs(args.r, c.x, c.y, c.z, 0u), args.r.type_);
        if (idx < 0 || idx >= args.d.ne[1]) { continue; }
        if (is_quant(args.d.type_)) {
            for (var ib = lid.x; ib < ne_of(args.b, 0u) / QK; ib += WG) {
                var x: array<f32, 32>;
                for (var k = 0u; k < QK; k++) {
                    x[k] = b_ld(offs(args.b, ib * QK + k, c.x, c.y, c.z), args.b.type_);
                }
                quantize_block(x, offs(args.d, ib, u32(idx), c.y, c.z), args.d.type_);
            }
            continue;
        }
        for (var i0 = lid.x; i0 < ne_of(args.b, 0u); i0 += WG) {
            let v = b_ld(offs(args.b, i0, c.x, c.y, c.z), args.b.type_);
            d_st(offs(args.d, i0, u32(idx), c.y, c.z), args.d.type_, v);
        }
    }
}

//@kernel k_repeat
//@writes d
ENTRY {
    let ts = u32(args.ts);
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        let ac = vec3<u32>(c.x % ne_of(args.a, 1u), c.y % ne_of(args.a, 2u), c.z % ne_of(args.a, 3u));
        for (var i0 = lid.x; i0 < ne_of(args.d, 0u); i0 += WG) {
            let so = offs(args.a, i0 % ne_of(args.a, 0u), ac.x, ac.y, ac.z);
            copy_from_a(offs(args.d, i0, c.x, c.y, c.z), so, ts);
        }
    }
}

//@kernel k_pad
//@writes d
ENTRY {
    let ts = u32(args.ts);
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        let inside = c.x < ne_of(args.a, 1u) && c.y < ne_of(args.a, 2u) && c.z < ne_of(args.a, 3u);
        for (var i0 = lid.x; i0 < ne_of(args.d, 0u); i0 += WG) {
            let db = offs(args.d, i0, c.x, c.y, c.z);
            if (inside && i0 < ne_of(args.a, 0u)) {
                copy_from_a(db, offs(args.a, i0, c.x, c.y, c.z), ts);
            } else if (ts == 4u) {
                d_st32(db, 0u);
            } else {
                d_st16(db, 0u);
            }
        }
    }
}

//@kernel k_concat
//@writes d
ENTRY {
    let ts = u32(args.ts);
    let axis = u32(args.axis);
    let na = u32(args.a.ne[axis]);
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        for (var i0 = lid.x; i0 < ne_of(args.d, 0u); i0 += WG) {
            var k = array<u32, 4>(i0, c.x, c.y, c.z);
            let db = offs(args.d, i0, c.x, c.y, c.z);
            if (k[axis] < na) {
                copy_from_a(db, offs(args.a, k[0], k[1], k[2], k[3]), ts);
            } else {
                k[axis] -= na;
                copy_from_b(db, offs(args.b, k[0], k[1], k[2], k[3]), ts);
            }
        }
    }
}
