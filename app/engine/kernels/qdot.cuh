// GGUF weights as int8 codes for integer dot products with int8 activations (mmvq.cu): per weight type,
// where a chunk of a row lies, how its bytes become words of four codes, and the float arithmetic that
// scales the integer dots.
//
// A chunk is 32 weights of one row in two groups of 16; chunk k of a row is block k / CPB, chunk j = k % CPB
// of the block. Activations come quantised per row of x (fs_quantize_q8): 32 elements share a scale dx,
// x^ = dx * xq with xq in [-127, 127]; xs[i] = dx * (sum of the 16 codes of group i). A group's integer
// dot sum(q * xq) is exact, so a chunk adds  sum over its groups of  A * dx * dot + M * xs  (A the group's
// scale, M its offset: -dmin*m for Q4_K/Q5_K, -32 A for Q6_K, -8 d / -16 d for Q4_0 / Q5_0): the product of
// the dequantised weights with x^, rounded only where the float operations below round. Every float step
// is an explicit fmaf or _rn operation, so the compiler contracts none of them differently from the NumPy
// port (tests/support/mmvq_port.py).
//
// Layouts. Q4_K and Q5_K blocks (144 and 176 bytes) are 16-byte aligned in a row and are read as stored.
// Q6_K, Q8_0, Q4_0 and Q5_0 blocks are only 2-byte aligned; for this kernel they are uploaded as planes,
// one per field of the block (app/engine/kernels/mmvq.py, pack_planes): field f of block b of row r at
// plane_f + (r * blocks_per_row + b) * size_f, every plane 16-byte aligned, the bytes of each field as in
// the block. Same bytes in all, no padding inside a plane.
#pragma once
#include "quant.cuh"

// i as a float, exactly for |i| < 2^22, in two full-rate instructions (an int-to-float conversion runs at a
// quarter of the rate). Every dot below is within +-2^20.
__device__ __forceinline__ float fs_i2f(int i) { return __int_as_float(0x4B400000 + i) - 12582912.0f; }

__device__ __forceinline__ int fs_dot16(const u32 (&w)[4], const int4& x) {
    int d = fs_dp4a((int)w[0], x.x, 0);
    d = fs_dp4a((int)w[1], x.y, d);
    d = fs_dp4a((int)w[2], x.z, d);
    return fs_dp4a((int)w[3], x.w, d);
}

__device__ __forceinline__ long long fs_align16(long long n) { return (n + 15) & ~15ll; }

__device__ __forceinline__ void fs_words(const uint4& v, u32 (&w)[4]) {
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
}

// A chunk's weights, decoded: codes of groups 0 and 1 and the float factors of each group.
struct FsQdotWeights {
    u32 v0[4], v1[4];
    float a0, a1, m0, m1;
};

// A chunk's activations for one row of x: codes of both groups, their scales dx and sums xs.
struct FsQdotX {
    int4 q0, q1;
    float dx0, dx1, xs0, xs1;
};

// Groups of 16 at elements e and e + gap of the row of x, in x blocks e / 32 and (e + gap) / 32.
__device__ __forceinline__ void fs_qdot_x(FsQdotX& x, const i8* __restrict__ xq, const float* __restrict__ xd,
                                          const float* __restrict__ xs, int e, int gap) {
    x.q0 = *(const int4*)(xq + e);
    x.q1 = *(const int4*)(xq + e + gap);
    x.dx0 = xd[e >> 5];
    x.dx1 = xd[(e + gap) >> 5];
    x.xs0 = xs[e >> 4];
    x.xs1 = xs[(e + gap) >> 4];
}

template <int T>
struct FsQdot;

