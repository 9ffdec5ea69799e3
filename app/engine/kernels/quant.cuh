// GGUF weight blocks on the device: layouts (ggml-common.h) and a decoder per type that turns one
// "piece" -- 16 consecutive weights of a row -- into floats.
//
// Every type is read 16 weights at a time so the GEMV has one lane-to-element mapping for all types:
// piece p of a row covers elements [16p, 16p + 16). Float types are treated as blocks of 16 elements.
//
// Quantised pieces come out as (A, C, four code words): byte c of a code word is one weight,
//   f = the float whose bits are 0x3F000000 with c in byte 2 = 0.5 + c/256  (one byte permute, no
//       int-to-float conversion, which runs at a quarter of the FMA rate),
//   w = A * f + C.
// Codes are kept below 128 (v << 3 for 4-bit values, v << 2 for 5-bit, v << 1 for 6-bit) so f < 1 and
// the GEMV can sum f * x and apply A and C once per piece: sum(w x) = A * sum(f x) + C * sum(x), one FMA
// per weight and row of x. Dequantised alone (get_rows), w = fma(A, f, C) is exact for the types without
// a min (A and C are exact and so is w); for Q4_K / Q5_K, C = -(0.5 A + dmin * m) rounds once (about
// 2^-24 of 16 d*sc). Q8_0's codes (q + 128) need all 8 bits: they go to byte 1 (f = 0.5 + c/65536) and
// its pieces are not factored -- the GEMV takes w = fma(A, f, C), exact, since 0.5 A would cancel 7 bits.
#pragma once
#include "compat.cuh"

// ggml_type ids (ggml.h).
#define FS_T_F32 0
#define FS_T_F16 1
#define FS_T_Q4_0 2
#define FS_T_Q5_0 6
#define FS_T_Q8_0 8
#define FS_T_Q4_K 12
#define FS_T_Q5_K 13
#define FS_T_Q6_K 14
#define FS_T_BF16 30

#ifndef FS_PIECE
#error "FS_PIECE is not defined: compile with the -D defines of app/engine/kernels/runtime.py"
#endif
static_assert(FS_PIECE == 16, "a piece decoder turns 16 weights (4 quarters of 4) into floats");

// Block layouts (bytes), from ggml-common.h:
//   Q4_0  (32 w, 18 B): f16 d | u8 qs[16]                  w[j] = d*((qs[j]&15)-8), w[j+16] = d*((qs[j]>>4)-8)
//   Q5_0  (32 w, 22 B): f16 d | u8 qh[4] | u8 qs[16]       as Q4_0 with bit j of qh (u32 LE) as bit 4, minus 16
//   Q8_0  (32 w, 34 B): f16 d | i8 qs[32]                  w[j] = d*qs[j]
//   Q4_K (256 w, 144 B): f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//        sub-block s (32 w) = nibble s&1 of qs[32*(s/2) .. +32]; w = d*sc[s]*q - dmin*m[s], 6-bit sc/m packed
//   Q5_K (256 w, 176 B): f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]   bit s of qh[l] is bit 4
//   Q6_K (256 w, 210 B): u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
//        element 128h + 32k + l: low 4 bits = nibble k>>1 of ql[64h + 32(k&1) + l], high 2 bits =
//        bits 2k..2k+1 of qh[32h + l]; w = d*scales[8h + 2k + l/16]*(q - 32)

template <int T>
struct FsQuant;

// f16 -> f32 in one instruction on CUDA (compat.cuh's portable version branches on subnormals).
__device__ __forceinline__ float fs_h2f(u16 h) {
#if FS_HIP
    return fs_half_to_float(h);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
}

__device__ __forceinline__ float fs_ld_half(const u8* p) { return fs_h2f(*(const u16*)p); }

__device__ __forceinline__ uint4 fs_ld_u128(const u8* p) { return *(const uint4*)p; }

