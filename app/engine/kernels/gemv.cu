// y[b, out] (+)= x[b, in] . W[out, in]^T (+ bias) straight from GGUF blocks, for b <= 8 rows of x per
// launch (decode: b = 1; speculative verify: b = k + 1, in chunks of 8: past 8 rows a launch is bound by
// its FMAs, not by reading the weights, so reading them once per 8 rows costs little and halves the
// registers and the compile time of a 16-row kernel); and the embedding lookup get_rows.
//
// Launch (gemv.py): grid = ceil(out / FS_GEMV_ROWS), block = FS_GEMV_THREADS, dynamic shared memory
// = B * xt * 4 bytes, where xt (elements of x staged at a time) is a multiple of FS_GEMV_STEP.
//
// Each warp owns FS_GEMV_RPW (4) output rows; a "step" is FS_WARP pieces of 16 weights (512 elements on
// CUDA) of each of its rows, piece `lane` of the step going to that lane. The bytes of a row's step are
// copied with coalesced, 16-byte aligned copies into one of the warp's FS_GEMV_PF staging buffers (most
// block types are only 2-byte aligned) -- asynchronously (cp.async) on sm_80+, FS_GEMV_PF - 1 steps ahead --
// and decoded from there. The weights are read once for all b rows of x, which sit in shared memory (4 rows
// per warp share every x load). A lane accumulates its pieces in order and the warp sums lanes with a
// fixed butterfly, so row i of y is the same, bit for bit, whatever b is (the speculative verify pass and
// plain decoding agree exactly).
//
// Measured on an H200 (scripts/kernel-bench.py, weights cycled past L2): b = 1, Q4_K 18944x3584 23 us
// (1.6 TB/s), Q6_K 152064x3584 205 us (2.2 TB/s), Q8_0 262144x640 102 us (1.8 TB/s); b = 8 costs ~3x b = 1.
// It is bound by instruction issue (ncu: ~8 instructions per weight at b = 1, 70% of issue slots used,
// DRAM ~30% busy), not by memory latency: 2, 3 or 4 staging buffers and 8 warps x 2 rows all measured
// within a few percent. Cutting the per-piece decode (a lane decodes 4 rows x 16 weights per step) is
// what would pay next.
#include "quant.cuh"

// From app/engine/kernels/runtime.py's KERNEL_CONSTANTS, as -D defines (the launches read the same table).
#ifndef FS_GEMV_THREADS
#error "FS_GEMV_THREADS is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#ifndef FS_GEMV_RPW
#error "FS_GEMV_RPW is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#ifndef FS_GEMV_PF
#error "FS_GEMV_PF is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#ifndef FS_GEMV_MAX_BATCH
#error "FS_GEMV_MAX_BATCH is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#ifndef FS_GET_ROWS_THREADS
#error "FS_GET_ROWS_THREADS is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
#define FS_GEMV_WARPS (FS_GEMV_THREADS / FS_WARP)
#define FS_GEMV_ROWS (FS_GEMV_WARPS * FS_GEMV_RPW)
#define FS_GEMV_STEP (FS_WARP * FS_PIECE)
static_assert(FS_GEMV_THREADS % FS_WARP == 0 && FS_GEMV_WARPS >= 1, "a GEMV block is whole warps");
static_assert(FS_GEMV_MAX_BATCH == 8, "the entry points below are b1 .. b8");

#if !FS_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FS_ASYNC_COPY 1
#else
#define FS_ASYNC_COPY 0
#endif

extern __shared__ float4 fs_gemv_x[];  // [B][xt / 4] float4, swizzled (fs_x_slot)

