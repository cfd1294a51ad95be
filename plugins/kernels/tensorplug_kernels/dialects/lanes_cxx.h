// Eight-wide float and integer lanes for the C++ dialects (CUDA, Metal), which have no
// eight-wide vector types: a struct of eight values and the operators kernel bodies use
// on OpenCL's float8/uint8. Compilers keep such structs in registers and unroll the loops.
struct tp_f32x8 { float v[8]; };
struct tp_u32x8 { uint v[8]; };

#define TP_LANES_F(expr) { tp_f32x8 r; for (int i = 0; i < 8; i++) r.v[i] = (expr); return r; }
#define TP_LANES_U(expr) { tp_u32x8 r; for (int i = 0; i < 8; i++) r.v[i] = (expr); return r; }
TP_FN tp_f32x8 operator+(tp_f32x8 a, tp_f32x8 b) TP_LANES_F(a.v[i] + b.v[i])
TP_FN tp_f32x8 operator-(tp_f32x8 a, tp_f32x8 b) TP_LANES_F(a.v[i] - b.v[i])
TP_FN tp_f32x8 operator*(tp_f32x8 a, tp_f32x8 b) TP_LANES_F(a.v[i] * b.v[i])
TP_FN tp_f32x8 operator+(tp_f32x8 a, float b) TP_LANES_F(a.v[i] + b)
TP_FN tp_f32x8 operator-(tp_f32x8 a, float b) TP_LANES_F(a.v[i] - b)
TP_FN tp_f32x8 operator*(tp_f32x8 a, float b) TP_LANES_F(a.v[i] * b)
TP_FN tp_f32x8 &operator+=(TP_PRIVATE tp_f32x8 &a, tp_f32x8 b) {
    for (int i = 0; i < 8; i++) a.v[i] += b.v[i];
    return a;
}
TP_FN tp_u32x8 operator&(tp_u32x8 a, uint b) TP_LANES_U(a.v[i] & b)
TP_FN tp_u32x8 operator|(tp_u32x8 a, tp_u32x8 b) TP_LANES_U(a.v[i] | b.v[i])
TP_FN tp_u32x8 operator>>(tp_u32x8 a, uint b) TP_LANES_U(a.v[i] >> b)
TP_FN tp_u32x8 operator>>(tp_u32x8 a, tp_u32x8 b) TP_LANES_U(a.v[i] >> b.v[i])
TP_FN tp_u32x8 operator<<(tp_u32x8 a, uint b) TP_LANES_U(a.v[i] << b)
TP_FN tp_u32x8 operator<<(tp_u32x8 a, tp_u32x8 b) TP_LANES_U(a.v[i] << b.v[i])

TP_FN tp_f32x8 tp_load_f32x8(const TP_GLOBAL float *p) TP_LANES_F(p[i])
TP_FN tp_u32x8 tp_load_u16x8(const TP_GLOBAL uchar *p)
    TP_LANES_U((uint)p[2 * i] | ((uint)p[2 * i + 1] << 8))
TP_FN tp_u32x8 tp_load_u8x8(const TP_GLOBAL uchar *p) TP_LANES_U((uint)p[i])
TP_FN tp_f32x8 tp_load_i8x8_f32(const TP_GLOBAL uchar *p) TP_LANES_F((float)(tp_i8)p[i])
TP_FN void tp_store_local_f32x8(TP_LOCAL float *p, tp_f32x8 v) {
    for (int i = 0; i < 8; i++) p[i] = v.v[i];
}
TP_FN tp_f32x8 tp_f32x8_splat(float b) TP_LANES_F(b)
TP_FN tp_u32x8 tp_u32x8_splat(uint b) TP_LANES_U(b)
TP_FN tp_u32x8 tp_u32x8_iota(uint base) TP_LANES_U(base + (uint)i)
TP_FN tp_f32x8 tp_u32x8_to_f32(tp_u32x8 a) TP_LANES_F((float)a.v[i])
TP_FN tp_f32x8 tp_u32x8_as_f32(tp_u32x8 a) TP_LANES_F(tp_as_float(a.v[i]))
TP_FN float tp_f32x8_sum(tp_f32x8 a) {
    return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7]));
}
TP_FN tp_f32x8 tp_f32x8_load_private(const TP_PRIVATE float *a) TP_LANES_F(a[i])
#undef TP_LANES_F
#undef TP_LANES_U
