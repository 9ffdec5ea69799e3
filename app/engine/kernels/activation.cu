// Element-wise kernels of the MLP and the residual stream: gated activations, add, scale.
//
// Gate and up are two pointers with one row stride, so they may be separate [n, ff] arrays (stride ff) or
// the two halves of one [n, 2 * ff] buffer (up = gate + ff, stride 2 * ff). ggml's formulas:
// silu(x) = x / (1 + e^-x); gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
// The _q8 entry points also write out quantised for mmvq.cu (q8.cuh), the down projection's input: ff % 32
// == 0, so the 32 consecutive threads of each block of 32 columns are all there.
#include "compat.cuh"
#include "q8.cuh"

#define FS_SQRT_2_OVER_PI 0.79788456080286535587989211986876f
#define FS_GELU_COEF_A 0.044715f

__device__ __forceinline__ float fs_silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float fs_gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(FS_SQRT_2_OVER_PI * x * (1.0f + FS_GELU_COEF_A * x * x)));
}

// out: [n, ff] = silu(gate) * up. grid (ceil(ff / 256), n), block (256).
extern "C" __global__ void silu_gate_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                         float* __restrict__ out, i32 ff, i32 in_stride) {
    const i32 col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= ff) return;
    const i64 in = (i64)blockIdx.y * in_stride + col;
    out[(i64)blockIdx.y * ff + col] = fs_silu(gate[in]) * up[in];
}

// out: [n, ff] = gelu_tanh(gate) * up. grid (ceil(ff / 256), n), block (256).
extern "C" __global__ void gelu_tanh_gate_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                              float* __restrict__ out, i32 ff, i32 in_stride) {
    const i32 col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= ff) return;
    const i64 in = (i64)blockIdx.y * in_stride + col;
    out[(i64)blockIdx.y * ff + col] = fs_gelu_tanh(gate[in]) * up[in];
}

// silu_gate_f32, out also quantised: xq [n, ff], xd [n, ff / 32], xs [n, ff / 16].
extern "C" __global__ void silu_gate_q8_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                            float* __restrict__ out, i32 ff, i32 in_stride, i8* xq, float* xd,
                                            float* xs) {
    const i32 col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= ff) return;
    const i64 in = (i64)blockIdx.y * in_stride + col, row = (i64)blockIdx.y * ff;
    const float v = fs_silu(gate[in]) * up[in];
    out[row + col] = v;
    fs_q8_element(v, row + col, xq, xd, xs);
}

// gelu_tanh_gate_f32, out also quantised, as silu_gate_q8_f32.
extern "C" __global__ void gelu_tanh_gate_q8_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                                 float* __restrict__ out, i32 ff, i32 in_stride, i8* xq,
                                                 float* xd, float* xs) {
    const i32 col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= ff) return;
    const i64 in = (i64)blockIdx.y * in_stride + col, row = (i64)blockIdx.y * ff;
    const float v = fs_gelu_tanh(gate[in]) * up[in];
    out[row + col] = v;
    fs_q8_element(v, row + col, xq, xd, xs);
}

// out = a + b over count elements (out may be a or b). grid (ceil(count / 256)), block (256).
extern "C" __global__ void add_f32(const float* a, const float* b, float* out, i32 count) {
    const i32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = a[i] + b[i];
}

// out = x * s over count elements (out may be x). grid (ceil(count / 256)), block (256).
extern "C" __global__ void scale_f32(const float* x, float* out, float s, i32 count) {
    const i32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = x[i] * s;
}
