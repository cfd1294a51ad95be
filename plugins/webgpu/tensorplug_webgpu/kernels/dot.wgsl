// The dot product of one 32-element block of a (bound as "a") with 32 values of b
// (bound as "b"), for the matrix-vector kernels ("//@include dot"): Q8_0, Q4_0 and Q4_1
// unpacked from whole words with the scale (and offset) applied once per block, other
// block types element by element.

// Block of a at byte blk (type t) times the 32 values of b from byte bb (stride bs).
fn block_dot(blk: u32, t: i32, bb: u32, bs: u32, bt: i32) -> f32 {
    var s = 0.0f;
    if (t == T_Q8_0) {
        for (var w = 0u; w < 8u; w++) {
            let word = a_u32(blk + 2u + 4u * w);
            for (var e = 0u; e < 4u; e++) {
                s += f32(sext8((word >> (8u * e)) & 0xffu)) * b_ld(bb + (4u * w + e) * bs, bt);
            }
        }
        return a_f16(blk) * s;
    }
    if (t == T_Q4_0 || t == T_Q4_1) {
        let one = t == T_Q4_1;
        let qs = blk + select(2u, 4u, one);
        var sb = 0.0f;
        for (var w = 0u; w < 4u; w++) {
            let word = a_u32(qs + 4u * w);
            for (var e = 0u; e < 4u; e++) {
                let byte = (word >> (8u * e)) & 0xffu;
                let j = 4u * w + e;
                let xl = b_ld(bb + j * bs, bt);
                let xh = b_ld(bb + (j + 16u) * bs, bt);
                s += f32(byte & 15u) * xl + f32(byte >> 4u) * xh;
                sb += xl + xh;
            }
        }
        // q4_0 values are q - 8: the offset times the sum of b
        return select(a_f16(blk) * (s - 8.0f * sb), a_f16(blk) * s + a_f16(blk + 2u) * sb, one);
    }
    for (var j = 0u; j < QK; j++) { s += a_deq(blk, j, t) * b_ld(bb + j * bs, bt); }
    return s;
}

