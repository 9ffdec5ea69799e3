// y[b, out] (+)= x^[b, in] . W[out, in]^T (+ bias) on integer tensor cores for a verify pass of up to 24
// rows of x (B = 8 NT), each weight read once: Q4_K (mma m16n8k32, one per sub-block of 32) and Q6_K
// (m16n8k16, one per scale group of 16), from the same bytes as mmvq.cu (Q4_K as stored, Q6_K's planes)
// and the same int8 activations (q8.cuh). mmvq.cu serves decoding and the other types; this kernel takes
// over where rows of x make dp4a the bound (app/engine/kernels/mmvq.py, TC_MIN_ROWS).
//
// A block is one tile of 16 output rows and NW warps (1 .. FS_TC_MAX_WARPS) that split the row: warp w takes
// steps w, w + NW, ... of 64 elements (two Q4_K sub-blocks, four Q6_K groups). Lane 4 g + t loads rows g and
// g + 8 of the tile (the A fragments) and column g of each 8 rows of x (the B fragments); after each mma it
// scales its int32 C values -- rows g, g + 8, columns 2t, 2t + 1 -- into float accumulators in step order:
//   acc = fmaf(A_row, dx_col * C, acc); acc = fmaf(M_row, xs_col, acc)
// with the group's weight scale A and offset M (-dmin m, or -32 A) and the x block's dx and the scaled sum
// of its codes over the group (qdot.cuh). The block sums its warps' accumulators in warp order.
#include "qdot.cuh"

#ifndef FS_TC_MAX_WARPS
#error "FS_TC_MAX_WARPS is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
static_assert(FS_WARP == 32 || FS_WARP == 64, "mma tiles are 32 lanes");

// The fragments and factors of one step of two rows (g, g + 8) of a tile.
template <int T>
struct FsTc;

template <>
struct FsTc<FS_T_Q4_K> {
    static constexpr int GROUPS = 2, K = 32;  // mmas per step and their k
    typedef FsQdot<FS_T_Q4_K> Q;
    struct Step {
        u32 a[GROUPS][4];
        float A[GROUPS][2], M[GROUPS][2];  // [group][row g or g + 8]
    };
    // Step s of rows p[0], p[1]: block s / 4, qs bytes 32 c .. 32 c + 31 (c = s % 4): low nibbles are
    // sub-block 2 c, high nibbles 2 c + 1; lane t reads bytes 4 t and 16 + 4 t of them.
    static __device__ __forceinline__ void load(Step& st, const Q::Row (&p)[2], int s, int t) {
        const int blk = s >> 2, c = s & 3;
        u32 lo[2], hi[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const u8* b = p[r].p + (long long)blk * Q::TS;
            const uint4 head = *(const uint4*)b;
            lo[r] = *(const u32*)(b + 16 + 32 * c + 4 * t);
            hi[r] = *(const u32*)(b + 16 + 32 * c + 16 + 4 * t);
            const float d = fs_h2f((u16)(head.x & 0xFFFFu)), dmin = fs_h2f((u16)(head.x >> 16));
#pragma unroll
            for (int gi = 0; gi < GROUPS; ++gi) {
                int sc, m;
                fs_k_scale_min(head.y, head.z, head.w, 2 * c + gi, sc, m);
                st.A[gi][r] = __fmul_rn(d, fs_i2f(sc));
                st.M[gi][r] = -__fmul_rn(dmin, fs_i2f(m));
            }
        }
#pragma unroll
        for (int gi = 0; gi < GROUPS; ++gi) {
            const u32 shift = 4u * (u32)gi;
            st.a[gi][0] = (lo[0] >> shift) & 0x0F0F0F0Fu;
            st.a[gi][1] = (lo[1] >> shift) & 0x0F0F0F0Fu;
            st.a[gi][2] = (hi[0] >> shift) & 0x0F0F0F0Fu;
            st.a[gi][3] = (hi[1] >> shift) & 0x0F0F0F0Fu;
        }
    }
    // The first element of group gi of step s in the row, and the x block holding it.
    static __device__ __forceinline__ int element(int s, int gi) { return (s >> 2) * 256 + 64 * (s & 3) + 32 * gi; }
};