// Q4_K and Q5_K: chunk j = 16 bytes of qs at 16 j: low nibbles are sub-block s = 2 (j >> 1) elements
// 16 (j & 1) + [0, 16), high nibbles sub-block s + 1, same elements; w = d sc q - dmin m per sub-block.
template <int T>
struct FsQdotK {
    static constexpr int QK = 256, CPB = 8, TS = T == FS_T_Q4_K ? 144 : 176;
    struct Row {
        const u8* p;
    };
    struct Raw {
        uint4 head, qs, qh;
    };
    static __device__ __forceinline__ void locate(Row& r, const u8* w, int n_out, int nblk, int index) {
        r.p = w + (long long)index * nblk * TS;
    }
    static __device__ __forceinline__ void fetch(Raw& raw, const Row& r, int blk, int j) {
        const u8* b = r.p + (long long)blk * TS;
        raw.head = fs_ld_stream16(b);
        if constexpr (T == FS_T_Q4_K) {
            raw.qs = fs_ld_stream16(b + 16 + 16 * j);
        } else {
            raw.qh = fs_ld_stream16(b + 16 + 16 * (j & 1));
            raw.qs = fs_ld_stream16(b + 48 + 16 * j);
        }
    }
    static __device__ __forceinline__ void decode(FsQdotWeights& wt, const Raw& raw, int j) {
        const int s = 2 * (j >> 1);
        u32 q[4];
        fs_words(raw.qs, q);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            wt.v0[i] = q[i] & 0x0F0F0F0Fu;
            wt.v1[i] = (q[i] >> 4) & 0x0F0F0F0Fu;
        }
        if constexpr (T == FS_T_Q5_K) {  // bit s of qh byte l is bit 4 of element 32 s + l
            u32 h[4];
            fs_words(raw.qh, h);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wt.v0[i] |= ((h[i] >> s) & 0x01010101u) << 4;
                wt.v1[i] |= ((h[i] >> (s + 1)) & 0x01010101u) << 4;
            }
        }
        int sc0, m0, sc1, m1;
        fs_k_scale_min(raw.head.y, raw.head.z, raw.head.w, s, sc0, m0);
        fs_k_scale_min(raw.head.y, raw.head.z, raw.head.w, s + 1, sc1, m1);
        const float d = fs_h2f((u16)(raw.head.x & 0xFFFFu)), dmin = fs_h2f((u16)(raw.head.x >> 16));
        wt.a0 = __fmul_rn(d, fs_i2f(sc0));
        wt.a1 = __fmul_rn(d, fs_i2f(sc1));
        wt.m0 = -__fmul_rn(dmin, fs_i2f(m0));
        wt.m1 = -__fmul_rn(dmin, fs_i2f(m1));
    }
    static __device__ __forceinline__ void load_x(FsQdotX& x, const i8* xq, const float* xd, const float* xs,
                                                  int blk, int j) {
        fs_qdot_x(x, xq, xd, xs, blk * 256 + 64 * (j >> 1) + 16 * (j & 1), 32);
    }
    static __device__ __forceinline__ float dot(const FsQdotWeights& wt, const FsQdotX& x, float acc) {
        acc = fmaf(wt.a0, __fmul_rn(x.dx0, fs_i2f(fs_dot16(wt.v0, x.q0))), acc);
        acc = fmaf(wt.a1, __fmul_rn(x.dx1, fs_i2f(fs_dot16(wt.v1, x.q1))), acc);
        acc = fmaf(wt.m0, x.xs0, acc);
        return fmaf(wt.m1, x.xs1, acc);
    }
};

template <>
struct FsQdot<FS_T_Q4_K> : FsQdotK<FS_T_Q4_K> {};
template <>
struct FsQdot<FS_T_Q5_K> : FsQdotK<FS_T_Q5_K> {};