// Loads. Blocks of Q4_0/Q5_0/Q8_0/Q6_K are only 2-byte aligned (18/22/34/210 bytes); their fields are read
// as aligned words and funnel-shifted, which may read up to 2 bytes past the field: every buffer they
// read from (the device weight, the staging buffers) has at least 16 bytes of slack at its end.
// Four words from a 2-byte aligned address. The aligned pointer is derived from p by pointer arithmetic,
// so a pointer into shared memory stays one (shared loads, not generic ones).
__device__ __forceinline__ void fs_ld_words4_a2(const u8* p, u32 out[4]) {
    const u32 mis = (u32)(unsigned long long)p & 2u;
    const u32* base = (const u32*)(p - mis);
    u32 w[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) w[i] = base[i];
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = __funnelshift_r(w[i], w[i + 1], mis * 8u);
}

__device__ __forceinline__ u32 fs_ld_word_a2(const u8* p) {
    const u32 mis = (u32)(unsigned long long)p & 2u;
    const u32* base = (const u32*)(p - mis);
    return __funnelshift_r(base[0], base[1], mis * 8u);
}

// Rotate left by n (0..31): moves a field of every byte to the same place in one instruction; the bits
// that wrap around are masked off by the callers.
__device__ __forceinline__ u32 fs_rotl(u32 v, u32 n) { return __funnelshift_l(v, v, n); }

// Byte e of `word` as f = 0.5 + byte/256 (byte 2 of the float) or 0.5 + byte/65536 (byte 1).
template <int PLACE>
__device__ __forceinline__ float fs_magic(u32 word, int e) {
    const u32 sel = PLACE == 2 ? (0x7044u | ((u32)e << 8)) : (0x7404u | ((u32)e << 4));
    return __uint_as_float(__byte_perm(word, 0x3F000000u, sel));
}

// One piece as codes: weight e of quarter q (elements 4q + e) is fma(A, magic(code[q], e), C).
// FACTORED: the GEMV sums magic(code) * x and applies A and C per piece (codes < 128, byte 2).
template <int PLACE>
struct FsCodedPiece {
    static constexpr int FACTORED = PLACE == 2;
    u32 code[4];
    float A, C;
    __device__ __forceinline__ float code_value(int q, int e) const { return fs_magic<PLACE>(code[q], e); }
    __device__ __forceinline__ float weight(int q, int e) const { return fmaf(A, code_value(q, e), C); }
};

// Q4_K / Q5_K 6-bit scale and min of sub-block s from the 12 packed bytes (three little-endian words),
// without branching on s (the lanes of a warp hold different s):
//   s < 4:  sc = scales[s] & 63,                               m = scales[s + 4] & 63
//   s >= 4: sc = scales[s + 4] & 15 | (scales[s - 4] >> 6) << 4, m = scales[s + 4] >> 4 | (scales[s] >> 6) << 4
__device__ __forceinline__ void fs_k_scale_min(u32 q0, u32 q1, u32 q2, int s, int& sc, int& m) {
    const u32 j8 = 8u * (u32)(s & 3);
    const u32 b0 = (q0 >> j8) & 0xFFu, b1 = (q1 >> j8) & 0xFFu, b2 = (q2 >> j8) & 0xFFu;
    const bool high = s >= 4;
    const u32 sc_low = high ? (b2 & 0xFu) : (b0 & 63u);
    const u32 m_low = high ? (b2 >> 4) : (b1 & 63u);
    const u32 top = high ? 0x30u : 0u;
    sc = (int)(sc_low | ((b0 >> 2) & top));
    m = (int)(m_low | ((b1 >> 2) & top));
}

template <>
struct FsQuant<FS_T_Q4_0> {
    static constexpr int QK = 32, TS = 18, STAGED = 1;
    typedef FsCodedPiece<2> Piece;
    // codes = v << 3; w = d*(v - 8) = 32d * (0.5 + 8v/256) - 24d, exact.
    static __device__ __forceinline__ void load(Piece& pc, const u8* blk, int sub) {
        const float d = fs_ld_half(blk);
        u32 qs[4];
        fs_ld_words4_a2(blk + 2, qs);
#pragma unroll
        for (int i = 0; i < 4; ++i) pc.code[i] = fs_rotl(qs[i], sub ? 31u : 3u) & 0x78787878u;
        pc.A = 32.0f * d;
        pc.C = -24.0f * d;
    }
};

