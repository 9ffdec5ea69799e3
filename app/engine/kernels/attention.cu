// KV cache store and causal attention over it for 1..17 query rows (decode and k-token verify), split over
// the context (flash-decoding): one block per (split, kv head, group of query vectors) writes a partial
// softmax, attention_combine merges the splits. f16 cache, float32 arithmetic, online softmax.
//
// Nothing about the current length is a kernel argument: a query at position p sees keys j <= p (and
// p - j < window when window > 0), and positions come from a device int32 array. Every block derives the
// key range [lo, hi) that any query needs from those positions and takes its 1 / n_splits share of it, so
// one captured CUDA graph (fixed grid) replays for any positions and any context length, and the whole
// grid works whether the context is 40 keys or 30000.
#include "attention.cuh"

// k, v: [n, n_kv, hd] float32 rows of this step; pos: [n] int32; cache_k, cache_v: [n_ctx, n_kv, hd] f16.
// Row i goes to cache row pos[i]; a position outside [0, n_ctx) is skipped. grid (n), block (256).
extern "C" __global__ void kv_store_f16(const float* __restrict__ k, const float* __restrict__ v,
                                        const i32* __restrict__ pos, u16* __restrict__ cache_k,
                                        u16* __restrict__ cache_v, i32 row_elems, i32 n_ctx) {
    const i32 i = blockIdx.x;
    const i32 p = pos[i];
    if (p < 0 || p >= n_ctx) return;
    const float* kr = k + (i64)i * row_elems;
    const float* vr = v + (i64)i * row_elems;
    u16* ck = cache_k + (i64)p * row_elems;
    u16* cv = cache_v + (i64)p * row_elems;
    for (i32 e = threadIdx.x; e < row_elems; e += blockDim.x) {
        ck[e] = fs_float_to_half_rn(kr[e]);
        cv[e] = fs_float_to_half_rn(vr[e]);
    }
}

// Min and max over the block of ints (every thread gets both); scratch: 2 * 32 ints of shared memory.
__device__ __forceinline__ void fs_block_min_max(i32& lo, i32& hi, i32* scratch) {
#pragma unroll
    for (int m = FS_WARP / 2; m > 0; m >>= 1) {
        lo = min(lo, (i32)FS_SHFL_XOR(lo, m));
        hi = max(hi, (i32)FS_SHFL_XOR(hi, m));
    }
    const i32 lane = threadIdx.x % FS_WARP;
    const i32 warp = threadIdx.x / FS_WARP;
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = lo;
        scratch[32 + warp] = hi;
    }
    __syncthreads();
    const i32 n_warps = (blockDim.x + FS_WARP - 1) / FS_WARP;
    lo = scratch[0];
    hi = scratch[32];
    for (i32 w = 1; w < n_warps; ++w) {
        lo = min(lo, scratch[w]);
        hi = max(hi, scratch[32 + w]);
    }
}