// Q6_K planes: ql (128 bytes a block), qh (64), scales (16, int8), d (2). Chunk j = 4 h + 2 kk + hh
// (h: half of the block, hh: which 16 of a 32-element run): group 0 is elements 128 h + 32 kk + 16 hh +
// [0, 16), group 1 the same + 64. Both take their low 4 bits from ql[64 h + 32 kk + 16 hh ..] (= 16 j:
// low and high nibbles) and their top 2 bits from qh[32 h + 16 hh ..], bits 2 kk and 2 kk + 4;
// scales[8 h + 2 kk + hh] and [.. + 4]; w = d sc (q - 32).
template <>
struct FsQdot<FS_T_Q6_K> {
    static constexpr int QK = 256, CPB = 8;
    struct Row {
        const u8 *ql, *qh, *sc, *d;
    };
    struct Raw {
        uint4 ql, qh;
        uint2 sc;
        u16 d;
    };
    static __device__ __forceinline__ void locate(Row& r, const u8* w, int n_out, int nblk, int index) {
        const long long blocks = (long long)n_out * nblk, at = (long long)index * nblk;
        const long long p1 = fs_align16(blocks * 128), p2 = p1 + fs_align16(blocks * 64);
        const long long p3 = p2 + fs_align16(blocks * 16);
        r.ql = w + at * 128;
        r.qh = w + p1 + at * 64;
        r.sc = w + p2 + at * 16;
        r.d = w + p3 + at * 2;
    }
    static __device__ __forceinline__ void fetch(Raw& raw, const Row& r, int blk, int j) {
        const int h = j >> 2, hh = j & 1;
        raw.ql = fs_ld_stream16(r.ql + (long long)blk * 128 + 16 * j);
        raw.qh = fs_ld_stream16(r.qh + (long long)blk * 64 + 32 * h + 16 * hh);
        raw.sc = *(const uint2*)(r.sc + (long long)blk * 16 + 8 * h);
        raw.d = *(const u16*)(r.d + (long long)blk * 2);
    }
    static __device__ __forceinline__ void decode(FsQdotWeights& wt, const Raw& raw, int j) {
        const u32 kk = (u32)(j >> 1) & 1u, hh = (u32)j & 1u;
        u32 lo[4], hi[4];
        fs_words(raw.ql, lo);
        fs_words(raw.qh, hi);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            wt.v0[i] = (lo[i] & 0x0F0F0F0Fu) | ((hi[i] << (4u - 2u * kk)) & 0x30303030u);
            wt.v1[i] = ((lo[i] >> 4) & 0x0F0F0F0Fu) | ((hi[i] >> (2u * kk)) & 0x30303030u);
        }
        // scales[8 h + 2 kk + hh] is byte 2 kk + hh of the 8 loaded, [.. + 4] byte 2 kk + hh + 4
        const u32 b = 8u * (2u * kk + hh);
        const int sc0 = (int)(signed char)(u8)(raw.sc.x >> b), sc1 = (int)(signed char)(u8)(raw.sc.y >> b);
        const float d = fs_h2f(raw.d);
        wt.a0 = __fmul_rn(d, fs_i2f(sc0));
        wt.a1 = __fmul_rn(d, fs_i2f(sc1));
        wt.m0 = __fmul_rn(-32.0f, wt.a0);
        wt.m1 = __fmul_rn(-32.0f, wt.a1);
    }
    static __device__ __forceinline__ void load_x(FsQdotX& x, const i8* xq, const float* xd, const float* xs,
                                                  int blk, int j) {
        fs_qdot_x(x, xq, xd, xs, blk * 256 + 128 * (j >> 2) + 32 * ((j >> 1) & 1) + 16 * (j & 1), 64);
    }
    // d sc (dx dot - 32 xs) per group: the offset rides on xs, the sum of the group's codes times dx.
    static __device__ __forceinline__ float dot(const FsQdotWeights& wt, const FsQdotX& x, float acc) {
        acc = fmaf(wt.a0, __fmul_rn(x.dx0, fs_i2f(fs_dot16(wt.v0, x.q0))), acc);
        acc = fmaf(wt.a1, __fmul_rn(x.dx1, fs_i2f(fs_dot16(wt.v1, x.q1))), acc);
        acc = fmaf(wt.m0, x.xs0, acc);
        return fmaf(wt.m1, x.xs1, acc);
    }
};

