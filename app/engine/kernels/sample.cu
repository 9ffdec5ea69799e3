// Greedy sampling on the device: argmax of each logits row, ties to the lowest index and a NaN winning over
// any number (the first NaN, as numpy.argmax). Two passes so one row of a 262144-token vocabulary spreads
// over many blocks: argmax_partial_f32 reduces a slice per block, argmax_final_f32 reduces the slices.
#include "compat.cuh"

// From app/engine/kernels/runtime.py's KERNEL_CONSTANTS, as -D defines (the launches read the same table).
#ifndef FS_ARGMAX_THREADS
#error "FS_ARGMAX_THREADS is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#ifndef FS_TOPK_PER_THREAD
#error "FS_TOPK_PER_THREAD is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
static_assert(FS_ARGMAX_THREADS % FS_WARP == 0, "an argmax block is whole warps");

// Does (va, ia) come before (vb, ib) in numpy.argmax's order?
__device__ __forceinline__ bool fs_argmax_better(float va, i32 ia, float vb, i32 ib) {
    const bool na = va != va;
    const bool nb = vb != vb;
    if (na != nb) return na;
    if (na) return ia < ib;
    return va > vb || (va == vb && ia < ib);
}

// Every thread's (v, i) becomes the block's best; blockDim.x == FS_ARGMAX_THREADS.
__device__ __forceinline__ void fs_argmax_block(float& v, i32& i) {
    __shared__ float val_s[FS_ARGMAX_THREADS / FS_WARP];
    __shared__ i32 idx_s[FS_ARGMAX_THREADS / FS_WARP];
#pragma unroll
    for (int m = FS_WARP / 2; m > 0; m >>= 1) {
        const float ov = FS_SHFL_XOR(v, m);
        const i32 oi = FS_SHFL_XOR(i, m);
        if (fs_argmax_better(ov, oi, v, i)) {
            v = ov;
            i = oi;
        }
    }
    const i32 lane = threadIdx.x % FS_WARP;
    const i32 warp = threadIdx.x / FS_WARP;
    if (lane == 0) {
        val_s[warp] = v;
        idx_s[warp] = i;
    }
    __syncthreads();
    v = val_s[0];
    i = idx_s[0];
    for (i32 w = 1; w < FS_ARGMAX_THREADS / FS_WARP; ++w) {
        if (fs_argmax_better(val_s[w], idx_s[w], v, i)) {
            v = val_s[w];
            i = idx_s[w];
        }
    }
}

// logits: [n, vocab]; part_val, part_idx: [n, gridDim.x], slice b of a row = [b * per_block, + per_block).
// grid (ceil(vocab / per_block), n), block (FS_ARGMAX_THREADS).
extern "C" __global__ void __launch_bounds__(FS_ARGMAX_THREADS)
    argmax_partial_f32(const float* __restrict__ logits, float* __restrict__ part_val, i32* __restrict__ part_idx,
                       i32 vocab, i32 per_block) {
    const float* row = logits + (i64)blockIdx.y * vocab;
    const i32 begin = blockIdx.x * per_block;
    const i32 end = min(vocab, begin + per_block);
    float v = -FS_INF;
    i32 idx = 0x7fffffff;  // loses to any element, -inf included (equal value, higher index)
    for (i32 j = begin + threadIdx.x; j < end; j += FS_ARGMAX_THREADS) {
        const float x = row[j];
        if (fs_argmax_better(x, j, v, idx)) {
            v = x;
            idx = j;
        }
    }
    fs_argmax_block(v, idx);
    if (threadIdx.x == 0) {
        part_val[(i64)blockIdx.y * gridDim.x + blockIdx.x] = v;
        part_idx[(i64)blockIdx.y * gridDim.x + blockIdx.x] = idx;
    }
}

// out: [n] int32, the best of each row's n_parts partials. grid (n), block (FS_ARGMAX_THREADS).
extern "C" __global__ void __launch_bounds__(FS_ARGMAX_THREADS)
    argmax_final_f32(const float* __restrict__ part_val, const i32* __restrict__ part_idx, i32* __restrict__ out,
                     i32 n_parts) {
    float v = -FS_INF;
    i32 idx = 0x7fffffff;
    for (i32 b = threadIdx.x; b < n_parts; b += FS_ARGMAX_THREADS) {
        const i64 at = (i64)blockIdx.x * n_parts + b;
        if (fs_argmax_better(part_val[at], part_idx[at], v, idx)) {
            v = part_val[at];
            idx = part_idx[at];
        }
    }
    fs_argmax_block(v, idx);
    if (threadIdx.x == 0) out[blockIdx.x] = idx;
}

