// One place for what differs between CUDA (NVRTC) and HIP (hipRTC): warp size, shuffles, warp sync.
// Sources are compiled at run time without host headers: no <cstdint>, <cmath> or <cuda_fp16.h> here.
#pragma once

#if defined(__HIP__) || defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#define FS_HIP 1
#else
#define FS_HIP 0
#endif

// The warp size: 32 on NVIDIA; on AMD the target's wavefront, 32 on RDNA (gfx10, gfx11) and 64 on CDNA and
// GCN (gfx9), as the compiler says. FS_WARP_SIZE is the size the launches are shaped for (runtime.py passes
// the device's own); a kernel compiled for another size does not compile.
#ifndef FS_WARP_SIZE
#error "FS_WARP_SIZE is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#if !FS_HIP
#define FS_WARP 32
#elif !defined(__HIP_DEVICE_COMPILE__)
// The host pass of an offline HIP compile generates no kernel code (and clang 15 says 64 there whatever
// the target): the launches' size stands.
#define FS_WARP FS_WARP_SIZE
#elif defined(__AMDGCN_WAVEFRONT_SIZE__)
#define FS_WARP __AMDGCN_WAVEFRONT_SIZE__
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define FS_WARP __AMDGCN_WAVEFRONT_SIZE
#else
#error "the HIP compiler does not say the target's wavefront size"
#endif
static_assert(FS_WARP == FS_WARP_SIZE, "compiled for a warp size other than the one the launches assume");
static_assert(FS_WARP == 32 || FS_WARP == 64, "warps of 32 or 64 lanes");
// fs_block_sum / fs_block_max keep one float per warp of a block of up to 1024 threads in 32 floats.
static_assert(1024 / FS_WARP <= 32, "a block's warps fit the 32-float scratch");

#if FS_HIP
#define FS_SHFL_XOR(v, m) __shfl_xor((v), (m), FS_WARP)
#define FS_SHFL(v, lane) __shfl((v), (lane), FS_WARP)
// A wavefront runs in lockstep, but the compiler may move shared-memory accesses across a point where the
// lanes exchange data through it: a fence (release, acquire) at wavefront scope around a wave barrier, as
// __syncwarp is on NVIDIA (and in later ROCm releases).
#define FS_SYNCWARP()                                            \
    do {                                                         \
        __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");   \
        __builtin_amdgcn_wave_barrier();                         \
        __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");   \
    } while (0)
#else
#define FS_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), FS_WARP)
#define FS_SHFL(v, lane) __shfl_sync(0xffffffffu, (v), (lane), FS_WARP)
#define FS_SYNCWARP() __syncwarp()
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

// c + the dot product of the four signed bytes of a and of b. NVIDIA: dp4a (sm_61 on). AMD: v_dot4_i32_i8
// where the target has it (GCN5.1, CDNA, RDNA2 as llama.cpp's HIP build uses it; RDNA3's takes the signs as
// operands), else four byte products.
__device__ __forceinline__ int fs_dp4a(int a, int b, int c) {
#if !FS_HIP
    return __dp4a(a, b, c);
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) ||        \
    defined(__gfx941__) || defined(__gfx942__) || defined(__gfx1030__) || defined(__gfx1031__) ||          \
    defined(__gfx1032__) || defined(__gfx1034__) || defined(__gfx1035__) || defined(__gfx1036__)
    return __builtin_amdgcn_sdot4(a, b, c, false);
#elif defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1103__)
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#else
    const int p0 = (int)(signed char)a * (int)(signed char)b;
    const int p1 = (int)(signed char)(a >> 8) * (int)(signed char)(b >> 8);
    const int p2 = (int)(signed char)(a >> 16) * (int)(signed char)(b >> 16);
    return c + p0 + p1 + p2 + (a >> 24) * (b >> 24);
#endif
}

// Integer tensor-core tiles, one warp (32 lanes) together, as PTX's mma.sync .s8 fragments lay them out:
// lane = 4 g + t holds of A (row-major) a[0] = A[g][4t..4t+3], a[1] = A[g + 8][4t..], then for k32 a[2] =
// A[g][16 + 4t..], a[3] = A[g + 8][16 + 4t..]; of B (column-major) b[0] = B[4t..][g], for k32 b[1] =
// B[16 + 4t..][g]; of C and D c[0..1] = C[g][2t, 2t + 1], c[2..3] = C[g + 8][2t, 2t + 1]. D = A B + C.
// The _portable forms compute the same from shuffles and dp4a: where the instruction is missing (Turing's
// k32, AMD, the CPU run of the tests), and to check the instruction against (mmvq_tc.cu's fs_mma_check).
// A wave64 runs them as two independent 32-lane halves.
template <int K>
__device__ __forceinline__ void fs_mma_s8_portable(int (&c)[4], const u32 (&a)[K / 8], const u32 (&b)[K / 16]) {
    const int lane = threadIdx.x % FS_WARP, base = lane & ~31, g = (lane & 31) >> 2, t = lane & 3;
#pragma unroll
    for (int tp = 0; tp < 4; ++tp) {
        u32 ap[K / 8];
#pragma unroll
        for (int i = 0; i < K / 8; ++i) ap[i] = FS_SHFL(a[i], base + 4 * g + tp);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int src = base + 4 * (2 * t + j) + tp;
            const int b0 = (int)FS_SHFL(b[0], src);
            c[j] = fs_dp4a((int)ap[0], b0, c[j]);
            c[2 + j] = fs_dp4a((int)ap[1], b0, c[2 + j]);
            if constexpr (K == 32) {
                const int b1 = (int)FS_SHFL(b[1], src);
                c[j] = fs_dp4a((int)ap[2], b1, c[j]);
                c[2 + j] = fs_dp4a((int)ap[3], b1, c[2 + j]);
            }
        }
    }
}

#if !FS_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FS_MMA_S8 1
#else
#define FS_MMA_S8 0
#endif

// m16n8k32: A 16 x 32, B 32 x 8.
__device__ __forceinline__ void fs_mma_s8_k32(int (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#if FS_MMA_S8
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    fs_mma_s8_portable<32>(c, a, b);
#endif
}

// m16n8k16: A 16 x 16, B 16 x 8.
__device__ __forceinline__ void fs_mma_s8_k16(int (&c)[4], const u32 (&a)[2], const u32 (&b)[1]) {
#if FS_MMA_S8
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(b[0]));
#else
    fs_mma_s8_portable<16>(c, a, b);
#endif
}

// 16 bytes of a weight that is read once per launch: past L1 without a line in it (on NVIDIA), so the hot
// activations keep theirs. p is 16-byte aligned, in memory no launch writes.
__device__ __forceinline__ uint4 fs_ld_stream16(const void* p) {
#if FS_HIP
    return *(const uint4*)p;
#else
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
#endif
}

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
