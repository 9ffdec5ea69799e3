"""A NumPy port of mmvq.cu and qdot.cuh: the activation quantiser, the bytes each lane reads,
the masks and shifts that make its codes, the integer dots and the float operations in the kernel's order
(lane by lane, then the group butterfly, then the warps in order)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.kernels import mmvq
from tests.support.byte_reads import half, u16, u32, u128

Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K = 2, 6, 8, 12, 13, 14
FLT_MAX = np.float32(3.4028234663852886e38)
M8 = np.uint64(0xFF)


def _f32(value: Any) -> np.ndarray:
    return np.asarray(value, dtype=np.float32)


def _fma(a: Any, b: Any, c: Any) -> np.ndarray:
    """fmaf: an exact product (two float32 fit a float64), the sum rounded to float64, then to float32 (the
    double rounding differs from one fmaf in rare last bits)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(
        np.float32
    )


# --- fs_quantize_q8 ------------------------------------------------------------------------------------
def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [n, in] float32 -> (xq int8 [n, in], xd float32 [n, in / 32], xs float32 [n, in / 16])."""
    n, n_in = x.shape
    blocks = np.asarray(x, dtype=np.float32).reshape(n, n_in // 32, 32)
    a = np.abs(blocks)
    finite = np.all(a <= FLT_MAX, axis=-1)  # NaN compares false
    amax = np.where(finite, np.max(np.where(finite[..., None], a, 0), axis=-1), 0).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(finite, amax / np.float32(127.0), np.float32(np.nan)).astype(np.float32)
        inv = np.where(finite & (amax > 0), np.float32(127.0) / amax, np.float32(0)).astype(np.float32)
        scaled = np.where(finite[..., None], blocks * inv[..., None], 0).astype(np.float32)
    q = np.where(finite[..., None], np.clip(np.rint(scaled), -127, 127), 0).astype(np.int64)
    sums = q.reshape(n, n_in // 32, 2, 16).sum(axis=-1)
    with np.errstate(over="ignore"):  # dx near the float maximum: xs is infinite there, as on the GPU
        xs = (d[..., None] * sums.astype(np.float32)).astype(np.float32)
    return q.astype(np.int8).reshape(n, n_in), d, xs.reshape(n, n_in // 16)


def dequantized(xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """x^ = dx * xq, exactly (float64)."""
    n, n_in = xq.shape
    return (xq.reshape(n, -1, 32).astype(np.float64) * xd[..., None].astype(np.float64)).reshape(n, n_in)


# --- reads (tests/support/byte_reads.py) --------------------------------------------------------------
def _bytes(words: list[np.ndarray]) -> np.ndarray:
    """Four u32 words -> their 16 bytes as signed codes [..., 16] (dp4a takes bytes as signed)."""
    parts = [((w >> np.uint64(8 * e)) & M8) for w in words for e in range(4)]
    return np.stack(parts, axis=-1).astype(np.uint8).view(np.int8).astype(np.int64)


def _k_scale_min(q0: np.ndarray, q1: np.ndarray, q2: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, ...]:
    """fs_k_scale_min for an array of sub-block indices s."""
    s = s.astype(np.uint64)
    j8 = np.uint64(8) * (s & np.uint64(3))
    b0, b1, b2 = ((q >> j8) & M8 for q in (q0, q1, q2))
    high = s >= 4
    sc_low = np.where(high, b2 & np.uint64(0xF), b0 & np.uint64(63))
    m_low = np.where(high, b2 >> np.uint64(4), b1 & np.uint64(63))
    top = np.where(high, np.uint64(0x30), np.uint64(0))
    two = np.uint64(2)
    return (sc_low | ((b0 >> two) & top)).astype(np.int64), (m_low | ((b1 >> two) & top)).astype(np.int64)


@dataclass
class Chunk:
    """FsQdotWeights of chunks: codes of groups 0 and 1 [..., 16] and the float factors [...]."""

    v0: np.ndarray
    v1: np.ndarray
    a0: np.ndarray
    a1: np.ndarray
    m0: np.ndarray
    m1: np.ndarray


LO4 = np.uint64(0x0F0F0F0F)


def _k_chunk(ggml_type: int, buf: np.ndarray, nblk: int, row: np.ndarray, k: np.ndarray) -> Chunk:
    ts = 144 if ggml_type == Q4_K else 176
    blk, j = k // 8, k % 8
    b = (row * nblk + blk) * ts
    head = u128(buf, b)
    s = 2 * (j >> 1)
    if ggml_type == Q4_K:
        qs = u128(buf, b + 16 + 16 * j)
    else:
        qh = u128(buf, b + 16 + 16 * (j & 1))
        qs = u128(buf, b + 48 + 16 * j)
    v0 = [q & LO4 for q in qs]
    v1 = [(q >> np.uint64(4)) & LO4 for q in qs]
    if ggml_type == Q5_K:
        su = s.astype(np.uint64)
        one = np.uint64(0x01010101)
        v0 = [v | (((h >> su) & one) << np.uint64(4)) for v, h in zip(v0, qh, strict=True)]
        v1 = [v | (((h >> (su + np.uint64(1))) & one) << np.uint64(4)) for v, h in zip(v1, qh, strict=True)]
    sc0, mn0 = _k_scale_min(head[1], head[2], head[3], s)
    sc1, mn1 = _k_scale_min(head[1], head[2], head[3], s + 1)
    d, dmin = half(head[0] & np.uint64(0xFFFF)), half(head[0] >> np.uint64(16))
    return Chunk(
        _bytes(v0), _bytes(v1),
        _f32(d * sc0.astype(np.float32)), _f32(d * sc1.astype(np.float32)),
        -_f32(dmin * mn0.astype(np.float32)), -_f32(dmin * mn1.astype(np.float32)),
    )  # fmt: skip


def _q6_k_chunk(buf: np.ndarray, n_out: int, nblk: int, row: np.ndarray, k: np.ndarray) -> Chunk:
    blocks = n_out * nblk
    p1 = mmvq._align16(blocks * 128)
    p2 = p1 + mmvq._align16(blocks * 64)
    p3 = p2 + mmvq._align16(blocks * 16)
    blk, j = k // 8, k % 8
    at = row * nblk + blk
    h, kk, hh = j >> 2, (j >> 1) & 1, j & 1
    lo = u128(buf, at * 128 + 16 * j)
    hi = u128(buf, p1 + at * 64 + 32 * h + 16 * hh)
    sc_x, sc_y = u32(buf, p2 + at * 16 + 8 * h), u32(buf, p2 + at * 16 + 8 * h + 4)
    d = half(u16(buf, p3 + at * 2))
    kk64 = kk.astype(np.uint64)
    m30 = np.uint64(0x30303030)
    v0 = [
        (a & LO4) | ((b << (np.uint64(4) - np.uint64(2) * kk64)) & m30) for a, b in zip(lo, hi, strict=True)
    ]
    v1 = [
        ((a >> np.uint64(4)) & LO4) | ((b >> (np.uint64(2) * kk64)) & m30)
        for a, b in zip(lo, hi, strict=True)
    ]
    shift = np.uint64(8) * (np.uint64(2) * kk64 + hh.astype(np.uint64))
    sc0 = ((sc_x >> shift) & M8).astype(np.uint8).view(np.int8).astype(np.float32)
    sc1 = ((sc_y >> shift) & M8).astype(np.uint8).view(np.int8).astype(np.float32)
    a0, a1 = _f32(d * sc0), _f32(d * sc1)
    return Chunk(_bytes(v0), _bytes(v1), a0, a1, _f32(np.float32(-32.0) * a0), _f32(np.float32(-32.0) * a1))


OFFSETS = {Q8_0: 0.0, Q4_0: 8.0, Q5_0: 16.0}


def _b32_chunk(
    ggml_type: int, buf: np.ndarray, n_out: int, nblk: int, row: np.ndarray, k: np.ndarray
) -> Chunk:
    qs_size = 32 if ggml_type == Q8_0 else 16
    qh_size = 4 if ggml_type == Q5_0 else 0
    blocks = n_out * nblk
    p1 = mmvq._align16(blocks * qh_size)
    p2 = p1 + mmvq._align16(blocks * qs_size)
    at = row * nblk + k
    qs = u128(buf, p1 + at * qs_size)
    d = half(u16(buf, p2 + at * 2))
    if ggml_type == Q8_0:
        v0, v1 = qs, u128(buf, p1 + at * qs_size + 16)
    else:
        v0 = [q & LO4 for q in qs]
        v1 = [(q >> np.uint64(4)) & LO4 for q in qs]
    if ggml_type == Q5_0:
        qh = u32(buf, at * 4)
        spread, m10 = np.uint64(0x02040810), np.uint64(0x10101010)
        nib = np.uint64(0xF)
        v0 = [v | ((((qh >> np.uint64(4 * i)) & nib) * spread) & m10) for i, v in enumerate(v0)]
        v1 = [v | ((((qh >> np.uint64(16 + 4 * i)) & nib) * spread) & m10) for i, v in enumerate(v1)]
    m = _f32(np.float32(-OFFSETS[ggml_type]) * d)
    return Chunk(_bytes(v0), _bytes(v1), d, d, m, m)


def chunk(ggml_type: int, buf: np.ndarray, shape: tuple[int, int], row: np.ndarray, k: np.ndarray) -> Chunk:
    """FsQdot<T>::locate + fetch + decode of chunk k of row `row` (arrays of one shape) of a packed weight."""
    n_out, n_in = shape
    nblk = n_in // (256 if ggml_type in (Q4_K, Q5_K, Q6_K) else 32)
    row, k = np.asarray(row, np.int64), np.asarray(k, np.int64)
    if ggml_type in (Q4_K, Q5_K):
        return _k_chunk(ggml_type, buf, nblk, row, k)
    if ggml_type == Q6_K:
        return _q6_k_chunk(buf, n_out, nblk, row, k)
    return _b32_chunk(ggml_type, buf, n_out, nblk, row, k)


def chunk_elements(ggml_type: int, k: np.ndarray) -> tuple[np.ndarray, int]:
    """FsQdot<T>::load_x: the first element of group 0 of chunk k, and the gap to group 1."""
    if ggml_type in (Q4_K, Q5_K):
        blk, j = k // 8, k % 8
        return blk * 256 + 64 * (j >> 1) + 16 * (j & 1), 32
    if ggml_type == Q6_K:
        blk, j = k // 8, k % 8
        return blk * 256 + 128 * (j >> 2) + 32 * ((j >> 1) & 1) + 16 * (j & 1), 64
    return k * 32, 16


def chunk_weights(ggml_type: int, c: Chunk, k: np.ndarray, n_in: int) -> np.ndarray:
    """The weights a chunk's codes and factors stand for (w = a q + m per group, in float64), placed in rows
    [..., n_in] of zeros."""
    e0, gap = chunk_elements(ggml_type, k)
    out = np.zeros((*np.shape(k), n_in))
    idx = np.arange(16)
    for v, a, m, e in ((c.v0, c.a0, c.m0, e0), (c.v1, c.a1, c.m1, e0 + gap)):
        w = a.astype(np.float64)[..., None] * v + m.astype(np.float64)[..., None]
        np.put_along_axis(out, e[..., None] + idx, w, axis=-1)
    return out


# --- fs_mmvq --------------------------------------------------------------------------------------------
def _dot(ggml_type: int, c: Chunk, xq0: np.ndarray, xq1: np.ndarray, dx0, dx1, xs0, xs1, acc) -> np.ndarray:
    """FsQdot<T>::dot over broadcast arrays."""
    d0 = np.sum(c.v0 * xq0, axis=-1)
    d1 = np.sum(c.v1 * xq1, axis=-1)
    if ggml_type in (Q8_0, Q4_0, Q5_0):
        acc = _fma(c.a0, _f32(dx0 * (d0 + d1).astype(np.float32)), acc)
        if ggml_type != Q8_0:
            acc = _fma(c.m0, _f32(xs0 + xs1), acc)
        return acc
    acc = _fma(c.a0, _f32(dx0 * d0.astype(np.float32)), acc)
    acc = _fma(c.a1, _f32(dx1 * d1.astype(np.float32)), acc)
    acc = _fma(c.m0, xs0, acc)
    return _fma(c.m1, xs1, acc)


def simulate_mmvq(
    packed: np.ndarray,
    ggml_type: int,
    shape: tuple[int, int],
    qx: tuple[np.ndarray, np.ndarray, np.ndarray],
    warps: int,
    rows: np.ndarray | None = None,
    lanes: int = mmvq.LANES,
) -> np.ndarray:
    """fs_mmvq for the given output rows: y [b, len(rows)] float32 (no bias, no accumulate)."""
    n_out, n_in = shape
    xq, xd, xs = qx
    n_b = xq.shape[0]
    rows = np.arange(n_out) if rows is None else np.asarray(rows)
    n_chunks = n_in // mmvq.CHUNK
    stride = lanes * warps
    acc = np.zeros((n_b, len(rows), warps, lanes), dtype=np.float32)
    lane = np.arange(lanes)[None, :]
    warp = np.arange(warps)[:, None]
    idx = np.arange(16)
    for i in range(-(-n_chunks // stride)):
        k = lane + lanes * (warp + warps * i)  # [warps, lanes]
        valid = k < n_chunks
        k = np.where(valid, k, 0)
        c = chunk(ggml_type, packed, shape, rows[:, None, None], np.broadcast_to(k, (len(rows), *k.shape)))
        e0, gap = chunk_elements(ggml_type, k)
        e1 = e0 + gap
        for bi in range(n_b):
            xq0 = xq[bi][e0[..., None] + idx].astype(np.int64)
            xq1 = xq[bi][e1[..., None] + idx].astype(np.int64)
            new = _dot(
                ggml_type, c, xq0, xq1, xd[bi][e0 >> 5], xd[bi][e1 >> 5], xs[bi][e0 >> 4], xs[bi][e1 >> 4],
                acc[bi],
            )  # fmt: skip
            acc[bi] = np.where(valid, new, acc[bi])
    for m in (4, 2, 1):  # the group butterfly
        acc = (acc + acc[..., np.arange(lanes) ^ m]).astype(np.float32)
    s = acc[..., 0, 0]
    for w in range(1, warps):
        s = (s + acc[..., w, 0]).astype(np.float32)
    return s


# --- fs_mmvq_tc -----------------------------------------------------------------------------------------
def element_codes(
    packed: np.ndarray, ggml_type: int, shape: tuple[int, int], rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every weight of the rows as (code, A, M) [rows, in] through the chunk decoder: w = A code + M."""
    n_in = shape[1]
    n_chunks = n_in // mmvq.CHUNK
    k = np.broadcast_to(np.arange(n_chunks), (len(rows), n_chunks))
    c = chunk(ggml_type, packed, shape, np.broadcast_to(rows[:, None], k.shape), k)
    e0, gap = chunk_elements(ggml_type, k)
    code = np.zeros((len(rows), n_in), np.int64)
    a = np.zeros((len(rows), n_in), np.float32)
    m = np.zeros((len(rows), n_in), np.float32)
    idx = np.arange(16)
    r = np.arange(len(rows))[:, None, None]
    for v, fa, fm, e in ((c.v0, c.a0, c.m0, e0), (c.v1, c.a1, c.m1, e0 + gap)):
        cols = e[..., None] + idx
        code[r, cols] = v
        a[r, cols] = fa[..., None]
        m[r, cols] = fm[..., None]
    return code, a, m