template <int T>
struct FsStage {
    typedef FsQuant<T> Q;
    static constexpr int SB = Q::TS * (FS_GEMV_STEP / Q::QK);  // bytes of one row per step
    static constexpr int NCH = (SB + 14 + 15) / 16;             // 16-byte chunks covering them, any alignment
    static constexpr int TOT = FS_GEMV_RPW * NCH;                // chunks per warp and step
    static constexpr int LCH = (TOT + FS_WARP - 1) / FS_WARP;    // per lane
    static constexpr int ROW_BYTES = NCH * 16 + 16;              // + slack for the 2-byte-aligned over-read
    static constexpr int WARP_BYTES = FS_GEMV_RPW * ROW_BYTES;   // one warp's buffer for one step
    static constexpr int SMEM = Q::STAGED ? FS_GEMV_PF * FS_GEMV_WARPS * WARP_BYTES : 16;
    static_assert(FS_GEMV_STEP % Q::QK == 0, "a step starts and ends on block boundaries");
};

// 16 bytes global -> shared; zeros where !valid (src must still be a valid address).
__device__ __forceinline__ void fs_copy16(u8* dst, const u8* src, bool valid) {
#if FS_ASYNC_COPY
    u32 saddr;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(saddr) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(saddr), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
#else
    *(uint4*)dst = valid ? fs_ld_u128(src) : make_uint4(0u, 0u, 0u, 0u);
#endif
}