template <>
struct FsQuant<FS_T_Q5_0> {
    static constexpr int QK = 32, TS = 22, STAGED = 1;
    typedef FsCodedPiece<2> Piece;
    // codes = v << 2 (5-bit v); w = d*(v - 16) = 64d * (0.5 + 4v/256) - 48d, exact.
    static __device__ __forceinline__ void load(Piece& pc, const u8* blk, int sub) {
        const float d = fs_ld_half(blk);
        const u32 qh = fs_ld_word_a2(blk + 2) >> (16 * sub);
        u32 qs[4];
        fs_ld_words4_a2(blk + 6, qs);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 low = fs_rotl(qs[i], sub ? 30u : 2u) & 0x3C3C3C3Cu;
            // bits 4i..4i+3 of qh to bit 6 of bytes 0..3: the four shifted copies land on distinct bits.
            const u32 high = (((qh >> (4 * i)) & 0xFu) * 0x08102040u) & 0x40404040u;
            pc.code[i] = low | high;
        }
        pc.A = 64.0f * d;
        pc.C = -48.0f * d;
    }
};

template <>
struct FsQuant<FS_T_Q8_0> {
    static constexpr int QK = 32, TS = 34, STAGED = 1;
    typedef FsCodedPiece<1> Piece;
    // codes = q + 128 (flip the sign bit); w = d*q = 65536d * (0.5 + c/65536) - 32896d, exact.
    static __device__ __forceinline__ void load(Piece& pc, const u8* blk, int sub) {
        const float d = fs_ld_half(blk);
        u32 qs[4];
        fs_ld_words4_a2(blk + 2 + 16 * sub, qs);
#pragma unroll
        for (int i = 0; i < 4; ++i) pc.code[i] = qs[i] ^ 0x80808080u;
        pc.A = 65536.0f * d;
        pc.C = -32896.0f * d;
    }
};

template <>
struct FsQuant<FS_T_Q4_K> {
    static constexpr int QK = 256, TS = 144, STAGED = 1;
    typedef FsCodedPiece<2> Piece;
    // piece sub (0..15) = sub-block s = sub/2, half h = sub&1; codes = v << 3;
    // w = d*sc*v - dmin*m = 32 d sc * (0.5 + 8v/256) - (16 d sc + dmin m).
    static __device__ __forceinline__ void load(Piece& pc, const u8* blk, int sub) {
        const uint4 head = fs_ld_u128(blk);  // d | dmin, scales[0..3], scales[4..7], scales[8..11]
        const int s = sub >> 1;
        const uint4 qs = fs_ld_u128(blk + 16 + 32 * (s >> 1) + 16 * (sub & 1));
        const u32 q[4] = {qs.x, qs.y, qs.z, qs.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) pc.code[i] = fs_rotl(q[i], (s & 1) ? 31u : 3u) & 0x78787878u;
        int sc, m;
        fs_k_scale_min(head.y, head.z, head.w, s, sc, m);
        const float d = fs_h2f((u16)(head.x & 0xFFFFu));
        const float dmin = fs_h2f((u16)(head.x >> 16));
        const float dsc = d * (float)sc;
        pc.A = 32.0f * dsc;
        pc.C = fmaf(-dmin, (float)m, -16.0f * dsc);
    }
};

template <>
struct FsQuant<FS_T_Q5_K> {
    static constexpr int QK = 256, TS = 176, STAGED = 1;
    typedef FsCodedPiece<2> Piece;
    // codes = v << 2 (5-bit v); w = 64 d sc * (0.5 + 4v/256) - (32 d sc + dmin m).
    static __device__ __forceinline__ void load(Piece& pc, const u8* blk, int sub) {
        const uint4 head = fs_ld_u128(blk);
        const int s = sub >> 1, h = sub & 1;
        const uint4 hv = fs_ld_u128(blk + 16 + 16 * h);
        const uint4 qv = fs_ld_u128(blk + 48 + 32 * (s >> 1) + 16 * h);
        const u32 qh[4] = {hv.x, hv.y, hv.z, hv.w};
        const u32 qs[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 low = fs_rotl(qs[i], (s & 1) ? 30u : 2u) & 0x3C3C3C3Cu;
            const u32 high = fs_rotl(qh[i], (u32)(6 - s) & 31u) & 0x40404040u;  // bit s -> bit 6
            pc.code[i] = low | high;
        }
        int sc, m;
        fs_k_scale_min(head.y, head.z, head.w, s, sc, m);
        const float d = fs_h2f((u16)(head.x & 0xFFFFu));
        const float dmin = fs_h2f((u16)(head.x >> 16));
        const float dsc = d * (float)sc;
        pc.A = 64.0f * dsc;
        pc.C = fmaf(-dmin, (float)m, -32.0f * dsc);
    }
};

