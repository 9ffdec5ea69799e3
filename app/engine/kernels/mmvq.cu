// y[b, out] (+)= x^[b, in] . W[out, in]^T (+ bias) with integer dot products (dp4a) on activations
// quantised to int8 once per row (fs_quantize_q8), for 1 to 17 rows of x per launch: the decode step and a
// whole speculative verify pass read each weight once. Q4_K, Q5_K, Q6_K, Q8_0, Q4_0 and Q5_0 (qdot.cuh);
// gemv.cu's float kernels stay the reference these are tested against and serve the other types.
//
// Launch (app/engine/kernels/mmvq.py): block = NW warps (1 .. FS_MMVQ_MAX_WARPS), grid = ceil(out / (G R))
// with G = FS_WARP / FS_MMVQ_LANES lane groups per warp and R rows per group. Lane l of group g of warp w
// owns rows row0 + r G + g (r < R) and chunks (32 weights, qdot.cuh) l + L (w + NW i), i = 0, 1, ...: the
// G groups of a warp read the same activations (one transaction serves them all) and rows side by side
// (a group reads 8 x 16 contiguous bytes of a row), and the NW warps split the row's length (split-K, for
// matrices too short to fill the GPU with rows alone). A lane accumulates its chunks in order into one
// float per row of x; a group sums its lanes with a fixed butterfly, the block its warps in warp order.
// The order depends on NW only, never on the rows of x (B) or the rows per group (R): a row of y is the
// same, bit for bit, for any batch, so a verify pass agrees with decoding exactly. The host picks NW from
// the weight's shape alone.
#include "q8.cuh"
#include "qdot.cuh"

// From app/engine/kernels/runtime.py's KERNEL_CONSTANTS, as -D defines (the launches read the same table).
#ifndef FS_MMVQ_LANES
#error "FS_MMVQ_LANES is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#ifndef FS_MMVQ_MAX_WARPS
#error "FS_MMVQ_MAX_WARPS is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#ifndef FS_QUANT_THREADS
#error "FS_QUANT_THREADS is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#define FS_MMVQ_GROUPS (FS_WARP / FS_MMVQ_LANES)
static_assert(FS_MMVQ_LANES == 8, "a group sums its lanes with the butterfly of 4, 2, 1");
static_assert(FS_WARP % FS_MMVQ_LANES == 0, "a warp is whole lane groups");
static_assert(FS_QUANT_THREADS % 32 == 0, "a quantising block is whole blocks of 32 elements");

// x [rows, n_in] -> xq, xd, xs (q8.cuh) for the kernels whose input no fused producer quantises (norm.cu
// and activation.cu write them beside their float output). One thread per element, 32 to a block of x.
// grid = ceil(rows * n_in / FS_QUANT_THREADS), block = FS_QUANT_THREADS.
extern "C" __global__ void __launch_bounds__(FS_QUANT_THREADS)
    fs_quantize_q8(const float* __restrict__ x, int rows, int n_in, i8* __restrict__ xq, float* __restrict__ xd,
                   float* __restrict__ xs) {
    const i64 t = (i64)blockIdx.x * FS_QUANT_THREADS + threadIdx.x;
    if (t >= (i64)rows * n_in) return;  // whole blocks of 32 leave together: n_in % 32 == 0
    fs_q8_element(x[t], t, xq, xd, xs);
}

// One chunk (index k of the row) of every row of the lane and every row of x.
template <int T, int B, int R>
__device__ __forceinline__ void fs_mmvq_chunk(float (&acc)[R][B], const typename FsQdot<T>::Raw (&raw)[R], int k,
                                              const i8* __restrict__ xq, const float* __restrict__ xd,
                                              const float* __restrict__ xs, int n_in, int n_b) {
    typedef FsQdot<T> Q;
    const int blk = k / Q::CPB, j = k % Q::CPB;
    FsQdotWeights wt[R];
#pragma unroll
    for (int r = 0; r < R; ++r) Q::decode(wt[r], raw[r], j);
#pragma unroll
    for (int bi = 0; bi < B; ++bi) {
        if (bi < n_b) {
            FsQdotX xv;
            Q::load_x(xv, xq + (long long)bi * n_in, xd + (long long)bi * (n_in / 32),
                      xs + (long long)bi * (n_in / 16), blk, j);
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r][bi] = Q::dot(wt[r], xv, acc[r][bi]);
        }
    }
}