__device__ __forceinline__ void fs_copy_commit() {
#if FS_ASYNC_COPY
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Wait until at most N committed groups of this thread's copies are still in flight.
template <int N>
__device__ __forceinline__ void fs_copy_wait() {
#if FS_ASYNC_COPY
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// A lane reads float4 q of its piece at index 4 * lane + q: XOR-ing bits 3-4 into bits 0-1 spreads the 8
// lanes of each shared-memory phase over 8 different bank groups.
__device__ __forceinline__ int fs_x_slot(int i) { return i ^ ((i >> 3) & 3); }

__device__ __forceinline__ long long fs_row_offset(int row, int n_out, long long row_bytes) {
    return (long long)(row < n_out ? row : n_out - 1) * row_bytes;
}

// What one lane copies for every step: chunk i of its share is the 16 bytes of row r at
// ((row_off[r] + s * SB) & ~15) + 16 c = (src[i] + s * SB) & ~15 of the weight, to dst[i] in the warp's
// buffer. Computed once per thread.
template <int T>
struct FsLaneCopies {
    typedef FsStage<T> S;
    long long src[S::LCH];  // row_off[r] + 16 c, or -1 for no chunk
    int dst[S::LCH];        // r * ROW_BYTES + 16 c

    __device__ __forceinline__ void init(const long long (&row_off)[FS_GEMV_RPW], int lane) {
#pragma unroll
        for (int i = 0; i < S::LCH; ++i) {
            const int f = lane + i * FS_WARP;
            const int r = f / S::NCH, c = f - (f / S::NCH) * S::NCH;
            long long off = row_off[0];
#pragma unroll
            for (int k = 1; k < FS_GEMV_RPW; ++k) off = r == k ? row_off[k] : off;
            src[i] = f < S::TOT ? off + 16 * c : -1;
            dst[i] = r * S::ROW_BYTES + 16 * c;
        }
    }

    // Copy step s into buf; the group is committed even past the last step (uniform group counting).
    __device__ __forceinline__ void issue(u8* buf, const u8* __restrict__ w, long long w_bytes, int s,
                                          int steps) const {
        if (s < steps) {
#pragma unroll
            for (int i = 0; i < S::LCH; ++i) {
                if (src[i] >= 0) {
                    const long long a = (src[i] + (long long)s * S::SB) & ~15ll;
                    const bool valid = a + 16 <= w_bytes;
                    fs_copy16(buf + dst[i], valid ? w + a : w, valid);
                }
            }
        }
        fs_copy_commit();
    }
};

// Rows k0 .. k0 + 4 * xt4 of x into the tile (zeros past the end). A tile of one float4 per thread and row
// of x (b >= 5: one step) is loaded through registers, every load in flight before the first store; a
// bigger one by asynchronous copies, whose wait also drains the weight copies in flight (a bubble that
// one tile per several steps can afford, one tile per step cannot).
template <int B>
__device__ __forceinline__ void fs_stage_x(const float* __restrict__ x, int n_in, int n_b, int k0, int xt4) {
    __syncthreads();  // every warp is done with the previous tile
    if (xt4 == FS_GEMV_THREADS) {
        const int j = threadIdx.x;
        const bool inside = k0 + 4 * j < n_in;
        float4 v[B];
#pragma unroll
        for (int bi = 0; bi < B; ++bi) {
            v[bi] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (bi < n_b && inside) v[bi] = *(const float4*)(x + (long long)bi * n_in + k0 + 4 * j);
        }
#pragma unroll
        for (int bi = 0; bi < B; ++bi) fs_gemv_x[bi * xt4 + fs_x_slot(j)] = v[bi];
    } else {
#pragma unroll
        for (int bi = 0; bi < B; ++bi) {
            const float* row = x + (long long)bi * n_in + k0;
            const int n4 = bi < n_b ? min(xt4, (n_in - k0) / 4) : 0;
            u8* dst = (u8*)(fs_gemv_x + bi * xt4);
            for (int j = threadIdx.x; j < xt4; j += FS_GEMV_THREADS)
                fs_copy16(dst + 16 * fs_x_slot(j), (const u8*)(j < n4 ? row + 4 * j : x), j < n4);
        }
        fs_copy_commit();
        fs_copy_wait<0>();  // the tile (and any weight copies issued before it)
    }
    __syncthreads();
}

// One step of one lane: piece `lane` of the step, for the warp's 4 rows and the B rows of x.
// Factored pieces: acc += A * sum(f x) + C * sum(x) per piece; others: acc += w x per weight.
template <int T, int B>
__device__ __forceinline__ void fs_gemv_step(float (&acc)[FS_GEMV_RPW][B], const u8* (&src)[FS_GEMV_RPW],
                                             int sub, int xt4, int xbase) {
    typedef FsQuant<T> Q;
    typedef typename Q::Piece P;
    typename Q::Piece pc[FS_GEMV_RPW];
#pragma unroll
    for (int r = 0; r < FS_GEMV_RPW; ++r) Q::load(pc[r], src[r], sub);
    float dot[FS_GEMV_RPW][B];  // factored: sum of f x over the piece
    float xsum[B];              // factored: sum of x over the piece
#pragma unroll
    for (int bi = 0; bi < B; ++bi) {
        xsum[bi] = 0.0f;
#pragma unroll
        for (int r = 0; r < FS_GEMV_RPW; ++r) dot[r][bi] = 0.0f;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        float wv[FS_GEMV_RPW][4];
#pragma unroll
        for (int r = 0; r < FS_GEMV_RPW; ++r) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if constexpr (P::FACTORED)
                    wv[r][e] = pc[r].code_value(q, e);
                else
                    wv[r][e] = pc[r].weight(q, e);
            }
        }
        const int slot = fs_x_slot(xbase + q);
#pragma unroll
        for (int bi = 0; bi < B; ++bi) {
            const float4 xv = fs_gemv_x[bi * xt4 + slot];
            if constexpr (P::FACTORED) xsum[bi] += (xv.x + xv.y) + (xv.z + xv.w);
#pragma unroll
            for (int r = 0; r < FS_GEMV_RPW; ++r) {
                float a = P::FACTORED ? dot[r][bi] : acc[r][bi];
                a = fmaf(wv[r][0], xv.x, a);
                a = fmaf(wv[r][1], xv.y, a);
                a = fmaf(wv[r][2], xv.z, a);
                a = fmaf(wv[r][3], xv.w, a);
                if constexpr (P::FACTORED)
                    dot[r][bi] = a;
                else
                    acc[r][bi] = a;
            }
        }
    }
    if constexpr (P::FACTORED) {
#pragma unroll
        for (int r = 0; r < FS_GEMV_RPW; ++r) {
#pragma unroll
            for (int bi = 0; bi < B; ++bi) {
                acc[r][bi] = fmaf(pc[r].A, dot[r][bi], acc[r][bi]);
                acc[r][bi] = fmaf(pc[r].C, xsum[bi], acc[r][bi]);
            }
        }
    }
}

