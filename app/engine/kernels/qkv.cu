// What follows the q/k/v projections, in one launch: the per-head q/k RMSNorm (Gemma3, Qwen3; optional),
// RoPE (as rope.cu), q written out for attention, k and v stored into the f16 KV cache (as kv_store_f16).
//
// The projections may come from one fused GEMV ([n, (hq + 2 hk) hd], q | k | v per token) or from
// separate ones: each of q, k, v is a pointer and a row stride. Heads 0..hq-1 are q heads; heads hq.. are
// k heads, and the k head's turn also stores the v head of the same index. Block (t, g) takes token t's
// heads g, g + G, g + 2G, ... (G = gridDim.y), so the angles (formed in double precision, slow on consumer
// GPUs) are computed once per block, not once per head.
// Thread i owns two elements of a head: rope pair i for i < n_rot / 2 ((i, i + n_rot / 2) NeoX,
// (2i, 2i + 1) normal), and past the rotated dims the pair (n_rot + 2j, n_rot + 2j + 1), j = i - n_rot / 2.
#include "attention.cuh"

// q_in, k_in, v_in: token t's head h at X_in + t * X_stride + h * hd. q_norm, k_norm: [hd] or null.
// q_out: [n, hq, hd]; cache_k, cache_v: [n_ctx, hk, hd] f16 (rows pos[t]; out of range: not stored).
// freq_factors: [n_rot / 2] or null. grid (n, G <= hq + hk), block (hd / 2 rounded up to whole warps, at
// most 1024); hd even.
extern "C" __global__ void qk_norm_rope_store_f32(
    const float* __restrict__ q_in, const float* __restrict__ k_in, const float* __restrict__ v_in,
    i32 q_stride, i32 k_stride, i32 v_stride, const float* __restrict__ q_norm,
    const float* __restrict__ k_norm, float eps, const i32* __restrict__ pos,
    const float* __restrict__ freq_factors, float* __restrict__ q_out, u16* __restrict__ cache_k,
    u16* __restrict__ cache_v, i32 hq, i32 hk, i32 hd, i32 n_rot, i32 n_ctx, double freq_base,
    double freq_scale, i32 neox) {
    __shared__ float scratch[32];
    const i32 t = blockIdx.x;
    const i32 i = threadIdx.x;
    const i32 half = n_rot / 2;
    const bool active = i < hd / 2;
    const bool rotates = i < half;
    i32 a;
    i32 b;
    if (rotates) {
        a = neox ? i : 2 * i;
        b = neox ? i + half : 2 * i + 1;
    } else {
        a = n_rot + 2 * (i - half);
        b = a + 1;
    }
    const i32 p = pos[t];
    float sn = 0.0f;
    float cs = 1.0f;
    if (rotates) {
        const double two_pi = 6.283185307179586476925;
        double theta = (double)p * freq_scale * pow(freq_base, -2.0 * i / n_rot);
        if (freq_factors) theta /= (double)freq_factors[i];
        sincosf((float)(theta - two_pi * rint(theta / two_pi)), &sn, &cs);
    }
    const bool stored = p >= 0 && p < n_ctx;
    for (i32 s = blockIdx.y; s < hq + hk; s += gridDim.y) {  // the same heads for the whole block
        const bool is_q = s < hq;
        const i32 h = is_q ? s : s - hq;
        const float* row = is_q ? q_in + (i64)t * q_stride + (i64)h * hd : k_in + (i64)t * k_stride + (i64)h * hd;
        float x0 = active ? row[a] : 0.0f;
        float x1 = active ? row[b] : 0.0f;
        const float* w = is_q ? q_norm : k_norm;
        if (w) {  // the same for the whole block
            const float ss = fs_block_sum(fmaf(x1, x1, x0 * x0), scratch);
            const float inv = 1.0f / sqrtf(ss / (float)hd + eps);
            if (active) {
                x0 = x0 * inv * w[a];
                x1 = x1 * inv * w[b];
            }
        }
        if (rotates) {
            const float y0 = x0 * cs - x1 * sn;
            const float y1 = x0 * sn + x1 * cs;
            x0 = y0;
            x1 = y1;
        }
        if (!active) continue;
        if (is_q) {
            float* out = q_out + ((i64)t * hq + h) * hd;
            out[a] = x0;
            out[b] = x1;
        } else if (stored) {
            const i64 at = ((i64)p * hk + h) * hd;
            cache_k[at + a] = fs_float_to_half_rn(x0);
            cache_k[at + b] = fs_float_to_half_rn(x1);
            const float* vr = v_in + (i64)t * v_stride + (i64)h * hd;
            cache_v[at + i] = fs_float_to_half_rn(vr[i]);
            cache_v[at + i + hd / 2] = fs_float_to_half_rn(vr[i + hd / 2]);
        }
    }
}
