// Quantizing one 32-element block exactly as ggml's reference quantizers (and the
// gguf package) do: the same float32 operations in the same order, never fused, so
// the bytes are identical to what llama.cpp's tools write.

inline void store_f16_at(global uchar *p, float v) {
    const ushort h = f32_to_f16(v);
    p[0] = (uchar)(h & 0xffu);
    p[1] = (uchar)(h >> 8);
}

inline float abs_f(float v) { return as_float(as_uint(v) & 0x7fffffffu); }

// The element of largest magnitude, keeping its sign; the first one on ties.
inline float signed_absmax(const float *x) {
    float amax = -1.0f, v = 0.0f;
    for (int j = 0; j < QK; j++) {
        const float a = abs_f(x[j]);
        if (a > amax) { amax = a; v = x[j]; }
    }
    return v;
}

inline void block_min_max(const float *x, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < QK; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    *mn = lo;
    *mx = hi;
}

inline float inverse(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

// Non-negative code t truncated to an integer and capped at top (the C reference's cast).
inline uint to_code(float t, uint top) {
    const uint q = (uint)t;
    return q < top ? q : top;
}

inline void quantize_block(const float *x, global uchar *b, int t) {
#pragma OPENCL FP_CONTRACT OFF
    uint q[QK];
    switch (t) {
    case T_Q8_0: {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmax(amax, abs_f(x[j]));
        const float d = amax / 127.0f, id = inverse(d);
        store_f16_at(b, d);
        for (int j = 0; j < QK; j++) {
            const float v = x[j] * id;
            ((global char *)(b + 2))[j] = (char)round(v);
        }
        return;
    }
    case T_Q4_0:
    case T_Q5_0: {
        const int five = t == T_Q5_0;
        const float d = signed_absmax(x) / (five ? -16.0f : -8.0f), id = inverse(d);
        const float bias = five ? 16.5f : 8.5f;
        for (int j = 0; j < QK; j++) {
            float v = x[j] * id;
            v += bias;
            q[j] = to_code(v, five ? 31u : 15u);
        }
        store_f16_at(b, d);
        break;
    }
    case T_Q4_1:
    case T_Q5_1: {
        const int five = t == T_Q5_1;
        float mn, mx;
        block_min_max(x, &mn, &mx);
        float d = mx - mn;
        d /= five ? 31.0f : 15.0f;
        const float id = inverse(d);
        for (int j = 0; j < QK; j++) {
            float v = x[j] - mn;
            v *= id;
            v += 0.5f;
            q[j] = to_code(v, five ? 31u : 15u);
        }
        store_f16_at(b, d);
        store_f16_at(b + 2, mn);
        break;
    }
    default:
        return;
    }
    // pack: low nibbles of q[0..15] and q[16..31]; fifth bits into qh (5-bit types)
    const int qs = t == T_Q4_0 ? 2 : t == T_Q4_1 ? 4 : t == T_Q5_0 ? 6 : 8;
    for (int j = 0; j < QK / 2; j++) b[qs + j] = (uchar)((q[j] & 15u) | ((q[j + 16] & 15u) << 4));
    if (t == T_Q5_0 || t == T_Q5_1) {
        uint qh = 0;
        for (int j = 0; j < QK; j++) qh |= ((q[j] >> 4) & 1u) << j;
        for (int k = 0; k < 4; k++) b[qs - 4 + k] = (uchar)(qh >> (8 * k));
    }
}