template <int T, int B>
__device__ __forceinline__ void fs_gemv(const u8* __restrict__ w, long long w_bytes, const float* __restrict__ x,
                                        float* __restrict__ y, const float* __restrict__ bias, int n_out,
                                        int n_in, int n_b, int xt, int accumulate) {
    typedef FsQuant<T> Q;
    typedef FsStage<T> S;
    __shared__ __align__(16) u8 wsm[S::SMEM];
    const int lane = threadIdx.x % FS_WARP, warp = threadIdx.x / FS_WARP;
    const int row0 = (blockIdx.x * FS_GEMV_WARPS + warp) * FS_GEMV_RPW;
    const long long row_bytes = (long long)(n_in / Q::QK) * Q::TS;
    const int n_pieces = n_in / FS_PIECE;
    const int steps = (n_pieces + FS_WARP - 1) / FS_WARP;
    const int xt4 = xt / 4;
    long long row_off[FS_GEMV_RPW];
#pragma unroll
    for (int r = 0; r < FS_GEMV_RPW; ++r) row_off[r] = fs_row_offset(row0 + r, n_out, row_bytes);
    int blk, sub;
    fs_piece_place<T>(lane, blk, sub);  // a step starts on a block boundary (FS_GEMV_STEP % QK == 0)
    u8* mine = wsm + (Q::STAGED ? warp * S::WARP_BYTES : 0);
    constexpr int STAGE_STRIDE = FS_GEMV_WARPS * S::WARP_BYTES;
    FsLaneCopies<T> copies;
    if constexpr (Q::STAGED) copies.init(row_off, lane);

    float acc[FS_GEMV_RPW][B];
#pragma unroll
    for (int r = 0; r < FS_GEMV_RPW; ++r) {
#pragma unroll
        for (int bi = 0; bi < B; ++bi) acc[r][bi] = 0.0f;
    }

    if constexpr (Q::STAGED) {
#pragma unroll
        for (int k = 0; k + 1 < FS_GEMV_PF; ++k) copies.issue(mine + k * STAGE_STRIDE, w, w_bytes, k, steps);
    }
    int tile_pos = xt;  // elements of the current x tile already used
    for (int s = 0; s < steps; ++s) {
        if (tile_pos == xt) {
            fs_stage_x<B>(x, n_in, n_b, s * FS_GEMV_STEP, xt4);
            tile_pos = 0;
        }
        const u8* src[FS_GEMV_RPW];
        if constexpr (Q::STAGED) {
            // into the buffer of step s - 1, which every lane finished with (the FS_SYNCWARP below)
            const int next = s + FS_GEMV_PF - 1;
            copies.issue(mine + (next % FS_GEMV_PF) * STAGE_STRIDE, w, w_bytes, next, steps);
            fs_copy_wait<FS_GEMV_PF - 1>();  // this lane's copies of step s have landed
            FS_SYNCWARP();                    // ... and every lane's
            const u8* buf = mine + (s % FS_GEMV_PF) * STAGE_STRIDE + blk * Q::TS;
#pragma unroll
            for (int r = 0; r < FS_GEMV_RPW; ++r)
                src[r] = buf + r * S::ROW_BYTES + (int)((row_off[r] + (long long)s * S::SB) & 15);
        } else {
#pragma unroll
            for (int r = 0; r < FS_GEMV_RPW; ++r) src[r] = w + row_off[r] + (long long)(s * FS_WARP + lane) * Q::TS;
        }
        if (s * FS_WARP + lane < n_pieces) fs_gemv_step<T, B>(acc, src, sub, xt4, tile_pos / 4 + 4 * lane);
        tile_pos += FS_GEMV_STEP;
        FS_SYNCWARP();
    }

#pragma unroll
    for (int r = 0; r < FS_GEMV_RPW; ++r) {
        const int row = row0 + r;
#pragma unroll
        for (int bi = 0; bi < B; ++bi) {
            const float v = fs_warp_sum(acc[r][bi]);
            if (lane == 0 && row < n_out && bi < n_b) {
                float out = bias ? v + bias[row] : v;
                float* dst = y + (long long)bi * n_out + row;
                if (accumulate) out += *dst;
                *dst = out;
            }
        }
    }
}

