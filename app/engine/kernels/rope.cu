// Rotary position embedding, in place on q and k rows, as ggml_rope_ext without YaRN (ext_factor 0,
// attn_factor 1): pair i < n_rot / 2 turns by theta = pos * freq_scale * freq_base^(-2i / n_rot) /
// freq_factors[i] (llama 3's rope_freqs, or none); "normal" pairs are (2i, 2i + 1), NeoX pairs are
// (i, i + n_rot / 2); (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos); dims from n_rot on pass through.
//
// theta is formed and reduced modulo 2 pi in double precision (freq_base and freq_scale are double
// arguments), then sin/cos in float: at position 5000 a float theta (ggml's way) is already ~1e-3 rad off
// the exact angle. Positions are read from a device array, so a captured graph replays with new ones.
#include "compat.cuh"

// q: rows of hq heads of hd, token t at q + t * q_stride; k: hk heads, token t at k + t * k_stride (k is
// not read when hk == 0). freq_factors: [n_rot / 2] or null. One cos/sin per (token, pair) serves every
// head of q and k. grid (n), block (n_rot / 2, heads side by side); n_rot even and <= hd.
extern "C" __global__ void rope_f32(float* __restrict__ q, float* __restrict__ k, const i32* __restrict__ pos,
                                    const float* __restrict__ freq_factors, i32 hq, i32 hk, i32 hd, i32 n_rot,
                                    i32 q_stride, i32 k_stride, double freq_base, double freq_scale, i32 neox) {
    const i32 t = blockIdx.x;
    const i32 i = threadIdx.x;
    const i32 half = n_rot / 2;
    if (i >= half) return;
    const double two_pi = 6.283185307179586476925;
    double theta = (double)pos[t] * freq_scale * pow(freq_base, -2.0 * i / n_rot);
    if (freq_factors) theta /= (double)freq_factors[i];
    const float r = (float)(theta - two_pi * rint(theta / two_pi));
    float s;
    float c;
    sincosf(r, &s, &c);
    const i32 a = neox ? i : 2 * i;
    const i32 b = neox ? i + half : 2 * i + 1;
    for (i32 h = threadIdx.y; h < hq + hk; h += blockDim.y) {
        float* row = h < hq ? q + (i64)t * q_stride + (i64)h * hd : k + (i64)t * k_stride + (i64)(h - hq) * hd;
        const float x0 = row[a];
        const float x1 = row[b];
        row[a] = x0 * c - x1 * s;
        row[b] = x0 * s + x1 * c;
    }
}
