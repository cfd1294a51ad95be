// Accessors of one tensor binding, $X (instantiated for each buffer of a kernel):
// $X_w reads the 32-bit word holding byte b, the rest unpack bytes, halves and typed
// scalars from words, and stores of less than a word change only their own bits.
// $W and $R are the word write and read: plain for most bindings, atomic for the
// destinations of kernels where neighbouring work-items write halves of one word.

fn $X_w(b: u32) -> u32 { return $R; }

fn $X_u8(b: u32) -> u32 { return ($X_w(b) >> ((b & 3u) * 8u)) & 0xffu; }

fn $X_u16(b: u32) -> u32 {
    if ((b & 3u) == 3u) { return $X_u8(b) | ($X_u8(b + 1u) << 8u); }
    return ($X_w(b) >> ((b & 3u) * 8u)) & 0xffffu;
}

// four bytes from any byte address (the Q5 high bits sit at offset 2 of their block)
fn $X_u32(b: u32) -> u32 {
    if ((b & 3u) == 0u) { return $X_w(b); }
    return $X_u16(b) | ($X_u16(b + 2u) << 16u);
}

fn $X_f16(b: u32) -> f32 { return f16_to_f32($X_u16(b)); }

fn $X_ld(b: u32, t: i32) -> f32 {
    switch t {
        case 0 { return bitcast<f32>($X_w(b)); }
        case 1 { return f16_to_f32($X_u16(b)); }
        case 30 { return bf16_to_f32($X_u16(b)); }
        case 24 { return f32(sext8($X_u8(b))); }
        case 25 { return f32(sext16($X_u16(b))); }
        case 26 { return f32(bitcast<i32>($X_w(b))); }
        case 27 { return f32(bitcast<i32>($X_w(b + 4u))) * 4294967296.0f + f32($X_w(b)); }
        default { return 0.0f; }
    }
}

fn $X_ldi(b: u32, t: i32) -> i32 {
    // an index: i32, or i64 clamped to i32 (a bad index stays bad)
    if (t == T_I64) {
        let hi = bitcast<i32>($X_w(b + 4u));
        let lo = $X_w(b);
        if (hi == 0 && lo < 0x80000000u) { return i32(lo); }
        return select(2147483647, -2147483647, hi < 0);
    }
    return bitcast<i32>($X_w(b));
}

fn $X_st32(b: u32, v: u32) { $W; }

fn $X_st8(b: u32, v: u32) {
    let sh = (b & 3u) * 8u;
    $X_and(b, ~(0xffu << sh));
    $X_or(b, (v & 0xffu) << sh);
}

fn $X_st16(b: u32, v: u32) {
    let sh = (b & 2u) * 8u;
    $X_and(b, ~(0xffffu << sh));
    $X_or(b, (v & 0xffffu) << sh);
}

fn $X_st(b: u32, t: i32, v: f32) {
    switch t {
        case 0 { $X_st32(b, bitcast<u32>(v)); }
        case 1 { $X_st16(b, f32_to_f16(v)); }
        case 30 { $X_st16(b, f32_to_bf16(v)); }
        default { }
    }
}

// Element j (0..31) of the 32-element quantized block at byte b (ggml-common.h).
fn $X_deq(b: u32, j: u32, t: i32) -> f32 {
    let d = $X_f16(b);
    let k = j & 15u;
    let sh = select(4u, 0u, j < 16u);
    switch t {
        case 8 { return d * f32(sext8($X_u8(b + 2u + j))); }
        case 2 { return d * f32(i32(($X_u8(b + 2u + k) >> sh) & 15u) - 8); }
        case 3 { return d * f32(($X_u8(b + 4u + k) >> sh) & 15u) + $X_f16(b + 2u); }
        case 6 {
            let qh = $X_u32(b + 2u);
            let q = (($X_u8(b + 6u + k) >> sh) & 15u) | (((qh >> j) & 1u) << 4u);
            return d * f32(i32(q) - 16);
        }
        case 7 {
            let qh = $X_u32(b + 4u);
            let q = (($X_u8(b + 8u + k) >> sh) & 15u) | (((qh >> j) & 1u) << 4u);
            return d * f32(q) + $X_f16(b + 2u);
        }
        default { return 0.0f; }
    }
}

