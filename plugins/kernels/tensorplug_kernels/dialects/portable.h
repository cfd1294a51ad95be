// Portable fallbacks, written in the dialect's own words: every primitive a prelude
// does not define natively (or every one, with -DTP_PORTABLE) comes from here. OpenCL
// on PoCL uses all of them, so CI checks these bodies numerically on every run.

#ifndef WG
#define WG 64
#endif

#ifndef TP_HAS_H2F
// IEEE half -> float with integer operations only (bit-exact, any dialect).
TP_FN float tp_h2f(uint h) {
    const uint e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    const float sub = (float)m * 5.9604644775390625e-8f;  // subnormal: m * 2^-24, exact
    const uint mag = e == 0u ? tp_as_uint(sub)
                   : e == 31u ? (0x7f800000u | (m << 13))
                   : (((e + 112u) << 23) | (m << 13));
    return tp_as_float(mag | ((h & 0x8000u) << 16));
}
#endif

#ifndef TP_HAS_LOAD_F16X8
// Eight f16 values (aligned to 2 bytes) as f32 lanes.
TP_FN tp_f32x8 tp_load_f16x8(const TP_GLOBAL uchar *p) {
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = tp_h2f(((const TP_GLOBAL ushort *)p)[i]);
    return tp_f32x8_load_private(f);
}
#endif

#ifndef TP_HAS_GROUP_REDUCE
// Sum / maximum over the WG work-items of a group through a local-memory tree; every
// work-item must call it and gets the result. scratch holds WG floats.
TP_FN float tp_group_sum(float v, TP_LOCAL float *scratch, int lid) {
    scratch[lid] = v;
    TP_BARRIER();
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] += scratch[lid + s];
        TP_BARRIER();
    }
    const float r = scratch[0];
    TP_BARRIER();
    return r;
}
TP_FN float tp_group_max(float v, TP_LOCAL float *scratch, int lid) {
    scratch[lid] = v;
    TP_BARRIER();
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] = scratch[lid] > scratch[lid + s] ? scratch[lid] : scratch[lid + s];
        TP_BARRIER();
    }
    const float r = scratch[0];
    TP_BARRIER();
    return r;
}
#endif

#ifndef TP_HAS_DOT4_I8
// c plus the dot product of the four signed bytes packed in a and in b.
TP_FN int tp_dot4_i8(int a, int b, int c) {
    for (int k = 0; k < 32; k += 8) c += (int)(tp_i8)((a >> k) & 0xff) * (int)(tp_i8)((b >> k) & 0xff);
    return c;
}
#endif
