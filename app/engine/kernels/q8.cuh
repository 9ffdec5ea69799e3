// Activations quantised for the int8 GEMV (mmvq.cu), by whichever kernel writes them: per block of 32
// elements of a row of x, dx = amax / 127, codes xq = rint(x * (127 / amax)) in [-127, 127] (so |x - dx xq|
// <= dx / 2 but for float rounding) and xs = dx * (the sum of each 16 codes). A block holding a NaN or an
// infinity gets dx = xs = NaN and codes 0, so what it enters is NaN, as in float. For a row of n_in: xq
// [n_in] int8, xd [n_in / 32], xs [n_in / 16] (QuantizedRows in app/engine/kernels/mmvq.py).
#pragma once
#include "compat.cuh"

// The block of 32 elements that 32 consecutive lanes (a warp, or half of a wave64) hold, one element each,
// lane32 = the element's index in the block; every one of the 32 lanes calls this. xq, xd, xs point at
// the block's codes, its scale and its two sums.
__device__ __forceinline__ void fs_q8_block(float v, int lane32, i8* __restrict__ xq, float* __restrict__ xd,
                                            float* __restrict__ xs) {
    const float a = fabsf(v);
    float amax = a;
    int bad = a <= 3.40282346638528859812e+38f ? 0 : 1;  // NaN compares false
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        amax = fmaxf(amax, FS_SHFL_XOR(amax, m));
        bad |= FS_SHFL_XOR(bad, m);
    }
    const float d = bad ? __int_as_float(0x7fc00000) : __fdiv_rn(amax, 127.0f);
    const float id = !bad && amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const int q = bad ? 0 : min(127, max(-127, __float2int_rn(__fmul_rn(v, id))));
    int sum = q;
#pragma unroll
    for (int m = 8; m > 0; m >>= 1) sum += FS_SHFL_XOR(sum, m);  // over the 16 lanes of this half
    xq[lane32] = (i8)q;
    if (lane32 == 0) *xd = d;
    if ((lane32 & 15) == 0) xs[lane32 >> 4] = __fmul_rn(d, (float)sum);
}

// Element i of a row of x quantised into the row's xq, xd, xs: lanes i .. i + 31 (i % 32 == lane32) must be
// 32 consecutive lanes calling together.
__device__ __forceinline__ void fs_q8_element(float v, i64 i, i8* __restrict__ xq, float* __restrict__ xd,
                                              float* __restrict__ xs) {
    const i64 blk = i >> 5;
    fs_q8_block(v, (int)(i & 31), xq + blk * 32, xd + blk, xs + 2 * blk);
}