// Top-k of each logits row on the device, for sampled requests: a sampler chain that starts with top-k
// needs only those k (value, id) pairs, not the whole row. Order: numpy.argmax's, repeatedly (best value
// first, ties to the lower id, NaN first). Two passes as the argmax: topk_partial_f32 takes the k best of
// each slice of FS_TOPK_SLICE logits, topk_final_f32 the k best of those parts * k candidates.
#define FS_TOPK_SLICE (FS_ARGMAX_THREADS * FS_TOPK_PER_THREAD)
static_assert(FS_TOPK_PER_THREAD <= 32, "a thread marks its taken candidates in one 32-bit word");

// The k best of `count` candidates (value vals[j], id ids[j], or j + id_base when ids is null) into out_val,
// out_idx [k] (thread 0 writes). Thread t holds candidates t + FS_ARGMAX_THREADS * e in registers and its
// best untaken one; each round the block's best is taken from its owner. Past the candidates: (-inf, MAX).
__device__ __forceinline__ void fs_topk_select(const float* __restrict__ vals, const i32* __restrict__ ids,
                                               i32 id_base, i32 count, i32 k, float* __restrict__ out_val,
                                               i32* __restrict__ out_idx) {
    const i32 none = 0x7fffffff;
    float xv[FS_TOPK_PER_THREAD];
    i32 xi[FS_TOPK_PER_THREAD];
#pragma unroll
    for (int e = 0; e < FS_TOPK_PER_THREAD; ++e) {
        const i32 j = threadIdx.x + FS_ARGMAX_THREADS * e;
        xv[e] = j < count ? vals[j] : -FS_INF;
        xi[e] = j < count ? (ids ? ids[j] : id_base + j) : none;
    }
    u32 taken = 0u;
    for (i32 r = 0; r < k; ++r) {
        float v = -FS_INF;
        i32 idx = none;
        i32 slot = -1;
#pragma unroll
        for (int e = 0; e < FS_TOPK_PER_THREAD; ++e) {
            if (!(taken >> e & 1u) && xi[e] != none && fs_argmax_better(xv[e], xi[e], v, idx)) {
                v = xv[e];
                idx = xi[e];
                slot = e;
            }
        }
        float bv = v;
        i32 bi = idx;
        fs_argmax_block(bv, bi);
        __syncthreads();  // fs_argmax_block's shared slots are read by all before the next round writes
        if (threadIdx.x == 0) {
            out_val[r] = bi == none ? -FS_INF : bv;
            out_idx[r] = bi;
        }
        if (bi != none && slot >= 0 && idx == bi) taken |= 1u << slot;  // ids are unique: one owner
    }
}

// logits: [n, vocab]; part_val, part_idx: [n, gridDim.x, k], slice b of a row = [b * FS_TOPK_SLICE, + slice).
// grid (ceil(vocab / FS_TOPK_SLICE), n), block (FS_ARGMAX_THREADS); the host bounds k (sample.TOPK_MAX).
extern "C" __global__ void __launch_bounds__(FS_ARGMAX_THREADS)
    topk_partial_f32(const float* __restrict__ logits, float* __restrict__ part_val, i32* __restrict__ part_idx,
                     i32 vocab, i32 k) {
    const i32 begin = blockIdx.x * FS_TOPK_SLICE;
    const i64 out = ((i64)blockIdx.y * gridDim.x + blockIdx.x) * k;
    fs_topk_select(logits + (i64)blockIdx.y * vocab + begin, nullptr, begin, min(FS_TOPK_SLICE, vocab - begin), k,
                   part_val + out, part_idx + out);
}

// out_val, out_idx: [n, k], the k best of each row's n_parts * k partials (n_parts * k <= FS_TOPK_SLICE).
// grid (n), block (FS_ARGMAX_THREADS).
extern "C" __global__ void __launch_bounds__(FS_ARGMAX_THREADS)
    topk_final_f32(const float* __restrict__ part_val, const i32* __restrict__ part_idx, float* __restrict__ out_val,
                   i32* __restrict__ out_idx, i32 n_parts, i32 k) {
    const i64 in = (i64)blockIdx.x * n_parts * k;
    fs_topk_select(part_val + in, part_idx + in, 0, n_parts * k, k, out_val + (i64)blockIdx.x * k,
                   out_idx + (i64)blockIdx.x * k);
}