// 6-bit scale and min of sub-block s of Q4_K / Q5_K (get_scale_min_k4), scales at q.
fn $X_kscale(q: u32, s: u32) -> u32 {
    if (s < 4u) { return $X_u8(q + s) & 63u; }
    return ($X_u8(q + s + 4u) & 15u) | (($X_u8(q + s - 4u) >> 6u) << 4u);
}
fn $X_kmin(q: u32, s: u32) -> u32 {
    if (s < 4u) { return $X_u8(q + s + 4u) & 63u; }
    return ($X_u8(q + s + 4u) >> 4u) | (($X_u8(q + s) >> 6u) << 4u);
}

// Element j (0..255) of the K-quant super-block at byte b (ggml's dequantize_row_q*_K).
fn $X_deqk(b: u32, j: u32, t: i32) -> f32 {
    let l = j & 31u;
    let hb = j >> 7u;
    let pair = (j >> 5u) & 3u;
    let s16 = j >> 4u;
    let s32 = j >> 5u;
    switch t {
        case 10 {
            let sc = $X_u8(b + s16);
            let q = f32(($X_u8(b + 16u + 32u * hb + l) >> (2u * pair)) & 3u);
            return $X_f16(b + 80u) * f32(sc & 15u) * q - $X_f16(b + 82u) * f32(sc >> 4u);
        }
        case 11 {
            let sc = b + 96u;
            let lo = select($X_u8(sc + s16 - 8u) >> 4u, $X_u8(sc + s16) & 15u, s16 < 8u);
            let hi = ($X_u8(sc + 8u + (s16 & 3u)) >> (2u * (s16 >> 2u))) & 3u;
            let hm = select(4, 0, (($X_u8(b + l) >> s32) & 1u) != 0u);
            let q = i32(($X_u8(b + 32u + 32u * hb + l) >> (2u * pair)) & 3u) - hm;
            return $X_f16(b + 108u) * f32(i32(lo | (hi << 4u)) - 32) * f32(q);
        }
        case 12, 13 {
            let k5 = t == T_Q5_K;
            let qs = b + select(16u, 48u, k5) + 32u * (j >> 6u);
            var q = select($X_u8(qs + l) & 15u, $X_u8(qs + l) >> 4u, (j & 32u) != 0u);
            if (k5) { q = q | ((($X_u8(b + 16u + l) >> s32) & 1u) << 4u); }
            return $X_f16(b) * f32($X_kscale(b + 4u, s32)) * f32(q) -
                   $X_f16(b + 2u) * f32($X_kmin(b + 4u, s32));
        }
        case 14 {
            let nib = $X_u8(b + 64u * hb + 32u * (pair & 1u) + l);
            let lo = select(nib >> 4u, nib & 15u, pair < 2u);
            let q = i32(lo | ((($X_u8(b + 128u + 32u * hb + l) >> (2u * pair)) & 3u) << 4u)) - 32;
            return $X_f16(b + 208u) * f32(sext8($X_u8(b + 192u + s16))) * f32(q);
        }
        default { return 0.0f; }
    }
}

// Element (i0, i1, i2, i3) of tensor tt (bound here) of any type, as f32.
fn $X_elem(tt: TpTensor, i0: u32, i1: u32, i2: u32, i3: u32) -> f32 {
    let t = tt.type_;
    if (is_quant(t)) { return $X_deq(offs(tt, i0 / QK, i1, i2, i3), i0 % QK, t); }
    if (is_kquant(t)) { return $X_deqk(offs(tt, i0 / QK_K, i1, i2, i3), i0 % QK_K, t); }
    return $X_ld(offs(tt, i0, i1, i2, i3), t);
}
