// One place for what differs between CUDA (NVRTC) and HIP (hipRTC): warp size, shuffles, intrinsics.
// Sources are compiled at run time without host headers: no <cstdint>, <cmath> or <cuda_fp16.h> here.
#pragma once

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define FS_HIP 1
#define FS_WARP 64
#define FS_SHFL_XOR(v, m) __shfl_xor((v), (m), FS_WARP)
#define FS_SHFL(v, lane) __shfl((v), (lane), FS_WARP)
#else
#define FS_HIP 0
#define FS_WARP 32
#define FS_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), FS_WARP)
#define FS_SHFL(v, lane) __shfl_sync(0xffffffffu, (v), (lane), FS_WARP)
#endif

typedef signed char i8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#define FS_INF __int_as_float(0x7f800000)

// IEEE half -> float without cuda_fp16.h (NVRTC has it only as a built-in header on some versions).
__device__ __forceinline__ float fs_half_to_float(u16 h) {
    const u32 sign = (u32)(h & 0x8000u) << 16;
    const u32 exp = (h >> 10) & 0x1fu;
    const u32 man = h & 0x3ffu;
    u32 bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal: value = man * 2^-24
            const float f = (float)man * 5.9604644775390625e-8f;
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    return __uint_as_float(bits);
}

__device__ __forceinline__ float fs_bf16_to_float(u16 h) { return __uint_as_float((u32)h << 16); }

__device__ __forceinline__ float fs_warp_sum(float v) {
#pragma unroll
    for (int m = FS_WARP / 2; m > 0; m >>= 1) v += FS_SHFL_XOR(v, m);
    return v;
}

__device__ __forceinline__ float fs_warp_max(float v) {
#pragma unroll
    for (int m = FS_WARP / 2; m > 0; m >>= 1) v = fmaxf(v, FS_SHFL_XOR(v, m));
    return v;
}

// Sum over a whole one-dimensional block of blockDim.x threads (a multiple of the warp size, at most
// 1024): lanes and warps are numbered by threadIdx.x alone, so a 2-D block gives wrong sums.
// `scratch` holds at least 32 floats of shared memory; every thread gets the total.
__device__ __forceinline__ float fs_block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % FS_WARP;
    const int warp = threadIdx.x / FS_WARP;
    v = fs_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int n_warps = (blockDim.x + FS_WARP - 1) / FS_WARP;
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return fs_warp_sum(v);
}

__device__ __forceinline__ float fs_block_max(float v, float* scratch) {
    const int lane = threadIdx.x % FS_WARP;
    const int warp = threadIdx.x / FS_WARP;
    v = fs_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int n_warps = (blockDim.x + FS_WARP - 1) / FS_WARP;
    v = lane < n_warps ? scratch[lane] : -FS_INF;
    return fs_warp_max(v);
}
