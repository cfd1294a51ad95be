// Elementwise arithmetic, copies with conversion, gathers and scatters.
//
// Every kernel walks the rows of its output with FOR_ROWS and the elements of a row
// with FOR_COLS, so it is correct for any extents and strides; an operand may alias
// the output (ops computed in place) because each element is read and written by the
// same work-item.

#define OP_ADD 0
#define OP_SUB 1
#define OP_MUL 2
#define OP_DIV 3

kernel void k_binary(int op, TENSOR(a), TENSOR(b), TENSOR(d)) {
    const global uchar *ap = BASE(a), *bp = BASE(b);
    global uchar *dp = BASE(d);
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        const global uchar *ar = ap + OFFS(a_nb, 0, i1, i2, i3);
        const global uchar *br = bp + OFFS(b_nb, 0, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        FOR_COLS(i0, d_ne.x) {
            const float x = load_scalar(ar + i0 * a_nb.x, a_t);
            const float y = load_scalar(br + i0 * b_nb.x, b_t);
            const float r = op == OP_ADD ? x + y : op == OP_SUB ? x - y : op == OP_MUL ? x * y : x / y;
            store_scalar(dr + i0 * d_nb.x, d_t, r);
        }
    }
}

#define UN_ABS 0
#define UN_NEG 1
#define UN_RELU 2
#define UN_GELU 3
#define UN_SILU 4
#define UN_EXP 5
#define UN_TANH 6
#define UN_SIGMOID 7
#define UN_SCALE 8

inline float unary_fn(int fn, float x, float p0, float p1) {
    switch (fn) {
    case UN_ABS: return fabs(x);
    case UN_NEG: return -x;
    case UN_RELU: return x > 0.0f ? x : 0.0f;
    case UN_GELU: return 0.5f * x * (1.0f + tanh(0.7978845608028654f * x * (1.0f + 0.044715f * x * x)));
    case UN_SILU: return x / (1.0f + exp(-x));
    case UN_EXP: return exp(x);
    case UN_TANH: return tanh(x);
    case UN_SIGMOID: return 1.0f / (1.0f + exp(-x));
    case UN_SCALE: return x * p0 + p1;
    }
    return x;
}

kernel void k_unary(int fn, float p0, float p1, TENSOR(a), TENSOR(d)) {
    const global uchar *ap = BASE(a);
    global uchar *dp = BASE(d);
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        const global uchar *ar = ap + OFFS(a_nb, 0, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        FOR_COLS(i0, d_ne.x) {
            const float x = load_scalar(ar + i0 * a_nb.x, a_t);
            store_scalar(dr + i0 * d_nb.x, d_t, unary_fn(fn, x, p0, p1));
        }
    }
}

// silu(x) * g; the split form of swiglu passes the two halves of one row as x and g.
kernel void k_swiglu(TENSOR(x), TENSOR(g), TENSOR(d)) {
    const global uchar *xp = BASE(x), *gp = BASE(g);
    global uchar *dp = BASE(d);
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        const global uchar *xr = xp + OFFS(x_nb, 0, i1, i2, i3);
        const global uchar *gr = gp + OFFS(g_nb, 0, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        FOR_COLS(i0, d_ne.x) {
            const float v = load_scalar(xr + i0 * x_nb.x, x_t);
            const float w = load_scalar(gr + i0 * g_nb.x, g_t);
            store_scalar(dr + i0 * d_nb.x, d_t, v / (1.0f + exp(-v)) * w);
        }
    }
}

// Coordinates in s of the element with C-order index k (copies between shapes).
#define UNFLATTEN(k, ne, j0, j1, j2, j3)                   \
    long k_ = (k);                                         \
    const int j0 = (int)(k_ % (ne).x); k_ /= (ne).x;       \
    const int j1 = (int)(k_ % (ne).y); k_ /= (ne).y;       \
    const int j2 = (int)(k_ % (ne).z);                     \
    const int j3 = (int)(k_ / (ne).z)

// Element k of d (C order) takes element k of s, converted: float or quantized s to
// a float d. With reshape == 0 the shapes are equal and coordinates map directly.
kernel void k_cpy(int reshape, TENSOR(s), TENSOR(d)) {
    const global uchar *sp = BASE(s);
    global uchar *dp = BASE(d);
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        FOR_COLS(i0, d_ne.x) {
            float v;
            if (reshape) {
                UNFLATTEN(row * d_ne.x + i0, s_ne, j0, j1, j2, j3);
                v = load_elem(sp, s_t, s_nb, j0, j1, j2, j3);
            } else {
                v = load_elem(sp, s_t, s_nb, i0, i1, i2, i3);
            }
            store_scalar(dr + i0 * d_nb.x, d_t, v);
        }
    }
}

