// RMSNorm over rows: out = x / sqrt(mean(x^2) + eps) * weight, optionally on the sum x + residual (which is
// written back to the residual stream). The per-head q/k norms of Gemma3 and Qwen3 are the same kernel on
// rows of head_dim ([n, heads, head_dim] seen as [n * heads, head_dim], one weight of head_dim).
// Gemma's norm weights already hold the +1 in GGUF, so no variant adds it here.
//
// One block per row; blockDim.x a multiple of 64 (whole warps on CUDA and HIP). Every thread reads and writes
// only its own elements, so out may be x (in place) and, in the fused kernel, out may be x or residual.
// The _q8 entry points also write out quantised for mmvq.cu (q8.cuh), one launch fewer before its GEMVs:
// d % 32 == 0, so each 32 consecutive lanes of a pass over the row hold one block of 32.
#include "compat.cuh"
#include "q8.cuh"

// 1 / sqrt(mean(row^2) + eps) from each thread's share of the sum of squares (every norm kernel sums its
// thread's elements i, i + blockDim.x, ... in order, then over the block in a fixed order).
__device__ __forceinline__ float fs_rms_inv(float ss, i32 d, float eps, float* scratch) {
    ss = fs_block_sum(ss, scratch);
    return 1.0f / sqrtf(ss / (float)d + eps);
}

// This thread's share of the sum of squares of a row of d.
__device__ __forceinline__ float fs_sum_squares(const float* row, i32 d) {
    float ss = 0.0f;
    for (i32 i = threadIdx.x; i < d; i += blockDim.x) ss = fmaf(row[i], row[i], ss);
    return ss;
}

// out = row * inv * weight, each thread its own elements.
__device__ __forceinline__ void fs_scale_row(const float* row, float inv, const float* __restrict__ weight,
                                             float* out, i32 d) {
    for (i32 i = threadIdx.x; i < d; i += blockDim.x) out[i] = row[i] * inv * weight[i];
}

// fs_scale_row, its output quantised into the row's xq [d], xd [d / 32], xs [d / 16] too.
__device__ __forceinline__ void fs_scale_row_q8(const float* row, float inv, const float* __restrict__ weight,
                                                float* out, i32 d, i8* xq, float* xd, float* xs) {
    for (i32 i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = row[i] * inv * weight[i];
        out[i] = v;
        fs_q8_element(v, i, xq, xd, xs);
    }
}

// x, out: [rows, d]; weight: [d]. grid (rows), block (64 .. 1024).
extern "C" __global__ void rms_norm_f32(const float* x, const float* __restrict__ weight, float* out, i32 d,
                                        float eps) {
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * d;
    const float inv = fs_rms_inv(fs_sum_squares(x + base, d), d, eps, scratch);
    fs_scale_row(x + base, inv, weight, out + base, d);
}

// rms_norm_f32, out also quantised: xq [rows, d], xd [rows, d / 32], xs [rows, d / 16].
extern "C" __global__ void rms_norm_q8_f32(const float* x, const float* __restrict__ weight, float* out, i32 d,
                                           float eps, i8* xq, float* xd, float* xs) {
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * d;
    const float inv = fs_rms_inv(fs_sum_squares(x + base, d), d, eps, scratch);
    fs_scale_row_q8(x + base, inv, weight, out + base, d, xq + base, xd + base / 32, xs + base / 16);
}

// residual += x; out = rms_norm(residual) * weight. x, residual, out: [rows, d]. grid (rows), block (64 .. 1024).
extern "C" __global__ void add_rms_norm_f32(const float* x, float* residual, const float* __restrict__ weight,
                                            float* out, i32 d, float eps) {
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * d;
    float ss = 0.0f;
    for (i32 i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = x[base + i] + residual[base + i];
        residual[base + i] = v;
        ss = fmaf(v, v, ss);
    }
    fs_scale_row(residual + base, fs_rms_inv(ss, d, eps, scratch), weight, out + base, d);
}

// Gemma's sublayer boundary in one launch: residual += rms_norm(x) * w_post (the sublayer's output norm),
// then out = rms_norm(residual) * w_next (the next sublayer's input norm). The same operations in the same
// order as rms_norm_f32, add_f32, rms_norm_f32 with the same block size: bit for bit their result.
// x, residual, out: [rows, d]; w_post, w_next: [d]. grid (rows), block (64 .. 1024).
template <bool Q8>
__device__ __forceinline__ void fs_rms_norm_add_rms_norm(const float* x, const float* __restrict__ w_post,
                                                         float* residual, const float* __restrict__ w_next,
                                                         float* out, i32 d, float eps, i8* xq, float* xd,
                                                         float* xs) {
#if FS_HIP
#pragma clang fp contract(off)
#endif
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * d;
    const float inv_x = fs_rms_inv(fs_sum_squares(x + base, d), d, eps, scratch);
    float ss2 = 0.0f;
    for (i32 i = threadIdx.x; i < d; i += blockDim.x) {
        // _rn: no contraction into an fma, so the sum rounds as add_f32's does
        const float v = __fadd_rn(residual[base + i], __fmul_rn(__fmul_rn(x[base + i], inv_x), w_post[i]));
        residual[base + i] = v;
        ss2 = fmaf(v, v, ss2);
    }
    const float inv = fs_rms_inv(ss2, d, eps, scratch);
    if constexpr (Q8)
        fs_scale_row_q8(residual + base, inv, w_next, out + base, d, xq + base, xd + base / 32, xs + base / 16);
    else
        fs_scale_row(residual + base, inv, w_next, out + base, d);
}

extern "C" __global__ void rms_norm_add_rms_norm_f32(const float* x, const float* __restrict__ w_post,
                                                     float* residual, const float* __restrict__ w_next,
                                                     float* out, i32 d, float eps) {
    fs_rms_norm_add_rms_norm<false>(x, w_post, residual, w_next, out, d, eps, nullptr, nullptr, nullptr);
}

// rms_norm_add_rms_norm_f32, out also quantised: xq [rows, d], xd [rows, d / 32], xs [rows, d / 16].
extern "C" __global__ void rms_norm_add_rms_norm_q8_f32(const float* x, const float* __restrict__ w_post,
                                                        float* residual, const float* __restrict__ w_next,
                                                        float* out, i32 d, float eps, i8* xq, float* xd,
                                                        float* xs) {
    fs_rms_norm_add_rms_norm<true>(x, w_post, residual, w_next, out, d, eps, xq, xd, xs);
}
