// Shared WGSL definitions, the WebGPU counterpart of the kernel library's common.tpk.
//
// WGSL has no 8-bit, 16-bit or 64-bit types without extensions (lavapipe has none), so
// every tensor binding is an array of u32 words and values are unpacked from them:
// f16 through unpack2x16float, 8-bit quants by shifts. 64-bit fields of the arguments
// struct are vec2<u32> (low, high); offsets and strides fit the low word because a
// binding never exceeds maxStorageBufferBindingSize (< 4 GiB).

const T_F32: i32 = 0;
const T_F16: i32 = 1;
const T_Q4_0: i32 = 2;
const T_Q4_1: i32 = 3;
const T_Q5_0: i32 = 6;
const T_Q5_1: i32 = 7;
const T_Q8_0: i32 = 8;
const T_Q2_K: i32 = 10;
const T_Q3_K: i32 = 11;
const T_Q4_K: i32 = 12;
const T_Q5_K: i32 = 13;
const T_Q6_K: i32 = 14;
const T_I8: i32 = 24;
const T_I16: i32 = 25;
const T_I32: i32 = 26;
const T_I64: i32 = 27;
const T_BF16: i32 = 30;

const QK: u32 = 32u;
const QK_K: u32 = 256u;
// the most negative finite f32: the start of max reductions (WGSL has no infinite constants)
const LOWEST: f32 = -3.40282347e+38f;

struct TpTensor {
    off: vec2<u32>,
    type_: i32,
    pad_: i32,
    ne: array<i32, 4>,
    nb: array<vec2<u32>, 4>,
}

fn ne_of(t: TpTensor, i: u32) -> u32 { return u32(t.ne[i]); }
fn nrows_of(t: TpTensor) -> u32 { return u32(t.ne[1]) * u32(t.ne[2]) * u32(t.ne[3]); }

// Byte offset of element (i0, i1, i2, i3) from the tensor's first byte.
fn offs(t: TpTensor, i0: u32, i1: u32, i2: u32, i3: u32) -> u32 {
    return t.off.x + i0 * t.nb[0].x + i1 * t.nb[1].x + i2 * t.nb[2].x + i3 * t.nb[3].x;
}

// Row r of t as (i1, i2, i3).
fn row_coords(t: TpTensor, r: u32) -> vec3<u32> {
    let n1 = u32(t.ne[1]);
    let n2 = u32(t.ne[2]);
    return vec3<u32>(r % n1, (r / n1) % n2, r / (n1 * n2));
}

// f32 -> f16 bits with integer operations, round to nearest even like numpy (WGSL
// leaves pack2x16float's rounding to the implementation).
fn f32_to_f16(f: f32) -> u32 {
    var a = bitcast<u32>(f);
    let sign = (a >> 16u) & 0x8000u;
    a = a & 0x7fffffffu;
    var r: u32;
    if (a >= 0x47800000u) {
        r = select(0x7c00u, 0x7e00u, a > 0x7f800000u);
    } else if (a < 0x38800000u) {
        r = bitcast<u32>(bitcast<f32>(a) + 0.5f) - 0x3f000000u;
    } else {
        r = (a + 0xc8000fffu + ((a >> 13u) & 1u)) >> 13u;
    }
    return (r | sign) & 0xffffu;
}

fn f16_to_f32(h: u32) -> f32 { return unpack2x16float(h).x; }
fn bf16_to_f32(h: u32) -> f32 { return bitcast<f32>(h << 16u); }

fn f32_to_bf16(f: f32) -> u32 {
    let x = bitcast<u32>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) { return ((x >> 16u) | 0x40u) & 0xffffu; }
    return ((x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u) & 0xffffu;
}

fn sext8(v: u32) -> i32 { return (bitcast<i32>(v) << 24u) >> 24u; }
fn sext16(v: u32) -> i32 { return (bitcast<i32>(v) << 16u) >> 16u; }

fn is_quant(t: i32) -> bool {
    return t == T_Q4_0 || t == T_Q4_1 || t == T_Q5_0 || t == T_Q5_1 || t == T_Q8_0;
}
fn is_kquant(t: i32) -> bool { return t >= T_Q2_K && t <= T_Q6_K; }

// 1 + erf(x), the library's rational fit (every backend computes the same).
fn one_plus_erf(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0f / (1.0f + 0.5f * z);
    let p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f +
        t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f +
        t * (-0.82215223f + t * 0.17087277f))))))));
    let erfc = t * exp(-z * z + p);
    return select(2.0f - erfc, erfc, x < 0.0f);
}

fn alibi_slope(max_bias: f32, h: i32, n_head_log2: i32, m0: f32, m1: f32) -> f32 {
    if (max_bias <= 0.0f) { return 1.0f; }
    if (h < n_head_log2) { return pow(m0, f32(h + 1)); }
    return pow(m1, f32(2 * (h - n_head_log2) + 1));
}
