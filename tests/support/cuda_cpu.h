// The CUDA/HIP execution model on the CPU, so tests can run kernel sources without a GPU: a launch
// runs its blocks one after another, each block as blockDim OS threads; __syncthreads is a barrier of the
// block's threads, a shuffle an exchange through a barrier of the warp's lanes, __shared__ memory static
// (one copy, blocks do not overlap). Kernels compile through compat.cuh's HIP branch (-D__HIP__, host pass:
// FS_WARP is FS_WARP_SIZE, fs_dp4a its four byte products, f16 through fs_half_to_float), with IEEE single
// floats, no contraction (-ffp-contract=off) and fmaf from libm (one rounding, as on the GPU).
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#ifndef FS_WARP_SIZE
#error "FS_WARP_SIZE is not defined"
#endif

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __restrict__ __restrict

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(8) float2 {
    float x, y;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

template <class To, class From>
inline To fs_cpu_bits(From v) {
    static_assert(sizeof(To) == sizeof(From));
    To t;
    std::memcpy(&t, &v, sizeof t);
    return t;
}
inline float __int_as_float(int v) { return fs_cpu_bits<float>(v); }
inline float __uint_as_float(unsigned v) { return fs_cpu_bits<float>(v); }
inline int __float_as_int(float v) { return fs_cpu_bits<int>(v); }
inline unsigned __float_as_uint(float v) { return fs_cpu_bits<unsigned>(v); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int __float2int_rn(float v) { return (int)std::nearbyint(v); }  // round to nearest even
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned n) {
    const unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)((v << (n & 31)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned n) {
    const unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)(v >> (n & 31));
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) r |= (unsigned)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
    return r;
}

// The barriers of the block that runs now.
struct FsCpuBlock {
    std::unique_ptr<std::barrier<>> block;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<std::vector<unsigned long long>> slots;  // [warp][lane]: a shuffle's values
};
inline FsCpuBlock* fs_cpu_block = nullptr;

inline void __syncthreads() { fs_cpu_block->block->arrive_and_wait(); }

template <class T>
inline T fs_cpu_shuffle(T v, int src_of_lane_xor, bool xor_mode) {
    static_assert(sizeof(T) <= 8);
    const int warp = (int)threadIdx.x / FS_WARP_SIZE, lane = (int)threadIdx.x % FS_WARP_SIZE;
    auto& slot = fs_cpu_block->slots[warp];
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    slot[lane] = bits;
    fs_cpu_block->warps[warp]->arrive_and_wait();
    const int src = xor_mode ? lane ^ src_of_lane_xor : src_of_lane_xor;
    bits = slot[src];
    fs_cpu_block->warps[warp]->arrive_and_wait();
    T r;
    std::memcpy(&r, &bits, sizeof(T));
    return r;
}
template <class T>
inline T __shfl_xor(T v, int mask, int = FS_WARP_SIZE) {
    return fs_cpu_shuffle(v, mask, true);
}
template <class T>
inline T __shfl(T v, int lane, int = FS_WARP_SIZE) {
    return fs_cpu_shuffle(v, lane, false);
}

// Run body() as every thread of every block of grid x block (1-D blocks of whole warps).
template <class F>
inline void fs_cpu_launch(dim3 grid, dim3 block, F body) {
    gridDim = grid;
    blockDim = block;
    const unsigned threads = block.x * block.y * block.z, warps = (threads + FS_WARP_SIZE - 1) / FS_WARP_SIZE;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                FsCpuBlock b;
                b.block = std::make_unique<std::barrier<>>(threads);
                for (unsigned w = 0; w < warps; ++w) {
                    const unsigned lanes = std::min<unsigned>(FS_WARP_SIZE, threads - w * FS_WARP_SIZE);
                    b.warps.push_back(std::make_unique<std::barrier<>>(lanes));
                    b.slots.emplace_back(FS_WARP_SIZE, 0ull);
                }
                fs_cpu_block = &b;
                std::vector<std::thread> pool;
                for (unsigned t = 0; t < threads; ++t)
                    pool.emplace_back([&, t] {
                        threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        blockIdx = {bx, by, bz};
                        body();
                        // a thread that returns leaves the barriers, as an exited thread does on a GPU
                        b.warps[t / FS_WARP_SIZE]->arrive_and_drop();
                        b.block->arrive_and_drop();
                    });
                for (auto& th : pool) th.join();
                fs_cpu_block = nullptr;
            }
}

// A kernel called with CUDA's argument convention: args[i] points at the i-th argument's value.
template <class... A, std::size_t... I>
inline void fs_cpu_call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}
template <class... A>
inline void fs_cpu_call(void (*kernel)(A...), void** args) {
    fs_cpu_call(kernel, args, std::index_sequence_for<A...>{});
}