// U: chunks whose weights a lane loads before it decodes the first of them (bytes in flight).
template <int T, int B, int R, int U>
__device__ __forceinline__ void fs_mmvq(const u8* __restrict__ w, const i8* __restrict__ xq,
                                        const float* __restrict__ xd, const float* __restrict__ xs,
                                        float* __restrict__ y, const float* __restrict__ bias, int n_out, int n_in,
                                        int n_b, int accumulate) {
    typedef FsQdot<T> Q;
    constexpr int G = FS_MMVQ_GROUPS, L = FS_MMVQ_LANES;
    __shared__ float part[FS_MMVQ_MAX_WARPS][G * R * B];
    const int lane = threadIdx.x % FS_WARP, warp = threadIdx.x / FS_WARP, n_warps = blockDim.x / FS_WARP;
    const int g = lane / L, l = lane % L;
    const int nblk = n_in / Q::QK, n_chunks = nblk * Q::CPB;
    const int row0 = blockIdx.x * (G * R);
    typename Q::Row rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = row0 + r * G + g;
        Q::locate(rows[r], w, n_out, nblk, row < n_out ? row : n_out - 1);
    }
    float acc[R][B];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int bi = 0; bi < B; ++bi) acc[r][bi] = 0.0f;
    }
    const int stride = L * n_warps;
    int k = l + L * warp;
    for (; k + (U - 1) * stride < n_chunks; k += U * stride) {
        typename Q::Raw raw[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int ku = k + u * stride;
#pragma unroll
            for (int r = 0; r < R; ++r) Q::fetch(raw[u][r], rows[r], ku / Q::CPB, ku % Q::CPB);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) fs_mmvq_chunk<T, B, R>(acc, raw[u], k + u * stride, xq, xd, xs, n_in, n_b);
    }
    if constexpr (U > 1) {
        for (; k < n_chunks; k += stride) {
            typename Q::Raw raw[R];
#pragma unroll
            for (int r = 0; r < R; ++r) Q::fetch(raw[r], rows[r], k / Q::CPB, k % Q::CPB);
            fs_mmvq_chunk<T, B, R>(acc, raw, k, xq, xd, xs, n_in, n_b);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int bi = 0; bi < B; ++bi) {
            float v = acc[r][bi];
            v += FS_SHFL_XOR(v, 4);
            v += FS_SHFL_XOR(v, 2);
            v += FS_SHFL_XOR(v, 1);
            if (l == 0) part[warp][(r * G + g) * B + bi] = v;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * R * B; i += blockDim.x) {
        const int row = row0 + i / B, bi = i % B;
        if (row < n_out && bi < n_b) {
            float s = part[0][i];
            for (int v = 1; v < n_warps; ++v) s += part[v][i];
            float out = bias ? s + bias[row] : s;
            float* dst = y + (long long)bi * n_out + row;
            if (accumulate) out += *dst;
            *dst = out;
        }
    }
}

#define FS_MMVQ_ENTRY(NAME, T, B, R, U)                                                                      \
    extern "C" __global__ void __launch_bounds__(FS_MMVQ_MAX_WARPS * FS_WARP)                                \
        fs_mmvq_##NAME##_b##B##_r##R(const u8* w, const i8* xq, const float* xd, const float* xs, float* y,  \
                                     const float* bias, int n_out, int n_in, int n_b, int accumulate) {      \
        fs_mmvq<T, B, R, U>(w, xq, xd, xs, y, bias, n_out, n_in, n_b, accumulate);                          \
    }

// (B, R) pairs the host table picks from (app/engine/kernels/mmvq.py, INSTANCES): rows of x per launch
// (a launch takes n_b <= B) and rows per lane group.
#define FS_MMVQ_TYPE(NAME, T)            \
    FS_MMVQ_ENTRY(NAME, T, 1, 1, 4)      \
    FS_MMVQ_ENTRY(NAME, T, 1, 2, 2)      \
    FS_MMVQ_ENTRY(NAME, T, 2, 1, 2)      \
    FS_MMVQ_ENTRY(NAME, T, 2, 2, 1)      \
    FS_MMVQ_ENTRY(NAME, T, 4, 2, 1)      \
    FS_MMVQ_ENTRY(NAME, T, 8, 2, 1)      \
    FS_MMVQ_ENTRY(NAME, T, 8, 4, 1)      \
    FS_MMVQ_ENTRY(NAME, T, 12, 2, 1)     \
    FS_MMVQ_ENTRY(NAME, T, 12, 4, 1)     \
    FS_MMVQ_ENTRY(NAME, T, 17, 2, 1)     \
    FS_MMVQ_ENTRY(NAME, T, 17, 4, 1)

FS_MMVQ_TYPE(q4_k, FS_T_Q4_K)
FS_MMVQ_TYPE(q5_k, FS_T_Q5_K)
FS_MMVQ_TYPE(q6_k, FS_T_Q6_K)
FS_MMVQ_TYPE(q8_0, FS_T_Q8_0)
FS_MMVQ_TYPE(q4_0, FS_T_Q4_0)
FS_MMVQ_TYPE(q5_0, FS_T_Q5_0)
