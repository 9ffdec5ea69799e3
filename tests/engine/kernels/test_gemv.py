# Over 500 lines: every weight type of gemv.cu through its port and on the device, sharing the port.
"""Quantised GEMV and get_rows (gemv.cu via app.engine.kernels.gemv) against gguf's dequantisation.

CPU tests (no marker) run a NumPy port of the kernels -- the same byte offsets, aligned-word reads and
funnel shifts, byte permutes, FMAs, staging windows, lane order and butterfly sum -- over random blocks
and the real tensors of gemma-3-270m, against `gguf.quants.dequantize`. GPU tests (marked `gpu`, skipped
without CuPy and a device) run the kernels themselves over a table of shapes.

Tolerances:
- dequantised weights: exact for F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q6_K (one exact FMA per weight); Q4_K
  and Q5_K within 2^-22 of each sub-block's scale d*sc (the FMA's constant rounds once).
- GEMV: |y - y_ref| <= 1e-5 * |W[o]| * |x[b]| per output (float32 lane sums of in/32 terms and a 32-way
  butterfly vs float64: typically ~1e-6 of that bound), y_ref from float64 products of the dequantised W.
- the same output row for b = 1 and any other b: bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from app.catalog.gguf import read_file
from app.engine.kernels import gemv, quant, runtime
from tests.support.byte_reads import half, u8, u16, u32, u128
from tests.support.gpu_marks import cupy, gpu_test

F32, F16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 6, 8, 12, 13, 14, 30
ALL_TYPES = (Q4_K, Q5_0, Q6_K, Q8_0, F16, F32, Q5_K, BF16, Q4_0)
MIN_TYPES = (Q4_0, Q5_0, Q8_0, Q6_K)  # no min: decoded bit for bit
WARP = 32
STEP = WARP * 16  # elements of a row per warp step (FS_GEMV_STEP)
GEMV_PF = runtime.KERNEL_CONSTANTS["FS_GEMV_PF"]  # staging buffers per warp


def _name(ggml_type: int) -> str:
    return quant.TYPES[ggml_type].name


# --- random weights with sane scales ----------------------------------------------------------------------
def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def random_weight(ggml_type: int, shape: tuple[int, int], seed: int) -> np.ndarray:
    """Random blocks [out, bytes per row]: every quant bit random, f16 scales small and normal."""
    rng = np.random.default_rng(seed)
    n_out, n_in = shape
    t = quant.TYPES[ggml_type]
    if ggml_type == F32:
        return rng.standard_normal(shape, dtype=np.float32).view(np.uint8)
    if ggml_type == F16:
        return rng.standard_normal(shape).astype(np.float16).view(np.uint8)
    if ggml_type == BF16:
        bits = rng.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, size=(n_out, n_in // t.block, t.type_size), dtype=np.uint8)
    scale = np.abs(rng.normal(0.02, 0.01, size=blocks.shape[:2])) + 1e-4
    if ggml_type in (Q4_0, Q5_0, Q8_0):
        blocks[..., 0:2] = _f16_bytes(scale)
    elif ggml_type in (Q4_K, Q5_K):
        blocks[..., 0:2] = _f16_bytes(scale / 16)
        blocks[..., 2:4] = _f16_bytes(np.abs(rng.normal(0.0, 0.01, size=scale.shape)))
    elif ggml_type == Q6_K:
        blocks[..., 208:210] = _f16_bytes(scale / 64)
    return blocks.reshape(n_out, -1)


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> np.ndarray:
    """gguf's dequantisation of [out, bytes per row] blocks: the ground truth."""
    rows = np.ascontiguousarray(raw).reshape(shape[0], -1)
    if ggml_type == F32:
        return rows.view(np.float32).reshape(shape)
    return gguf_dequantize(rows, GGMLQuantizationType(ggml_type)).reshape(shape)


def reference_matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.astype(np.float64).T