// One (split, kv head, query group) block. Query vector g of the n * n_rep vectors sharing kv head kvh is
// row g / n_rep, head kvh * n_rep + g % n_rep; the block takes vectors [blockIdx.z * QG, + QG).
// Partials: o_part [n_splits, n, n_head, HD] (unnormalised sum of p * v), ml_part [n_splits, n, n_head, 2]
// (running max m, sum l); m = -inf marks a split with no visible key for that vector (o_part then unwritten).
// n_active: [1], how many leading splits got keys at all (the rest are empty for every vector).
template <int HD>
__device__ __forceinline__ void attention_split(const float* __restrict__ q, const u16* __restrict__ cache_k,
                                                const u16* __restrict__ cache_v, const i32* __restrict__ qpos,
                                                float* __restrict__ o_part, float* __restrict__ ml_part,
                                                i32* __restrict__ n_active, i32 n, i32 n_head, i32 n_kv,
                                                i32 n_ctx, i32 window, float scale) {
    constexpr int T = FS_ATTN_THREADS;
    constexpr int QG = FsAttnShape<HD>::QG;
    constexpr int TK = FsAttnShape<HD>::TK;
    constexpr int QS = HD + 4;                    // padded rows, 16-byte aligned: float4 reads of 8 keys hit 32 banks
    constexpr int C4 = HD / 4;                    // float4 columns of a row
    constexpr int DW = C4 < T ? C4 : T;           // threads across one output row (each 4 columns)
    constexpr int RG = T / DW;                    // output rows handled side by side
    constexpr int RPT = QG / RG;                  // output rows per thread
    constexpr int LPT = TK * C4 / T;              // 4-half loads of K (and of V) per thread and tile
    static_assert(TK <= FS_WARP, "one warp lane per key of a tile in the softmax step");
    static_assert(RPT * RG == QG && DW * (C4 / DW) == C4 && C4 / DW == 1 && LPT * T == TK * C4, "tile shape");

    __shared__ __align__(16) float q_s[QG * QS];
    __shared__ __align__(16) float k_s[TK * QS];
    __shared__ __align__(16) float v_s[TK * HD];
    __shared__ float p_s[QG * TK];
    __shared__ float m_s[QG];
    __shared__ float l_s[QG];
    __shared__ float a_s[QG];
    __shared__ i32 pos_s[QG];
    __shared__ i32 row_s[QG];
    __shared__ i32 head_s[QG];
    __shared__ i32 range_s[64];

    const i32 split = blockIdx.x;
    const i32 n_splits = gridDim.x;
    const i32 kvh = blockIdx.y;
    const i32 n_rep = n_head / n_kv;
    const i32 g0 = blockIdx.z * QG;
    const i32 nqv = min(QG, n * n_rep - g0);  // >= 1: the host sizes grid.z to cover n * n_rep exactly
    const i32 tid = threadIdx.x;
    const i32 lane = tid % FS_WARP;
    const i32 warp = tid / FS_WARP;
    const i64 kv_row = (i64)n_kv * HD;  // elements between two positions of the cache

    // Both reads of the positions are issued before either is waited for.
    if (tid < QG) {
        const i32 g = g0 + tid;
        const i32 row = tid < nqv ? g / n_rep : 0;
        row_s[tid] = row;
        head_s[tid] = kvh * n_rep + g % n_rep;
        pos_s[tid] = tid < nqv ? qpos[row] : -1;
        m_s[tid] = -FS_INF;
        l_s[tid] = 0.0f;
    }
    // The keys any query of this launch needs, [all_lo, all_hi), the same in every block; this split's share.
    i32 all_lo = 0x7fffffff;
    i32 all_hi = 0;
    for (i32 i = tid; i < n; i += T) {
        const i32 p = qpos[i];
        all_lo = min(all_lo, window > 0 ? max(0, p - window + 1) : 0);
        all_hi = max(all_hi, p + 1);
    }
    fs_block_min_max(all_lo, all_hi, range_s);  // its barriers also publish pos_s, row_s, head_s
    all_hi = min(all_hi, n_ctx);
    const i32 span = max(0, all_hi - all_lo);
    const i32 per = (((span + n_splits - 1) / n_splits) + TK - 1) / TK * TK;  // whole tiles per split
    const i32 c0 = all_lo + split * per;
    const i32 c1 = min(c0 + per, all_hi);
    if (tid == 0 && split == 0 && kvh == 0 && blockIdx.z == 0) *n_active = per > 0 ? (span + per - 1) / per : 0;

    // Keys this block's own vectors may need: the union of [p - window + 1, p], within the split.
    i32 lo = 0x7fffffff;
    i32 hi = -1;
    for (i32 vq = 0; vq < nqv; ++vq) {
        const i32 p = pos_s[vq];
        lo = min(lo, window > 0 ? max(0, p - window + 1) : 0);
        hi = max(hi, p + 1);
    }
    const i32 kb = max(c0, lo);
    const i32 ke = min(c1, hi);
    if (kb >= ke) {  // the same in every thread: an empty split, or one outside this group's keys
        if (tid < nqv) {
            const i64 base = (((i64)split * n + row_s[tid]) * n_head + head_s[tid]) * 2;
            ml_part[base + 0] = -FS_INF;
            ml_part[base + 1] = 0.0f;
        }
        return;
    }

    // K/V tiles go through registers: the next tile's loads are in flight while this one is computed.
    uint2 k_r[LPT];
    uint2 v_r[LPT];
    auto load_tile = [&](i32 k0) {
#pragma unroll
        for (int l = 0; l < LPT; ++l) {
            const i32 e = tid + l * T;
            const i32 j = k0 + e / C4;
            k_r[l] = make_uint2(0u, 0u);  // keys past the range stay zero: p = 0 must not meet a NaN
            v_r[l] = make_uint2(0u, 0u);
            if (j < ke) {
                const i64 off = (i64)j * kv_row + (i64)kvh * HD + (e % C4) * 4;
                k_r[l] = *reinterpret_cast<const uint2*>(cache_k + off);
                v_r[l] = *reinterpret_cast<const uint2*>(cache_v + off);
            }
        }
    };
    load_tile(kb);

    for (i32 e = tid; e < nqv * C4; e += T) {
        const i32 vq = e / C4;
        const i32 d = (e % C4) * 4;
        *reinterpret_cast<float4*>(q_s + vq * QS + d) =
            *reinterpret_cast<const float4*>(q + ((i64)row_s[vq] * n_head + head_s[vq]) * HD + d);
    }

    const i32 rg = tid / DW;        // this thread's output rows: rg, rg + RG, ...
    const i32 d4 = (tid % DW) * 4;  // and columns d4 .. d4 + 3
    float acc[RPT][4];
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] = 0.0f;

    for (i32 k0 = kb; k0 < ke; k0 += TK) {  // the bounds are the same in every thread
        const i32 tk = min(TK, ke - k0);
        __syncthreads();  // q_s filled; the previous tile's k_s, v_s, p_s read by everyone
#pragma unroll
        for (int l = 0; l < LPT; ++l) {
            const i32 e = tid + l * T;
            const i32 kk = e / C4;
            const i32 d = (e % C4) * 4;
            *reinterpret_cast<float4*>(k_s + kk * QS + d) =
                make_float4(fs_half_bits_to_float(k_r[l].x & 0xffffu), fs_half_bits_to_float(k_r[l].x >> 16),
                            fs_half_bits_to_float(k_r[l].y & 0xffffu), fs_half_bits_to_float(k_r[l].y >> 16));
            *reinterpret_cast<float4*>(v_s + kk * HD + d) =
                make_float4(fs_half_bits_to_float(v_r[l].x & 0xffffu), fs_half_bits_to_float(v_r[l].x >> 16),
                            fs_half_bits_to_float(v_r[l].y & 0xffffu), fs_half_bits_to_float(v_r[l].y >> 16));
        }
        __syncthreads();
        if (k0 + TK < ke) load_tile(k0 + TK);

        // Scores, -inf where the key is not visible to that vector; four partial sums for a shorter chain.
        for (i32 e = tid; e < nqv * TK; e += T) {
            const i32 vq = e / TK;
            const i32 kk = e % TK;
            const i32 j = k0 + kk;
            const i32 p = pos_s[vq];
            float s = -FS_INF;
            if (kk < tk && j <= p && (window <= 0 || p - j < window)) {
                const float4* qr = reinterpret_cast<const float4*>(q_s + vq * QS);
                const float4* kr = reinterpret_cast<const float4*>(k_s + kk * QS);
                float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma unroll 8
                for (int d = 0; d < C4; ++d) {
                    const float4 a = qr[d];
                    const float4 b = kr[d];
                    d0 = fmaf(a.x, b.x, d0);
                    d1 = fmaf(a.y, b.y, d1);
                    d2 = fmaf(a.z, b.z, d2);
                    d3 = fmaf(a.w, b.w, d3);
                }
                s = ((d0 + d1) + (d2 + d3)) * scale;
            }
            p_s[vq * TK + kk] = s;
        }
        __syncthreads();

        // Online softmax, one warp per vector: new max, rescale factor of what is accumulated, p = exp(s - m).
        for (i32 vq = warp; vq < nqv; vq += T / FS_WARP) {
            const float s = lane < TK ? p_s[vq * TK + lane] : -FS_INF;
            const float m_old = m_s[vq];
            const float m_new = fmaxf(m_old, fs_warp_max(s));
            const bool none = m_new == -FS_INF;  // nothing visible yet: avoid -inf - -inf
            const float p = none ? 0.0f : expf(s - m_new);
            const float alpha = none ? 1.0f : expf(m_old - m_new);
            const float sum = fs_warp_sum(p);
            if (lane < TK) p_s[vq * TK + lane] = p;
            if (lane == 0) {
                m_s[vq] = m_new;
                l_s[vq] = l_s[vq] * alpha + sum;
                a_s[vq] = alpha;
            }
        }
        __syncthreads();

        // acc = acc * alpha + P V for this thread's rows (those that exist) and its 4 columns. Keys past tk
        // count for nothing: their p is 0 and their V row was loaded as zeros.
#pragma unroll
        for (int r = 0; r < RPT; ++r) {
            const i32 vq = rg + RG * r;
            if (vq < nqv) {
                const float alpha = a_s[vq];
                float o0 = acc[r][0] * alpha, o1 = acc[r][1] * alpha, o2 = acc[r][2] * alpha, o3 = acc[r][3] * alpha;
#pragma unroll
                for (int kk = 0; kk < TK; ++kk) {
                    const float pk = p_s[vq * TK + kk];
                    const float4 v = *reinterpret_cast<const float4*>(v_s + kk * HD + d4);
                    o0 = fmaf(pk, v.x, o0);
                    o1 = fmaf(pk, v.y, o1);
                    o2 = fmaf(pk, v.z, o2);
                    o3 = fmaf(pk, v.w, o3);
                }
                acc[r][0] = o0;
                acc[r][1] = o1;
                acc[r][2] = o2;
                acc[r][3] = o3;
            }
        }
    }
    __syncthreads();  // m_s, l_s final