def tc_groups(ggml_type: int, step: int) -> list[tuple[int, int]]:
    """FsTc<T>: the (first element, length) of each group of a step, in the kernel's order."""
    blk = step >> 2
    if ggml_type == Q4_K:
        c = step & 3
        return [(blk * 256 + 64 * c + 32 * gi, 32) for gi in range(2)]
    h, hh = (step >> 1) & 1, step & 1
    return [(blk * 256 + 128 * h + 32 * k + 16 * hh, 16) for k in range(4)]


def simulate_mmvq_tc(
    packed: np.ndarray,
    ggml_type: int,
    shape: tuple[int, int],
    qx: tuple[np.ndarray, np.ndarray, np.ndarray],
    warps: int,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """fs_mmvq_tc for the given output rows: y [b, len(rows)] float32 (no bias, no accumulate)."""
    n_out, n_in = shape
    xq, xd, xs = qx
    rows = np.arange(n_out) if rows is None else np.asarray(rows)
    code, a, m = element_codes(packed, ggml_type, shape, rows)
    xq64 = xq.astype(np.int64)
    parts = []
    for w in range(warps):
        acc = np.zeros((xq.shape[0], len(rows)), np.float32)
        for step in range(w, n_in // mmvq.TC_STEP, warps):
            for e, size in tc_groups(ggml_type, step):
                dot = xq64[:, e : e + size] @ code[:, e : e + size].T  # [b, rows], exact
                dx = xd[:, e >> 5][:, None]
                xsum = (
                    (xs[:, e >> 4] + xs[:, (e >> 4) + 1]).astype(np.float32) if size == 32 else xs[:, e >> 4]
                )
                acc = _fma(a[:, e][None, :], _f32(dx * dot.astype(np.float32)), acc)
                acc = _fma(m[:, e][None, :], xsum[:, None], acc)
        parts.append(acc)
    total = parts[0]
    for p in parts[1:]:
        total = (total + p).astype(np.float32)
    return total