template <>
struct FsTc<FS_T_Q6_K> {
    static constexpr int GROUPS = 4, K = 16;
    typedef FsQdot<FS_T_Q6_K> Q;
    struct Step {
        u32 a[GROUPS][2];
        float A[GROUPS][2], M[GROUPS][2];
    };
    // Step s = 4 blk + 2 h + hh: groups k = 0..3 are elements 128 h + 32 k + 16 hh + [0, 16) of block blk,
    // low 4 bits from ql[64 h + 32 (k & 1) + 16 hh ..] (nibble k >> 1), top 2 from qh[32 h + 16 hh ..]
    // (bits 2 k), scale scales[8 h + 2 k + hh]; lane t reads the 4 bytes at 4 t of each 16.
    static __device__ __forceinline__ void load(Step& st, const Q::Row (&p)[2], int s, int t) {
        const int blk = s >> 2, h = (s >> 1) & 1, hh = s & 1;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const long long off = (long long)blk;
            const u32 ql0 = *(const u32*)(p[r].ql + off * 128 + 64 * h + 16 * hh + 4 * t);
            const u32 ql1 = *(const u32*)(p[r].ql + off * 128 + 64 * h + 32 + 16 * hh + 4 * t);
            const u32 qh = *(const u32*)(p[r].qh + off * 64 + 32 * h + 16 * hh + 4 * t);
            const uint2 sc = *(const uint2*)(p[r].sc + off * 16 + 8 * h);
            const float d = fs_h2f(*(const u16*)(p[r].d + off * 2));
            st.a[0][r] = (ql0 & 0x0F0F0F0Fu) | ((qh << 4) & 0x30303030u);
            st.a[1][r] = (ql1 & 0x0F0F0F0Fu) | ((qh << 2) & 0x30303030u);
            st.a[2][r] = ((ql0 >> 4) & 0x0F0F0F0Fu) | (qh & 0x30303030u);
            st.a[3][r] = ((ql1 >> 4) & 0x0F0F0F0Fu) | ((qh >> 2) & 0x30303030u);
#pragma unroll
            for (int k = 0; k < GROUPS; ++k) {  // scales[8 h + 2 k + hh]: byte 2 k + hh of the 8
                const u32 word = k < 2 ? sc.x : sc.y, b = 8u * (u32)(2 * (k & 1) + hh);
                st.A[k][r] = __fmul_rn(d, fs_i2f((int)(signed char)(u8)(word >> b)));
                st.M[k][r] = __fmul_rn(-32.0f, st.A[k][r]);
            }
        }
    }
    static __device__ __forceinline__ int element(int s, int k) {
        return (s >> 2) * 256 + 128 * ((s >> 1) & 1) + 32 * k + 16 * (s & 1);
    }
};

