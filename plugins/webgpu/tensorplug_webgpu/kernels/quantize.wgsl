// Quantizing one 32-element block into binding d at byte b, exactly as ggml's reference
// quantizers (the port of quant.tpk): the same float32 operations in the same order.
// Included by the kernels that quantize ("//@include quantize"); d is atomic there, as
// blocks of 18 to 34 bytes share words with their neighbours.

fn st_f16_bytes(b: u32, v: f32) {
    let h = f32_to_f16(v);
    d_st8(b, h & 0xffu);
    d_st8(b + 1u, h >> 8u);
}

fn inverse(d: f32) -> f32 { return select(0.0f, 1.0f / d, d != 0.0f); }

// C's roundf: halves away from zero (WGSL's round goes to even).
fn round_away(v: f32) -> f32 {
    let t = trunc(v);
    return select(t, t + sign(v), abs(v - t) >= 0.5f);
}

fn to_code(t: f32, top: u32) -> u32 { return min(u32(t), top); }

fn quantize_block(x: array<f32, 32>, b: u32, t: i32) {
    var q: array<u32, 32>;
    if (t == T_Q8_0) {
        var amax = 0.0f;
        for (var j = 0u; j < QK; j++) { amax = max(amax, abs(x[j])); }
        let d = amax / 127.0f;
        let id = inverse(d);
        st_f16_bytes(b, d);
        for (var j = 0u; j < QK; j++) {
            d_st8(b + 2u + j, bitcast<u32>(i32(round_away(x[j] * id))) & 0xffu);
        }
        return;
    }
    if (t == T_Q4_0 || t == T_Q5_0) {
        let five = t == T_Q5_0;
        var amax = -1.0f;
        var vmax = 0.0f;
        for (var j = 0u; j < QK; j++) {
            if (abs(x[j]) > amax) { amax = abs(x[j]); vmax = x[j]; }
        }
        let d = vmax / select(-8.0f, -16.0f, five);
        let id = inverse(d);
        let bias = select(8.5f, 16.5f, five);
        for (var j = 0u; j < QK; j++) { q[j] = to_code(x[j] * id + bias, select(15u, 31u, five)); }
        st_f16_bytes(b, d);
    } else if (t == T_Q4_1 || t == T_Q5_1) {
        let five = t == T_Q5_1;
        var mn = x[0];
        var mx = x[0];
        for (var j = 1u; j < QK; j++) {
            mn = select(mn, x[j], x[j] < mn);
            mx = select(mx, x[j], x[j] > mx);
        }
        let d = (mx - mn) / select(15.0f, 31.0f, five);
        let id = inverse(d);
        for (var j = 0u; j < QK; j++) {
            q[j] = to_code((x[j] - mn) * id + 0.5f, select(15u, 31u, five));
        }
        st_f16_bytes(b, d);
        st_f16_bytes(b + 2u, mn);
    } else {
        return;
    }
    var qs = 8u;
    if (t == T_Q4_0) { qs = 2u; } else if (t == T_Q4_1) { qs = 4u; } else if (t == T_Q5_0) { qs = 6u; }
    for (var j = 0u; j < QK / 2u; j++) { d_st8(b + qs + j, (q[j] & 15u) | ((q[j + 16u] & 15u) << 4u)); }
    if (t == T_Q5_0 || t == T_Q5_1) {
        var qh = 0u;
        for (var j = 0u; j < QK; j++) { qh |= ((q[j] >> 4u) & 1u) << j; }
        for (var k = 0u; k < 4u; k++) { d_st8(b + qs - 4u + k, (qh >> (8u * k)) & 0xffu); }
    }
}