// Q8_0, Q4_0, Q5_0 planes: [qh (4 bytes a block, Q5_0)], qs (32 / 16 bytes), d (2). A chunk is a block:
// group 0 its elements 0..15, group 1 16..31, one scale d and one x block for both.
template <int T>
struct FsQdot32 {
    static constexpr int QK = 32, CPB = 1;
    static constexpr int QS = T == FS_T_Q8_0 ? 32 : 16, QH = T == FS_T_Q5_0 ? 4 : 0;
    // w = d (q - OFFSET): the offset's term is OFFSET d x (sum of both groups' xs)
    static constexpr float OFFSET = T == FS_T_Q8_0 ? 0.0f : T == FS_T_Q4_0 ? 8.0f : 16.0f;
    struct Row {
        const u8 *qh, *qs, *d;
    };
    struct Raw {
        uint4 qs0, qs1;
        u32 qh;
        u16 d;
    };
    static __device__ __forceinline__ void locate(Row& r, const u8* w, int n_out, int nblk, int index) {
        const long long blocks = (long long)n_out * nblk, at = (long long)index * nblk;
        const long long p1 = fs_align16(blocks * QH), p2 = p1 + fs_align16(blocks * QS);
        r.qh = w + at * QH;
        r.qs = w + p1 + at * QS;
        r.d = w + p2 + at * 2;
    }
    static __device__ __forceinline__ void fetch(Raw& raw, const Row& r, int blk, int) {
        const u8* qs = r.qs + (long long)blk * QS;
        raw.qs0 = fs_ld_stream16(qs);
        if constexpr (T == FS_T_Q8_0) raw.qs1 = fs_ld_stream16(qs + 16);
        if constexpr (T == FS_T_Q5_0) raw.qh = *(const u32*)(r.qh + (long long)blk * 4);
        raw.d = *(const u16*)(r.d + (long long)blk * 2);
    }
    static __device__ __forceinline__ void decode(FsQdotWeights& wt, const Raw& raw, int) {
        u32 q[4];
        fs_words(raw.qs0, q);
        if constexpr (T == FS_T_Q8_0) {
            fs_words(raw.qs0, wt.v0);
            fs_words(raw.qs1, wt.v1);
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wt.v0[i] = q[i] & 0x0F0F0F0Fu;
                wt.v1[i] = (q[i] >> 4) & 0x0F0F0F0Fu;
            }
        }
        if constexpr (T == FS_T_Q5_0) {  // bit e of qh is bit 4 of element e: 4 bits to bit 4 of 4 bytes
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wt.v0[i] |= (((raw.qh >> (4 * i)) & 0xFu) * 0x02040810u) & 0x10101010u;
                wt.v1[i] |= (((raw.qh >> (16 + 4 * i)) & 0xFu) * 0x02040810u) & 0x10101010u;
            }
        }
        wt.a0 = wt.a1 = fs_h2f(raw.d);
        wt.m0 = wt.m1 = __fmul_rn(-OFFSET, wt.a0);
    }
    static __device__ __forceinline__ void load_x(FsQdotX& x, const i8* xq, const float* xd, const float* xs,
                                                  int blk, int) {
        fs_qdot_x(x, xq, xd, xs, blk * 32, 16);
    }
    // d (dx (dot0 + dot1) - OFFSET (xs0 + xs1)): both groups share d and dx, so their dots add as integers.
    static __device__ __forceinline__ float dot(const FsQdotWeights& wt, const FsQdotX& x, float acc) {
        const int d = fs_dot16(wt.v0, x.q0) + fs_dot16(wt.v1, x.q1);
        acc = fmaf(wt.a0, __fmul_rn(x.dx0, fs_i2f(d)), acc);
        if constexpr (T != FS_T_Q8_0) acc = fmaf(wt.m0, __fadd_rn(x.xs0, x.xs1), acc);
        return acc;
    }
};

template <>
struct FsQdot<FS_T_Q8_0> : FsQdot32<FS_T_Q8_0> {};
template <>
struct FsQdot<FS_T_Q4_0> : FsQdot32<FS_T_Q4_0> {};
template <>
struct FsQdot<FS_T_Q5_0> : FsQdot32<FS_T_Q5_0> {};
