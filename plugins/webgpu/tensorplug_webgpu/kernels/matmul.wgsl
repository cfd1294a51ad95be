// Matrix products d = b · aᵀ (ggml_mul_mat), the port of matmul.tpk: weights of any
// float or quantized type dequantized in the kernel from u32 words.

//@kernel k_mul_mat
// Any types, any strides: a work-group per row of d, an item per output value.
ENTRY {
    let K = ne_of(args.a, 0u);
    let r2 = u32(args.r2);
    let r3 = u32(args.r3);
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        for (var o = lid.x; o < ne_of(args.d, 0u); o += WG) {
            var s = 0.0f;
            for (var k = 0u; k < K; k++) {
                s += a_elem(args.a, k, o, c.y / r2, c.z / r3) *
                     b_ld(offs(args.b, k, c.x, c.y, c.z), args.b.type_);
            }
            d_st32(offs(args.d, o, c.x, c.y, c.z), bitcast<u32>(s));
        }
    }
}

//@kernel k_mul_mat_id
// Mixture of experts: row (e, t) of d is expert ids[e, t] of w times row (e % n_b, t)
// of b; a bad expert id is reported in the error word and its row left as zeros.
ENTRY {
    let K = ne_of(args.w, 0u);
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let e = row % ne_of(args.d, 1u);
        let t = row / ne_of(args.d, 1u);
        let ex = bitcast<i32>(ids_w(offs(args.ids, e, t, 0u, 0u)));
        let ok = ex >= 0 && ex < args.w.ne[2];
        if (!ok && lid.x == 0u) { report_bad_index(ex); }
        let be = e % ne_of(args.b, 1u);
        for (var o = lid.x; o < ne_of(args.d, 0u); o += WG) {
            var s = 0.0f;
            if (ok) {
                for (var k = 0u; k < K; k++) {
                    s += w_elem(args.w, k, o, u32(ex), 0u) * b_ld(offs(args.b, k, be, t, 0u), args.b.type_);
                }
            }
            d_st32(offs(args.d, o, e, t, 0u), bitcast<u32>(s));
        }
    }
}

//@kernel k_mul_mat_vec
//@abi k_mul_mat
//@include dot
// Few rows of b (decode): a work-group per output value, its items striding over K (a
// 32-element block at a time for the block-quantized types, unpacking whole words) and
// summing in workgroup memory, so the outputs spread over every compute unit.
var<workgroup> red: array<f32, WG>;

ENTRY {
    let K = ne_of(args.a, 0u);
    let n_out = ne_of(args.d, 0u);
    let total = n_out * nrows_of(args.d);
    let r2 = u32(args.r2);
    let r3 = u32(args.r3);
    let l = lid.x;
    let t = args.a.type_;
    let bt = args.b.type_;
    let bs = args.b.nb[0].x;
    for (var row = wid.y; row < total; row += nwg.y) {
        let o = row % n_out;
        let c = row_coords(args.d, row / n_out);
        var s = 0.0f;
        if (is_quant(t)) {
            for (var ib = l; ib < K / QK; ib += WG) {
                let blk = offs(args.a, ib, o, c.y / r2, c.z / r3);
                s += block_dot(blk, t, offs(args.b, ib * QK, c.x, c.y, c.z), bs, bt);
            }
        } else {
            for (var k = l; k < K; k += WG) {
                s += a_elem(args.a, k, o, c.y / r2, c.z / r3) *
                     b_ld(offs(args.b, k, c.x, c.y, c.z), bt);
            }
        }
        red[l] = s;
        workgroupBarrier();
        for (var h = WG / 2u; h > 0u; h >>= 1u) {
            if (l < h) { red[l] += red[l + h]; }
            workgroupBarrier();
        }
        if (l == 0u) { d_st32(offs(args.d, o, c.x, c.y, c.z), bitcast<u32>(red[0])); }
        workgroupBarrier();
    }
}

//@kernel k_mul_mat_cols
//@abi k_mul_mat
//@include dot
// Without barriers, for CPU adapters (lavapipe runs a work-group with barriers item by
// item): work-group (x, y) computes outputs x*WG.. of rows y, y + groups, ..., each item
// one output value over the whole of K (a block at a time for the block-quantized types).
ENTRY {
    let K = ne_of(args.a, 0u);
    let o = wid.x * WG + lid.x;
    if (o >= ne_of(args.d, 0u)) { return; }
    let r2 = u32(args.r2);
    let r3 = u32(args.r3);
    let t = args.a.type_;
    let bt = args.b.type_;
    let bs = args.b.nb[0].x;
    for (var row = wid.y; row < nrows_of(args.d); row += nwg.y) {
        let c = row_coords(args.d, row);
        var s = 0.0f;
        if (is_quant(t)) {
            for (var ib = 0u; ib < K / QK; ib++) {
                let blk = offs(args.a, ib, o, c.y / r2, c.z / r3);
                s += block_dot(blk, t, offs(args.b, ib * QK, c.x, c.y, c.z), bs, bt);
            }
        } else {
            for (var k = 0u; k < K; k++) {
                s += a_elem(args.a, k, o, c.y / r2, c.z / r3) * b_ld(offs(args.b, k, c.x, c.y, c.z), bt);
            }
        }
        d_st32(offs(args.d, o, c.x, c.y, c.z), bitcast<u32>(s));
    }
}
