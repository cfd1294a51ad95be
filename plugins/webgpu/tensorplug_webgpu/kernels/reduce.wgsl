// Work-group reductions over one value per work-item ("//@include reduce"): the sum and
// the maximum of v over the WG items, returned to every item. Each call ends with a
// barrier, so the scratch can be used again at once.
var<workgroup> red: array<f32, WG>;

fn group_sum(v: f32, l: u32) -> f32 {
    red[l] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (l < s) { red[l] += red[l + s]; }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn group_max(v: f32, l: u32) -> f32 {
    red[l] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (l < s) { red[l] = max(red[l], red[l + s]); }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
