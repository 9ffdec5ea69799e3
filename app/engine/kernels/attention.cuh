// KV cache element type and the attention kernels' tile shapes, shared by attention.cu and its tests' ports.
//
// The KV cache is IEEE half (f16), as llama.cpp's default cache type: one array per layer and per K/V,
// [n_ctx, n_head_kv, head_dim], row `pos` holding the token at position `pos`.
#pragma once

#include "compat.cuh"

// float -> IEEE half, round to nearest, ties to even (what numpy's astype(float16) and F16C's vcvtps2ph do).
// NaN stays a (quiet) NaN, overflow gives inf, values under half the smallest subnormal give a signed zero.
// tests/engine/kernels/test_attention.py holds a NumPy port of these lines, checked against numpy on the CPU.
__device__ __forceinline__ u16 fs_float_to_half_rn(float f) {
    const u32 x = __float_as_uint(f);
    const u32 sign = (x >> 16) & 0x8000u;
    const u32 mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u) {  // inf, NaN
        return (u16)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u | ((mag >> 13) & 0x3ffu) : 0u));
    }
    const int e = (int)(mag >> 23) - 127;
    if (e > 15) return (u16)(sign | 0x7c00u);
    if (e >= -14) {  // a normal half; a carry out of the mantissa rounds into the exponent (65520 -> inf)
        u32 h = ((u32)(e + 15) << 10) | ((mag >> 13) & 0x3ffu);
        const u32 rest = mag & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
        return (u16)(sign | h);
    }
    if (e < -25) return (u16)sign;  // below 2^-25 (float zeros and subnormals included)
    // A half subnormal counts units of 2^-24: the 24-bit significand m is worth m * 2^(e+1) units.
    const u32 m = (mag & 0x7fffffu) | 0x800000u;
    const int shift = -e - 1;  // 14 .. 24
    u32 h = m >> shift;
    const u32 rest = m & ((1u << shift) - 1u);
    const u32 half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u))) ++h;  // 0x3ff + 1 is the smallest normal, as it should be
    return (u16)(sign | h);
}

// f16 bits -> float without branches, for the cache's hot path (same values as compat.cuh's
// fs_half_to_float): a normal half is its bits moved under a float's exponent, rebiased by 127 - 15; a
// subnormal is its mantissa times 2^-24, formed from an integer so that no float subnormal is ever an operand
// (a GPU that flushes them to zero would lose every half below 6.1e-5); inf and NaN keep an all-ones exponent.
__device__ __forceinline__ float fs_half_bits_to_float(u32 h) {
    const u32 mag = (h & 0x7fffu) << 13;
    const u32 exp = h & 0x7c00u;
    float f = __uint_as_float(mag + (112u << 23));
    if (exp == 0u) f = (float)(h & 0x3ffu) * 5.9604644775390625e-8f;  // 2^-24
    if (exp == 0x7c00u) f = __uint_as_float(mag | 0x7f800000u);
    return __uint_as_float(__float_as_uint(f) | ((h & 0x8000u) << 16));
}

// From app/engine/kernels/runtime.py's KERNEL_CONSTANTS, as -D defines (the launches read the same table):
// FS_ATTN_THREADS, threads of every attention block (whole warps on CUDA and on HIP); FS_ATTN_MAX_SPLITS,
// the most context splits one attention launch may use (attention_combine keeps a weight per split);
// FS_ATTN_COMBINE_THREADS, threads of an attention_combine block (head_dim of them across, the rest side by
// side over the splits); FS_ATTN_TILE_FLOATS, floats of a query group and of a key tile.
#ifndef FS_ATTN_THREADS
#error "FS_ATTN_THREADS is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#ifndef FS_ATTN_MAX_SPLITS
#error "FS_ATTN_MAX_SPLITS is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#ifndef FS_ATTN_COMBINE_THREADS
#error "FS_ATTN_COMBINE_THREADS is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#ifndef FS_ATTN_TILE_FLOATS
#error "FS_ATTN_TILE_FLOATS is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
static_assert(FS_ATTN_THREADS % FS_WARP == 0 && FS_ATTN_COMBINE_THREADS % FS_WARP == 0, "blocks of whole warps");

// Per head_dim HD: query vectors per block (QG) and keys per shared-memory tile (TK); both HD * X = 2048
// floats, so a block's shared memory stays near 25-31 KB for HD = 64, 128, 256 (two blocks fit a Turing SM).
template <int HD>
struct FsAttnShape {
    static constexpr int QG = FS_ATTN_TILE_FLOATS / HD;
    static constexpr int TK = FS_ATTN_TILE_FLOATS / HD;
};