template <int T>
__device__ __forceinline__ void fs_get_rows(const u8* __restrict__ w, const int* __restrict__ ids,
                                            float* __restrict__ out, int n_rows, int n_in) {
    typedef FsQuant<T> Q;
    const int id = ids[blockIdx.x];
    const long long row_bytes = (long long)(n_in / Q::QK) * Q::TS;
    float4* dst = (float4*)(out + (long long)blockIdx.x * n_in);
    const int n_pieces = n_in / FS_PIECE;
    for (int p = threadIdx.x; p < n_pieces; p += blockDim.x) {
        if (id < 0 || id >= n_rows) {  // an id out of range reads nothing and poisons its row
            const float nan = __int_as_float(0x7fc00000);
#pragma unroll
            for (int q = 0; q < 4; ++q) dst[4 * p + q] = make_float4(nan, nan, nan, nan);
            continue;
        }
        int blk, sub;
        fs_piece_place<T>(p, blk, sub);
        typename Q::Piece pc;
        Q::load(pc, w + (long long)id * row_bytes + (long long)blk * Q::TS, sub);
#pragma unroll
        for (int q = 0; q < 4; ++q)
            dst[4 * p + q] = make_float4(pc.weight(q, 0), pc.weight(q, 1), pc.weight(q, 2), pc.weight(q, 3));
    }
}

#define FS_GEMV_ENTRY(NAME, T, B)                                                                            \
    extern "C" __global__ void __launch_bounds__(FS_GEMV_THREADS)                                            \
        fs_gemv_##NAME##_b##B(const u8* w, long long w_bytes, const float* x, float* y, const float* bias,   \
                              int n_out, int n_in, int n_b, int xt, int accumulate) {                        \
        fs_gemv<T, B>(w, w_bytes, x, y, bias, n_out, n_in, n_b, xt, accumulate);                             \
    }

#define FS_GEMV_TYPE(NAME, T)                                                                                \
    FS_GEMV_ENTRY(NAME, T, 1)                                                                                \
    FS_GEMV_ENTRY(NAME, T, 2)                                                                                \
    FS_GEMV_ENTRY(NAME, T, 3)                                                                                \
    FS_GEMV_ENTRY(NAME, T, 4)                                                                                \
    FS_GEMV_ENTRY(NAME, T, 5)                                                                                \
    FS_GEMV_ENTRY(NAME, T, 6)                                                                                \
    FS_GEMV_ENTRY(NAME, T, 7)                                                                                \
    FS_GEMV_ENTRY(NAME, T, 8)                                                                                \
    extern "C" __global__ void __launch_bounds__(FS_GET_ROWS_THREADS)                                        \
        fs_get_rows_##NAME(const u8* w, const int* ids, float* out, int n_rows, int n_in) {                  \
        fs_get_rows<T>(w, ids, out, n_rows, n_in);                                                           \
    }

FS_GEMV_TYPE(f32, FS_T_F32)
FS_GEMV_TYPE(f16, FS_T_F16)
FS_GEMV_TYPE(bf16, FS_T_BF16)
FS_GEMV_TYPE(q4_0, FS_T_Q4_0)
FS_GEMV_TYPE(q5_0, FS_T_Q5_0)
FS_GEMV_TYPE(q8_0, FS_T_Q8_0)
FS_GEMV_TYPE(q4_k, FS_T_Q4_K)
FS_GEMV_TYPE(q5_k, FS_T_Q5_K)
FS_GEMV_TYPE(q6_k, FS_T_Q6_K)