// Float s into quantized d, one work-item per 32-element block of d.
kernel void k_cpy_quantize(int reshape, TENSOR(s), TENSOR(d)) {
    const global uchar *sp = BASE(s);
    global uchar *dp = BASE(d);
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        FOR_COLS(ib, d_ne.x / QK) {
            float x[QK];
            for (int j = 0; j < QK; j++) {
                const int i0 = ib * QK + j;
                if (reshape) {
                    UNFLATTEN(row * d_ne.x + i0, s_ne, j0, j1, j2, j3);
                    x[j] = load_elem(sp, s_t, s_nb, j0, j1, j2, j3);
                } else {
                    x[j] = load_elem(sp, s_t, s_nb, i0, i1, i2, i3);
                }
            }
            quantize_block(x, dr + ib * d_nb.x, d_t);
        }
    }
}

// Move one unit (an element, or a quantized block) of ts bytes.
inline void copy_unit(global uchar *d, const global uchar *s, int ts) {
    switch (ts) {
    case 1: *d = *s; return;
    case 2: *(global ushort *)d = *(const global ushort *)s; return;
    case 4: *(global uint *)d = *(const global uint *)s; return;
    case 8: *(global ulong *)d = *(const global ulong *)s; return;
    }
    for (int k = 0; k < ts; k += 2) *(global ushort *)(d + k) = *(const global ushort *)(s + k);
}

// Same-type copy of any type, bit for bit; ne.x counts units (blocks when quantized).
kernel void k_cpy_raw(int reshape, int ts, TENSOR(s), TENSOR(d)) {
    const global uchar *sp = BASE(s);
    global uchar *dp = BASE(d);
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        FOR_COLS(i0, d_ne.x) {
            ulong so;
            if (reshape) {
                UNFLATTEN(row * d_ne.x + i0, s_ne, j0, j1, j2, j3);
                so = OFFS(s_nb, j0, j1, j2, j3);
            } else {
                so = OFFS(s_nb, i0, i1, i2, i3);
            }
            copy_unit(dr + i0 * d_nb.x, sp + so, ts);
        }
    }
}

// d[..., j, :] = a[..., rows[..., j], :] as f32 (raw for I32 a); bad indices give 0.
kernel void k_get_rows(TENSOR(a), TENSOR(r), TENSOR(d)) {
    const global uchar *ap = BASE(a), *rp = BASE(r);
    global uchar *dp = BASE(d);
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, j, i2, i3);
        const int idx = *(const global int *)(rp + OFFS(r_nb, j, i2, i3, 0));
        const int ok = idx >= 0 && idx < a_ne.y;
        global uchar *dr = dp + OFFS(d_nb, 0, j, i2, i3);
        FOR_COLS(i0, d_ne.x) {
            if (a_t == T_I32) {
                *(global int *)(dr + i0 * d_nb.x) =
                    ok ? *(const global int *)(ap + OFFS(a_nb, i0, idx, i2, i3)) : 0;
            } else {
                const float v = ok ? load_elem(ap, a_t, a_nb, i0, idx, i2, i3) : 0.0f;
                store_scalar(dr + i0 * d_nb.x, d_t, v);
            }
        }
    }
}

// d[..., rows[..., j], :] = b[..., j, :] converted (quantized per block); bad indices skip.
kernel void k_set_rows(TENSOR(b), TENSOR(r), TENSOR(d)) {
    const global uchar *bp = BASE(b), *rp = BASE(r);
    global uchar *dp = BASE(d);
    FOR_ROWS(row, b_ne) {
        ROW_COORDS(b_ne, row, j, i2, i3);
        const global uchar *ri = rp + OFFS(r_nb, j, i2, i3, 0);
        const long idx = r_t == T_I64 ? *(const global long *)ri : (long)*(const global int *)ri;
        if (idx < 0 || idx >= d_ne.y) continue;
        const global uchar *br = bp + OFFS(b_nb, 0, j, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, idx, i2, i3);
        if (is_quant(d_t)) {
            FOR_COLS(ib, b_ne.x / QK) {
                float x[QK];
                for (int k = 0; k < QK; k++) x[k] = load_scalar(br + (ib * QK + k) * b_nb.x, b_t);
                quantize_block(x, dr + ib * d_nb.x, d_t);
            }
        } else {
            FOR_COLS(i0, b_ne.x) {
                store_scalar(dr + i0 * d_nb.x, d_t, load_scalar(br + i0 * b_nb.x, b_t));
            }
        }
    }
}

// Join a and b along axis (0 = innermost), copying elements of ts bytes.
kernel void k_concat(int axis, int ts, TENSOR(a), TENSOR(b), TENSOR(d)) {
    const global uchar *ap = BASE(a), *bp = BASE(b);
    global uchar *dp = BASE(d);
    const int na[4] = {a_ne.x, a_ne.y, a_ne.z, a_ne.w};
    FOR_ROWS(row, d_ne) {
        ROW_COORDS(d_ne, row, i1, i2, i3);
        global uchar *dr = dp + OFFS(d_nb, 0, i1, i2, i3);
        FOR_COLS(i0, d_ne.x) {
            int c[4] = {i0, i1, i2, i3};
            const int in_a = c[axis] < na[axis];
            if (!in_a) c[axis] -= na[axis];
            const global uchar *s = in_a ? ap + OFFS(a_nb, c[0], c[1], c[2], c[3])
                                         : bp + OFFS(b_nb, c[0], c[1], c[2], c[3]);
            copy_unit(dr + i0 * d_nb.x, s, ts);
        }
    }
}