def assert_gemv_close(y: np.ndarray, y_ref: np.ndarray, w: np.ndarray, x: np.ndarray) -> None:
    bound = (
        1e-5
        * np.linalg.norm(x.astype(np.float64), axis=1)[:, None]
        * np.linalg.norm(w.astype(np.float64), axis=1)[None, :]
    )
    err = np.abs(y.astype(np.float64) - y_ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert np.all(err <= bound), (
        f"at (b, o) = {worst}: {y[worst]} vs {y_ref[worst]} (bound {bound[worst]:.3g})"
    )


# --- NumPy port of quant.cuh and gemv.cu ---------------------------------------------------
U32 = np.uint64(0xFFFFFFFF)


@dataclass(frozen=True)
class Layout:
    qk: int  # elements per block as the kernel sees it (float types: 16)
    ts: int  # bytes per block
    staged: bool


LAYOUTS = {
    F32: Layout(16, 64, False),
    F16: Layout(16, 32, False),
    BF16: Layout(16, 32, False),
    Q4_0: Layout(32, 18, True),
    Q5_0: Layout(32, 22, True),
    Q8_0: Layout(32, 34, True),
    Q4_K: Layout(256, 144, True),
    Q5_K: Layout(256, 176, True),
    Q6_K: Layout(256, 210, True),
}


def stage_geometry(ggml_type: int, warp: int = WARP) -> tuple[int, int, int]:
    """FsStage: bytes of a row per step, 16-byte chunks staged, bytes of a row's staging buffer."""
    lay = LAYOUTS[ggml_type]
    sb = lay.ts * (warp * 16 // lay.qk)
    nch = (sb + 14 + 15) // 16
    return sb, nch, nch * 16 + 16


def _funnel_r(lo: np.ndarray, hi: np.ndarray, shift: np.ndarray) -> np.ndarray:
    return ((lo | (hi << np.uint64(32))) >> shift.astype(np.uint64)) & U32


def _words4_a2(buf: np.ndarray, addr: np.ndarray) -> list[np.ndarray]:
    base = addr & ~3
    shift = (addr & 2) * 8
    w = [u32(buf, base + 4 * i) for i in range(5)]
    return [_funnel_r(w[i], w[i + 1], shift) for i in range(4)]


def _word_a2(buf: np.ndarray, addr: np.ndarray) -> np.ndarray:
    base = addr & ~3
    return _funnel_r(u32(buf, base), u32(buf, base + 4), (addr & 2) * 8)


def _f32(value: Any) -> np.ndarray:
    return np.asarray(value, dtype=np.float32)


def _fma(a: Any, b: Any, c: Any) -> np.ndarray:
    """fmaf: exact product (two float32 fit a float64), one rounding of the sum (to float64, then float32)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(
        np.float32
    )


def _byte_perm(x: np.ndarray, y: int, sel: int) -> np.ndarray:
    src = [(x >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)]
    src += [np.full_like(x, (y >> (8 * i)) & 0xFF) for i in range(4)]
    out = np.zeros_like(x)
    for n in range(4):
        out |= src[(sel >> (4 * n)) & 7] << np.uint64(8 * n)
    return out


def _magic(word: np.ndarray, e: int, place: int) -> np.ndarray:
    sel = (0x7044 | (e << 8)) if place == 2 else (0x7404 | (e << 4))
    return _byte_perm(word, 0x3F000000, sel).astype(np.uint32).view(np.float32)


def _scale_min(q0: np.ndarray, q1: np.ndarray, q2: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    j = np.uint64(8 * (s & 3))
    b0, b1, b2 = ((q >> j) & np.uint64(0xFF) for q in (q0, q1, q2))
    high = s >= 4
    sc_low = (b2 & np.uint64(0xF)) if high else (b0 & np.uint64(63))
    m_low = (b2 >> np.uint64(4)) if high else (b1 & np.uint64(63))
    top = np.uint64(0x30 if high else 0)
    two = np.uint64(2)
    return sc_low | ((b0 >> two) & top), m_low | ((b1 >> two) & top)


def _rotl(value: np.ndarray, n: int) -> np.ndarray:
    n %= 32
    return ((value << np.uint64(n)) | (value >> np.uint64((32 - n) % 32 if n else 0))) & U32


def _mask(value: np.ndarray, mask: int) -> np.ndarray:
    return value & np.uint64(mask)


@dataclass
class Piece:
    """A decoded piece: `values` [n, 16] are the weights, or for a factored piece the code values f with
    weight = A * f + C (the GEMV sums f * x and applies A and C per piece)."""

    values: np.ndarray
    a: np.ndarray | None = None
    c: np.ndarray | None = None

    @property
    def factored(self) -> bool:
        return self.a is not None

    def weights(self) -> np.ndarray:
        if self.a is None or self.c is None:
            return self.values
        return _fma(self.a[:, None], self.values, self.c[:, None])


def piece_decode(ggml_type: int, buf: np.ndarray, addr: np.ndarray, sub: int) -> Piece:
    """FsQuant<T>::load: piece `sub` of the block at buf[i, addr[i]:] for every i."""
    sh = np.uint64
    if ggml_type == F32:
        words = [w for q in _u128_pieces(buf, addr, 4) for w in q]
        return Piece(np.stack(words, axis=1).astype(np.uint32).view(np.float32))
    if ggml_type in (F16, BF16):
        words = [w for q in _u128_pieces(buf, addr, 2) for w in q]
        halves = [(w >> sh(16 * k)) & sh(0xFFFF) for w in words for k in (0, 1)]
        if ggml_type == F16:
            return Piece(np.stack([half(h) for h in halves], axis=1))
        return Piece(np.stack([(h << sh(16)).astype(np.uint32).view(np.float32) for h in halves], axis=1))
    if ggml_type == Q8_0:  # codes in byte 1, dequantised per weight (never factored)
        d = half(u16(buf, addr))
        code = [(q ^ sh(0x80808080)) & U32 for q in _words4_a2(buf, addr + 2 + 16 * sub)]
        f = np.stack([_magic(code[q], e, 1) for q in range(4) for e in range(4)], axis=1)
        return Piece(_fma(_f32(65536.0) * d[:, None], f, _f32(-32896.0) * d[:, None]))
    if ggml_type == Q4_0:
        d = half(u16(buf, addr))
        code = [_mask(_rotl(q, 31 if sub else 3), 0x78787878) for q in _words4_a2(buf, addr + 2)]
        a, c = _f32(32.0) * d, _f32(-24.0) * d
    elif ggml_type == Q5_0:
        d = half(u16(buf, addr))
        qh = _word_a2(buf, addr + 2) >> sh(16 * sub)
        code = []
        for i, q in enumerate(_words4_a2(buf, addr + 6)):
            low = _mask(_rotl(q, 30 if sub else 2), 0x3C3C3C3C)
            high = _mask(((qh >> sh(4 * i)) & sh(0xF)) * sh(0x08102040), 0x40404040)
            code.append(low | high)
        a, c = _f32(64.0) * d, _f32(-48.0) * d
    elif ggml_type in (Q4_K, Q5_K):
        head = u128(buf, addr)
        s, h = sub >> 1, sub & 1
        if ggml_type == Q4_K:
            qs = u128(buf, addr + 16 + 32 * (s >> 1) + 16 * h)
            code = [_mask(_rotl(q, 31 if s & 1 else 3), 0x78787878) for q in qs]
            k_a, k_c = 32.0, -16.0
        else:
            qh = u128(buf, addr + 16 + 16 * h)
            qs = u128(buf, addr + 48 + 32 * (s >> 1) + 16 * h)
            code = [
                _mask(_rotl(q, 30 if s & 1 else 2), 0x3C3C3C3C) | _mask(_rotl(hb, (6 - s) & 31), 0x40404040)
                for q, hb in zip(qs, qh, strict=True)
            ]
            k_a, k_c = 64.0, -32.0
        sc, m = _scale_min(head[1], head[2], head[3], s)
        d = half(head[0] & sh(0xFFFF))
        dmin = half(head[0] >> sh(16))
        dsc = d * sc.astype(np.float32)
        a = _f32(k_a) * dsc
        c = _fma(-dmin, m.astype(np.float32), _f32(k_c) * dsc)
    elif ggml_type == Q6_K:
        h, k, l0 = sub >> 3, (sub >> 1) & 3, 16 * (sub & 1)
        ql = _words4_a2(buf, addr + 64 * h + 32 * (k & 1) + l0)
        qh = _words4_a2(buf, addr + 128 + 32 * h + l0)
        code = [
            _mask(_rotl(lo, 29 if k >> 1 else 1), 0x1E1E1E1E) | _mask(_rotl(hi, (5 - 2 * k) & 31), 0x60606060)
            for lo, hi in zip(ql, qh, strict=True)
        ]
        scale = u8(buf, addr + 192 + sub).astype(np.uint8).view(np.int8).astype(np.float32)
        dsc = half(u16(buf, addr + 208)) * scale
        a, c = _f32(128.0) * dsc, _f32(-96.0) * dsc
    else:
        raise AssertionError(ggml_type)
    code = [q & U32 for q in code]
    assert all(np.all(q & sh(0x80808080) == 0) for q in code), "a code of 128 or more breaks f < 1"
    f = np.stack([_magic(code[q], e, 2) for q in range(4) for e in range(4)], axis=1)
    return Piece(f, _f32(a), _f32(c))


def piece_weights(ggml_type: int, buf: np.ndarray, addr: np.ndarray, sub: int) -> np.ndarray:
    """The 16 dequantised weights of a piece (get_rows: Piece::weight)."""
    return piece_decode(ggml_type, buf, addr, sub).weights()


def _u128_pieces(buf: np.ndarray, addr: np.ndarray, count: int) -> list[list[np.ndarray]]:
    return [u128(buf, addr + 16 * i) for i in range(count)]


def padded(raw: np.ndarray) -> np.ndarray:
    """The device allocation of DeviceWeight: the blocks, rounded up to 16 bytes, plus PAD_BYTES of zeros."""
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    out = np.zeros(-(-flat.size // 16) * 16 + quant.PAD_BYTES, dtype=np.uint8)
    out[: flat.size] = flat
    return out


def simulate_gemv(
    raw: np.ndarray, ggml_type: int, shape: tuple[int, int], x: np.ndarray, rows: np.ndarray | None = None
) -> np.ndarray:
    """fs_gemv for the given output rows: y [b, len(rows)], float32, in the kernel's order of operations."""
    n_out, n_in = shape
    lay = LAYOUTS[ggml_type]
    alloc = padded(raw)
    rows = np.arange(n_out) if rows is None else np.asarray(rows)
    row_bytes = n_in // lay.qk * lay.ts
    n_pieces = n_in // 16
    steps = -(-n_pieces // WARP)
    sb, nch, row_buf = stage_geometry(ggml_type)
    subs = lay.qk // 16
    garbage = np.random.default_rng(0).integers(0, 256, size=(len(rows), row_buf), dtype=np.uint8)
    acc = np.zeros((len(rows), WARP, x.shape[0]), dtype=np.float32)
    whole = np.broadcast_to(alloc, (len(rows), alloc.size))
    for s in range(steps):
        start = rows.astype(np.int64) * row_bytes + s * sb
        if lay.staged:  # fs_stage_issue / fs_stage_store: the 16-byte chunks covering the step, then slack
            window = garbage.copy()
            a0 = start & ~15
            for c in range(nch):
                a = a0 + 16 * c
                inside = a + 16 <= alloc.size
                idx = np.where(inside, a, 0)[:, None] + np.arange(16)[None, :]
                window[:, 16 * c : 16 * c + 16] = np.where(inside[:, None], alloc[idx], 0)
            offset = start & 15
            if ggml_type in (Q4_K, Q5_K):
                assert np.all(offset == 0)
        for lane in range(WARP):
            p = s * WARP + lane
            if p >= n_pieces:
                break
            blk, sub = divmod(lane, subs)
            if lay.staged:
                piece = piece_decode(ggml_type, window, offset + blk * lay.ts, sub)
            else:
                piece = piece_decode(ggml_type, whole, rows * row_bytes + p * lay.ts, sub)
            xs = x[:, 16 * p : 16 * p + 16]
            a = acc[:, lane, :]
            if piece.factored:  # fs_gemv_step: dot = sum f x, xsum = sum x (pairwise per float4)
                dot = np.zeros_like(a)
                xsum = np.zeros(x.shape[0], dtype=np.float32)
                for q in range(4):
                    xq = xs[:, 4 * q : 4 * q + 4]
                    xsum = (xsum + ((xq[:, 0] + xq[:, 1]) + (xq[:, 2] + xq[:, 3]))).astype(np.float32)
                    for e in range(4 * q, 4 * q + 4):
                        dot = _fma(piece.values[:, e, None], xs[None, :, e], dot)
                a = _fma(piece.a[:, None], dot, a)
                a = _fma(piece.c[:, None], xsum[None, :], a)
            else:
                for e in range(16):
                    a = _fma(piece.values[:, e, None], xs[None, :, e], a)
            acc[:, lane, :] = a
    m = WARP // 2
    while m:  # fs_warp_sum
        acc = (acc + acc[:, np.arange(WARP) ^ m, :]).astype(np.float32)
        m //= 2
    return acc[:, 0, :].T.copy()


# --- real tensors ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RealTensor:
    name: str
    ggml_type: int
    shape: tuple[int, int]
    raw: np.ndarray  # [out, bytes per row], memory-mapped


@cache
def gemma_tensors(path: Path) -> dict[int, RealTensor]:
    """One 2-D tensor of each type in the file (the smallest), memory-mapped."""
    header = read_file(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    found: dict[int, RealTensor] = {}
    for t in header.tensors:
        if len(t.shape) != 2 or t.type_id not in quant.TYPES:
            continue
        shape = (t.shape[1], t.shape[0])
        start = header.data_offset + t.offset
        raw = data[start : start + t.n_bytes].reshape(shape[0], -1)
        best = found.get(t.type_id)
        if best is None or raw.size < best.raw.size:
            found[t.type_id] = RealTensor(t.name, t.type_id, shape, raw)
    return found


# --- CPU tests ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=_name)
def test_piece_decoder_matches_gguf(ggml_type: int) -> None:
    lay = LAYOUTS[ggml_type]
    n_in = 512
    raw = random_weight(ggml_type, (8, n_in), seed=ggml_type)
    want = dequantize(raw, ggml_type, (8, n_in))
    alloc = padded(raw)
    flat = np.broadcast_to(alloc, (8, alloc.size))
    row_bytes = raw.shape[1]
    got = np.zeros_like(want)
    for p in range(n_in // 16):
        blk, sub = divmod(p, lay.qk // 16)
        got[:, 16 * p : 16 * p + 16] = piece_weights(
            ggml_type, flat, np.arange(8) * row_bytes + blk * lay.ts, sub
        )
    if ggml_type in (Q4_K, Q5_K):
        np.testing.assert_allclose(got, want, rtol=0, atol=float(np.abs(want).max()) * 2.0**-20)
    else:
        np.testing.assert_array_equal(got, want)


def test_stage_geometry_covers_every_alignment() -> None:
    for ggml_type, lay in LAYOUTS.items():
        if not lay.staged:
            continue
        sb, nch, row_buf = stage_geometry(ggml_type)
        assert sb % lay.ts == 0
        assert STEP % lay.qk == 0
        # the step's bytes at the worst 2-byte misalignment, plus the 2-byte over-read, fit the buffer
        assert 14 + sb <= 16 * nch
        assert 14 + sb + 2 <= row_buf


# NVIDIA (warps of 32) gives a block 48 KiB of shared memory without an opt-in; AMD a workgroup 64 KiB,
# for wave32 (RDNA) and wave64 (CDNA) alike.
@pytest.mark.parametrize(("warp", "budget"), [(32, 48 * 1024), (64, 64 * 1024)])
def test_the_staging_and_the_largest_x_tile_fit_shared_memory(warp: int, budget: int) -> None:
    warps = gemv.GEMV_THREADS // warp
    assert gemv.rows_per_block(warp) == warps * gemv.GEMV_RPW
    per_row = max(stage_geometry(t, warp)[2] for t, lay in LAYOUTS.items() if lay.staged)
    staging = GEMV_PF * warps * gemv.GEMV_RPW * per_row
    x_tile = max(rows * gemv.x_tile(rows, 18944, warp) * 4 for rows in range(1, gemv.MAX_BATCH + 1))
    assert staging + x_tile <= budget


def test_x_slots_are_a_conflict_free_permutation() -> None:
    def slot(i: np.ndarray) -> np.ndarray:  # fs_x_slot
        return i ^ ((i >> 3) & 3)

    index = np.arange(4096)
    assert sorted(slot(index)) == list(index)
    for q in range(4):  # a phase of 8 lanes reading float4 q of their pieces hits 8 bank groups
        for first in range(0, WARP, 8):
            lanes = np.arange(first, first + 8)
            assert len(set(slot(4 * lanes + q) % 8)) == 8


def test_x_tile() -> None:
    assert gemv.x_tile(1, 18944) == 4096
    assert gemv.x_tile(3, 18944) == 1024
    assert gemv.x_tile(8, 18944) == 512
    assert gemv.x_tile(1, 640) == 1024
    for rows in range(1, gemv.MAX_BATCH + 1):
        for n_in in (16, 640, 896, 18944):
            xt = gemv.x_tile(rows, n_in)
            assert xt % STEP == 0
            assert rows * xt * 4 <= gemv.X_TILE_BYTES


SIM_SHAPES = [(5, 256), (7, 640), (3, 1536), (4, 2304)]


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=_name)
@pytest.mark.parametrize("shape", SIM_SHAPES, ids=str)
def test_simulated_gemv_matches_reference(ggml_type: int, shape: tuple[int, int]) -> None:
    if shape[1] % quant.TYPES[ggml_type].block:
        pytest.skip("row length not a multiple of the block")
    raw = random_weight(ggml_type, shape, seed=shape[1] + ggml_type)
    x = np.random.default_rng(1).standard_normal((3, shape[1]), dtype=np.float32)
    w = dequantize(raw, ggml_type, shape)
    y = simulate_gemv(raw, ggml_type, shape, x)
    assert_gemv_close(y, reference_matmul(x, w), w, x)
    np.testing.assert_array_equal(simulate_gemv(raw, ggml_type, shape, x[1:2]), y[1:2])


def test_simulated_gemv_on_gemma(gemma_path: Path) -> None:
    tensors = gemma_tensors(gemma_path)
    assert {Q4_K, Q5_0, Q6_K, Q8_0} <= set(tensors)
    x_rng = np.random.default_rng(2)
    for t in tensors.values():
        if t.ggml_type == F32:
            continue
        # a few rows at both ends and in between: every alignment a row start takes repeats within 16 rows
        rows = np.unique(np.r_[0:20, t.shape[0] // 2 : t.shape[0] // 2 + 3, t.shape[0] - 20 : t.shape[0]])
        x = x_rng.standard_normal((2, t.shape[1]), dtype=np.float32)
        w = dequantize(t.raw[rows], t.ggml_type, (len(rows), t.shape[1]))
        y = simulate_gemv(t.raw, t.ggml_type, t.shape, x, rows)
        assert_gemv_close(y, reference_matmul(x, w), w, x)


def test_layout_errors_name_the_tensor() -> None:
    with pytest.raises(runtime.KernelError, match=r"blk\.0\.ffn_up\.weight: IQ2_XXS has no native kernel"):
        quant.check_layout("blk.0.ffn_up.weight", 16, (256, 256))
    with pytest.raises(
        runtime.KernelError, match=r"token_embd\.weight: row length 640 is not a multiple of 256"
    ):
        quant.check_layout("token_embd.weight", Q4_K, (8, 640))
    with pytest.raises(runtime.KernelError, match="expected a matrix"):
        quant.check_layout("output_norm.weight", F32, (640,))
    with pytest.raises(runtime.KernelError, match="bytes"):
        quant.check_layout("w", Q8_0, (2, 64), nbytes=100)
    assert quant.check_layout("w", Q8_0, (2, 64), nbytes=2 * 2 * 34).name == "Q8_0"


# --- GPU tests ---------------------------------------------------------------------------------------------
GPU_SHAPES = [(1, 256), (7, 512), (640, 2048), (1536, 8960), (2048, 640), (3584, 18944)]
BATCHES = (1, 2, 3, 5, 8, 16, 17)


@dataclass
class DeviceCase:
    weight: gemv.DeviceWeight
    w: np.ndarray  # dequantised, float32 [out, in]


@cache
def _device_case(ggml_type: int, shape: tuple[int, int]) -> DeviceCase:
    raw = random_weight(ggml_type, shape, seed=17 * shape[0] + shape[1] + ggml_type)
    weight = gemv.DeviceWeight(raw, ggml_type, shape, name=f"{_name(ggml_type)}{shape}")
    return DeviceCase(weight, dequantize(raw, ggml_type, shape))


def _gemv_cases() -> list[Any]:
    cases = []
    for ggml_type in ALL_TYPES:
        for shape in GPU_SHAPES:
            if shape[1] % quant.TYPES[ggml_type].block == 0:
                cases.append(pytest.param(ggml_type, shape, id=f"{_name(ggml_type)}-{shape[0]}x{shape[1]}"))
    return cases


@gpu_test
@pytest.mark.parametrize(("ggml_type", "shape"), _gemv_cases())
def test_gemv_matches_reference(ggml_type: int, shape: tuple[int, int]) -> None:
    case = _device_case(ggml_type, shape)
    x = np.random.default_rng(3).standard_normal((max(BATCHES), shape[1]), dtype=np.float32)
    x_dev = cupy.asarray(x)
    y_ref = reference_matmul(x, case.w)
    one = None
    for b in BATCHES:
        out = cupy.full((b, shape[0]), np.nan, dtype=cupy.float32)
        gemv.matmul(x_dev[:b], case.weight, out)
        y = cupy.asnumpy(out)
        assert_gemv_close(y, y_ref[:b], case.w, x[:b])
        if one is None:
            one = y[0]
        else:  # row 0 of y is the same whatever the batch: verify == decode
            np.testing.assert_array_equal(y[0], one)


@gpu_test
@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=_name)
@pytest.mark.parametrize("shape", [(40, 640), (33, 2304)], ids=str)
def test_gemv_is_the_simulated_kernel(ggml_type: int, shape: tuple[int, int]) -> None:
    """The device code computes what its NumPy port computes: bit for bit, but for the port's rare double
    rounding (its FMA sums in float64, then rounds to float32)."""
    if shape[1] % quant.TYPES[ggml_type].block:
        pytest.skip("row length not a multiple of the block")
    case = _device_case(ggml_type, shape)
    raw = random_weight(ggml_type, shape, seed=17 * shape[0] + shape[1] + ggml_type)
    x = np.random.default_rng(7).standard_normal((3, shape[1]), dtype=np.float32)
    out = cupy.zeros((3, shape[0]), dtype=cupy.float32)
    gemv.matmul(cupy.asarray(x), case.weight, out)
    got = cupy.asnumpy(out)
    want = simulate_gemv(raw, ggml_type, shape, x)
    assert_gemv_close(got, want.astype(np.float64), case.w, x)
    assert np.mean(got == want) >= 0.99, f"{np.mean(got != want):.2%} of outputs differ from the port"


@gpu_test
@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=_name)
def test_gemv_bias_and_accumulate(ggml_type: int) -> None:
    shape = (640, 2048)
    case = _device_case(ggml_type, shape)
    rng = np.random.default_rng(4)
    for b in (1, 5, 11):
        x = rng.standard_normal((b, shape[1]), dtype=np.float32)
        bias = rng.standard_normal(shape[0], dtype=np.float32)
        residual = rng.standard_normal((b, shape[0]), dtype=np.float32)
        y_ref = reference_matmul(x, case.w)
        out = cupy.asarray(residual)
        gemv.matmul(cupy.asarray(x), case.weight, out, bias=cupy.asarray(bias), accumulate=True)
        assert_gemv_close(cupy.asnumpy(out), y_ref + bias + residual, case.w, x)
        out = cupy.asarray(residual)
        gemv.matmul(cupy.asarray(x), case.weight, out, accumulate=True)
        assert_gemv_close(cupy.asnumpy(out), y_ref + residual, case.w, x)
        gemv.matmul(cupy.asarray(x), case.weight, out, bias=cupy.asarray(bias))
        assert_gemv_close(cupy.asnumpy(out), y_ref + bias, case.w, x)


@gpu_test
@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=_name)
def test_get_rows_matches_dequantize(ggml_type: int) -> None:
    shape = (640, 2048)
    case = _device_case(ggml_type, shape)
    ids = np.array([0, 5, 639, 5, 17, 320, 1], dtype=np.int32)
    out = cupy.full((len(ids), shape[1]), np.nan, dtype=cupy.float32)
    gemv.get_rows(case.weight, cupy.asarray(ids), out)
    if ggml_type in (Q4_K, Q5_K):  # the FMA's constant rounds once
        np.testing.assert_allclose(
            cupy.asnumpy(out), case.w[ids], rtol=0, atol=float(np.abs(case.w).max()) * 2.0**-20
        )
    else:
        np.testing.assert_array_equal(cupy.asnumpy(out), case.w[ids])
    bad = cupy.asarray(np.array([1, -1, 640], dtype=np.int32))
    out = cupy.zeros((3, shape[1]), dtype=cupy.float32)
    gemv.get_rows(case.weight, bad, out)
    got = cupy.asnumpy(out)
    np.testing.assert_array_equal(got[0], case.w[1])
    assert np.isnan(got[1:]).all()


@gpu_test
def test_real_gemma_tensors(gemma_path: Path) -> None:
    rng = np.random.default_rng(5)
    for t in gemma_tensors(gemma_path).values():
        weight = gemv.DeviceWeight(t.raw, t.ggml_type, t.shape, name=t.name)
        rows = np.r_[0 : min(t.shape[0], 4096)]  # the 262144-row embedding: its first rows
        w = dequantize(t.raw[rows], t.ggml_type, (len(rows), t.shape[1]))
        x = rng.standard_normal((5, t.shape[1]), dtype=np.float32)
        out = cupy.zeros((5, t.shape[0]), dtype=cupy.float32)
        gemv.matmul(cupy.asarray(x), weight, out)
        assert_gemv_close(cupy.asnumpy(out)[:, rows], reference_matmul(x, w), w, x)
        ids = np.array([0, len(rows) - 1, 3], dtype=np.int32)
        got = cupy.zeros((3, t.shape[1]), dtype=cupy.float32)
        gemv.get_rows(weight, cupy.asarray(ids), got)
        np.testing.assert_allclose(cupy.asnumpy(got), w[ids], rtol=0, atol=float(np.abs(w).max()) * 2.0**-20)


@gpu_test
def test_matmul_checks_its_arguments() -> None:
    case = _device_case(Q8_0, (7, 512))
    x = cupy.zeros((2, 512), dtype=cupy.float32)
    out = cupy.zeros((2, 7), dtype=cupy.float32)
    with pytest.raises(runtime.KernelError, match="x: shape"):
        gemv.matmul(cupy.zeros((2, 256), dtype=cupy.float32), case.weight, out)
    with pytest.raises(runtime.KernelError, match="out: dtype"):
        gemv.matmul(x, case.weight, cupy.zeros((2, 7), dtype=cupy.float16))
    with pytest.raises(runtime.KernelError, match="bias: shape"):
        gemv.matmul(x, case.weight, out, bias=cupy.zeros(8, dtype=cupy.float32))
    with pytest.raises(runtime.KernelError, match="expected a CuPy array"):
        gemv.matmul(np.zeros((2, 512), dtype=np.float32), case.weight, out)
    with pytest.raises(runtime.KernelError, match="ids: dtype"):
        gemv.get_rows(case.weight, cupy.zeros(2, dtype=cupy.int64), cupy.zeros((2, 512), dtype=cupy.float32))


@gpu_test
def test_matmul_in_a_cuda_graph() -> None:
    if runtime.is_hip():
        pytest.skip("graphs are captured on CUDA only")
    case = _device_case(Q4_K, (640, 2048))
    x = cupy.asarray(np.random.default_rng(6).standard_normal((3, 2048), dtype=np.float32))
    out = cupy.zeros((3, 640), dtype=cupy.float32)
    want = cupy.zeros_like(out)
    gemv.matmul(x, case.weight, want)  # compiles and warms up outside the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        gemv.matmul(x, case.weight, out)
        graph = stream.end_capture()
        graph.launch()
    stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(want))