template <int T, int NT>
__device__ __forceinline__ void fs_mmvq_tc(const u8* __restrict__ w, const i8* __restrict__ xq,
                                           const float* __restrict__ xd, const float* __restrict__ xs,
                                           float* __restrict__ y, const float* __restrict__ bias, int n_out,
                                           int n_in, int n_b, int accumulate) {
    typedef FsTc<T> C;
    constexpr int COLS = 8 * NT;
    __shared__ float part[FS_TC_MAX_WARPS][16][COLS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16, nblk = n_in / 256, steps = n_in / 64;
    typename C::Q::Row rows[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + g + 8 * r;
        C::Q::locate(rows[r], w, n_out, nblk, row < n_out ? row : n_out - 1);
    }
    // this lane's rows of x: column g of each tile of 8 (B fragments), columns 2t, 2t + 1 (its C values)
    const i8* xb[NT];
    const float *xd_c[NT][2], *xs_c[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const int b = 8 * nt + g;
        xb[nt] = b < n_b ? xq + (long long)b * n_in : nullptr;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int col = min(8 * nt + 2 * t + j, n_b - 1);  // a column past n_b computes, unstored
            xd_c[nt][j] = xd + (long long)col * (n_in / 32);
            xs_c[nt][j] = xs + (long long)col * (n_in / 16);
        }
    }
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;
    }
    for (int s = warp; s < steps; s += n_warps) {
        typename C::Step st;
        C::load(st, rows, s, t);
#pragma unroll
        for (int gi = 0; gi < C::GROUPS; ++gi) {
            const int e = C::element(s, gi);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                u32 b[C::K / 16];
#pragma unroll
                for (int i = 0; i < C::K / 16; ++i) b[i] = xb[nt] ? *(const u32*)(xb[nt] + e + 16 * i + 4 * t) : 0u;
                int c[4] = {0, 0, 0, 0};
                if constexpr (C::K == 32)
                    fs_mma_s8_k32(c, st.a[gi], b);
                else
                    fs_mma_s8_k16(c, st.a[gi], b);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int r = i >> 1, j = i & 1;
                    const float dx = xd_c[nt][j][e >> 5];
                    const float xsum = C::K == 32 ? __fadd_rn(xs_c[nt][j][e >> 4], xs_c[nt][j][(e >> 4) + 1])
                                                  : xs_c[nt][j][e >> 4];
                    acc[nt][i] = fmaf(st.A[gi][r], __fmul_rn(dx, fs_i2f(c[i])), acc[nt][i]);
                    acc[nt][i] = fmaf(st.M[gi][r], xsum, acc[nt][i]);
                }
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) part[warp][g + 8 * (i >> 1)][8 * nt + 2 * t + (i & 1)] = acc[nt][i];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * COLS; i += blockDim.x) {
        const int r = i / COLS, col = i % COLS, row = row0 + r;
        if (row < n_out && col < n_b) {
            float v = part[0][r][col];
            for (int u = 1; u < n_warps; ++u) v += part[u][r][col];
            float out = bias ? v + bias[row] : v;
            float* dst = y + (long long)col * n_out + row;
            if (accumulate) out += *dst;
            *dst = out;
        }
    }
}

#define FS_TC_ENTRY(NAME, T, NT)                                                                             \
    extern "C" __global__ void __launch_bounds__(FS_TC_MAX_WARPS * 32)                                       \
        fs_mmvq_tc_##NAME##_n##NT(const u8* w, const i8* xq, const float* xd, const float* xs, float* y,     \
                                  const float* bias, int n_out, int n_in, int n_b, int accumulate) {         \
        fs_mmvq_tc<T, NT>(w, xq, xd, xs, y, bias, n_out, n_in, n_b, accumulate);                             \
    }

// NT tiles of 8 rows of x: the host table's entry points (mmvq.py, TC_TILES).
FS_TC_ENTRY(q4_k, FS_T_Q4_K, 1)
FS_TC_ENTRY(q4_k, FS_T_Q4_K, 2)
FS_TC_ENTRY(q4_k, FS_T_Q4_K, 3)
FS_TC_ENTRY(q6_k, FS_T_Q6_K, 1)
FS_TC_ENTRY(q6_k, FS_T_Q6_K, 2)
FS_TC_ENTRY(q6_k, FS_T_Q6_K, 3)

// The instruction against its portable form on the same fragments, for the GPU tests: a [32][4], b [32][2]
// in lane order; out [32][8] = the k32 then the k16 results of the instruction, [32][8] more of the
// portable form. One warp.
extern "C" __global__ void fs_mma_check(const u32* a, const u32* b, int* out) {
    const int lane = threadIdx.x;
    const u32 a4[4] = {a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]};
    const u32 b2[2] = {b[2 * lane], b[2 * lane + 1]};
    const u32 a2[2] = {a4[0], a4[1]};
    const u32 b1[1] = {b2[0]};
    int c32[4] = {1, 2, 3, 4}, c16[4] = {1, 2, 3, 4}, p32[4] = {1, 2, 3, 4}, p16[4] = {1, 2, 3, 4};
    fs_mma_s8_k32(c32, a4, b2);
    fs_mma_s8_k16(c16, a2, b1);
    fs_mma_s8_portable<32>(p32, a4, b2);
    fs_mma_s8_portable<16>(p16, a2, b1);
    for (int i = 0; i < 4; ++i) {
        out[8 * lane + i] = c32[i];
        out[8 * lane + 4 + i] = c16[i];
        out[256 + 8 * lane + i] = p32[i];
        out[256 + 8 * lane + 4 + i] = p16[i];
    }
}