#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        const i32 vq = rg + RG * r;
        if (vq < nqv) {
            const i64 base = (((i64)split * n + row_s[vq]) * n_head + head_s[vq]) * HD + d4;
            *reinterpret_cast<float4*>(o_part + base) = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        }
    }
    if (tid < nqv) {
        const i64 base = (((i64)split * n + row_s[tid]) * n_head + head_s[tid]) * 2;
        ml_part[base + 0] = m_s[tid];
        ml_part[base + 1] = l_s[tid];
    }
}

// q: [n, n_head, HD] float32; grid (n_splits, n_kv, ceil(n * n_head / n_kv / QG)), block (FS_ATTN_THREADS).
#define FS_ATTN_KERNEL(HD)                                                                                      \
    extern "C" __global__ void __launch_bounds__(FS_ATTN_THREADS) attention_split_hd##HD(                     \
        const float* __restrict__ q, const u16* __restrict__ cache_k, const u16* __restrict__ cache_v,         \
        const i32* __restrict__ qpos, float* __restrict__ o_part, float* __restrict__ ml_part,                 \
        i32* __restrict__ n_active, i32 n, i32 n_head, i32 n_kv, i32 n_ctx, i32 window, float scale) {         \
        attention_split<HD>(q, cache_k, cache_v, qpos, o_part, ml_part, n_active, n, n_head, n_kv, n_ctx, window, \
                            scale);                                                                            \
    }