template <>
struct FsQuant<FS_T_Q6_K> {
    static constexpr int QK = 256, TS = 210, STAGED = 1;
    typedef FsCodedPiece<2> Piece;
    // piece sub = 8h + 2k + l0/16 (elements 128h + 32k + l0 + [0, 16)), whose scale is scales[sub];
    // codes = v << 1 (6-bit v); w = d*sc*(v - 32) = 128 d sc * (0.5 + 2v/256) - 96 d sc, exact.
    static __device__ __forceinline__ void load(Piece& pc, const u8* blk, int sub) {
        const int h = sub >> 3, k = (sub >> 1) & 3, l0 = 16 * (sub & 1);
        u32 ql[4], qh[4];
        fs_ld_words4_a2(blk + 64 * h + 32 * (k & 1) + l0, ql);
        fs_ld_words4_a2(blk + 128 + 32 * h + l0, qh);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 low = fs_rotl(ql[i], (k >> 1) ? 29u : 1u) & 0x1E1E1E1Eu;
            const u32 high = fs_rotl(qh[i], (u32)(5 - 2 * k) & 31u) & 0x60606060u;  // bits 2k, 2k+1 -> 5, 6
            pc.code[i] = low | high;
        }
        const float dsc = fs_ld_half(blk + 208) * (float)(int)(signed char)blk[192 + sub];
        pc.A = 128.0f * dsc;
        pc.C = -96.0f * dsc;
    }
};

// Float types: "blocks" of 16 elements, read straight from the weight (16-byte aligned: in % 16 == 0).
struct FsF32Piece {
    static constexpr int FACTORED = 0;
    uint4 raw[4];
    __device__ __forceinline__ float weight(int q, int e) const {
        const u32 v = e == 0 ? raw[q].x : e == 1 ? raw[q].y : e == 2 ? raw[q].z : raw[q].w;
        return __uint_as_float(v);
    }
};

template <int BF16>
struct FsHalfPiece {
    static constexpr int FACTORED = 0;
    uint4 raw[2];
    __device__ __forceinline__ float weight(int q, int e) const {
        const uint4 r = raw[q >> 1];
        const u32 v = (q & 1) ? (e < 2 ? r.z : r.w) : (e < 2 ? r.x : r.y);
        const u16 bits = (u16)((e & 1) ? (v >> 16) : (v & 0xFFFFu));
        return BF16 ? fs_bf16_to_float(bits) : fs_h2f(bits);
    }
};

template <>
struct FsQuant<FS_T_F32> {
    static constexpr int QK = 16, TS = 64, STAGED = 0;
    typedef FsF32Piece Piece;
    static __device__ __forceinline__ void load(Piece& pc, const u8* blk, int) {
#pragma unroll
        for (int i = 0; i < 4; ++i) pc.raw[i] = fs_ld_u128(blk + 16 * i);
    }
};

template <>
struct FsQuant<FS_T_F16> {
    static constexpr int QK = 16, TS = 32, STAGED = 0;
    typedef FsHalfPiece<0> Piece;
    static __device__ __forceinline__ void load(Piece& pc, const u8* blk, int) {
        pc.raw[0] = fs_ld_u128(blk);
        pc.raw[1] = fs_ld_u128(blk + 16);
    }
};

template <>
struct FsQuant<FS_T_BF16> {
    static constexpr int QK = 16, TS = 32, STAGED = 0;
    typedef FsHalfPiece<1> Piece;
    static __device__ __forceinline__ void load(Piece& pc, const u8* blk, int) {
        pc.raw[0] = fs_ld_u128(blk);
        pc.raw[1] = fs_ld_u128(blk + 16);
    }
};

// Piece p of a row (elements 16p .. 16p + 15): its block and its index inside the block.
template <int T>
__device__ __forceinline__ void fs_piece_place(int p, int& block, int& sub) {
    constexpr int SUBS = FsQuant<T>::QK / FS_PIECE;
    block = p / SUBS;
    sub = p % SUBS;
}