FS_ATTN_KERNEL(64)
FS_ATTN_KERNEL(128)
FS_ATTN_KERNEL(256)

// out[r, :] = sum_c o_part[c, r, :] e^(m_c - m) / sum_c l_c e^(m_c - m) over the splits with a visible key,
// r = row * n_head + head. grid (n * n_head), block (FS_ATTN_COMBINE_THREADS): thread t sums column t % hd
// of every (FS_ATTN_COMBINE_THREADS / hd)-th split; only the first *n_active of the n_splits
// (<= FS_ATTN_MAX_SPLITS) are read. A vector that saw no key at all gets zeros.
extern "C" __global__ void attention_combine(const float* __restrict__ o_part, const float* __restrict__ ml_part,
                                             const i32* __restrict__ n_active, float* __restrict__ out,
                                             i32 n_splits, i32 n_vectors, i32 hd) {
    __shared__ float w_s[FS_ATTN_MAX_SPLITS];
    __shared__ float o_s[FS_ATTN_COMBINE_THREADS];
    __shared__ float scratch[32];
    const i32 r = blockIdx.x;
    const i32 t = threadIdx.x;
    const i32 nt = blockDim.x;
    const i32 d = t % hd;
    const i32 y = t / hd;
    const i32 ny = nt / hd;
    n_splits = min(n_splits, *n_active);
    float m = -FS_INF;
    for (i32 c = t; c < n_splits; c += nt) {
        const float mc = ml_part[((i64)c * n_vectors + r) * 2];
        w_s[c] = mc;
        m = fmaxf(m, mc);
    }
    m = fs_block_max(m, scratch);
    float l = 0.0f;
    for (i32 c = t; c < n_splits; c += nt) {  // the same c as above: w_s[c] is this thread's own
        const float mc = w_s[c];
        const float w = mc == -FS_INF ? 0.0f : expf(mc - m);  // no visible key there: o_part not written
        w_s[c] = w;
        l = fmaf(ml_part[((i64)c * n_vectors + r) * 2 + 1], w, l);
    }
    l = fs_block_sum(l, scratch);  // its barriers also publish w_s
    float o = 0.0f;
#pragma unroll 8
    for (i32 c = y; c < n_splits; c += ny) {
        const float w = w_s[c];
        const float x = o_part[((i64)c * n_vectors + r) * hd + d];  // loaded even when unused: no branch
        o = w != 0.0f ? fmaf(x, w, o) : o;                           // between the loads; a NaN there is dropped
    }
    o_s[t] = o;
    __syncthreads();
    if (y == 0) {
        for (i32 other = 1; other < ny; ++other) o += o_s[other * hd + d];
        out[(i64)r * hd + d] = l > 0.0f ? o / l : 0.0f;
    }
}
