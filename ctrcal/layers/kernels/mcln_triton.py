"""Fused MC-LayerNorm in Triton, registered as ``torch.library`` ops.

One forward and one backward kernel serve both shapes of the layer:

* the **row** layer: ``x [R, N]`` with one affine pair ``weight/bias [N]`` (``groups = 1``);
* the **grouped** (per-field) layer: ``x [B, G, D]`` seen as ``B * G`` rows of width ``D``,
  row ``b * G + g`` taking field ``g``'s affine pair ``weight/bias [G, D]`` (``groups = G``),
  so the F embedding fields of a batch are normalised in one launch.

Subset of a row (exactly k of N, uniform): every element gets 64 Philox bits keyed by the
seed and its flat position ``row * N + col``, and the k elements with the smallest keys form
the subset. They are split off by a threshold on the high 32-bit words, searched per row by
interpolation on the counts below the probes (a handful of probes; bisection after
:data:`_INTERPOLATED` of them guarantees the end); only when several elements share the k-th
smallest high word and some but not all of them are needed (about ``N^2 * 2^-33`` per row)
does the low word decide among them, and then (about 2^-64 per pair) the column index. The
forward stores each row's subset as a bit mask (``ceil(N / 8)`` bytes per row, 1/32 of a
float32 row) for the backward, so the backward neither regenerates the random bits nor
searches again; the per-row mean and 1/std (float32) are saved too. Statistics and gradients
accumulate in float32 whatever the input dtype (float32, bfloat16, float16); the output has
the input's dtype.

The seed lives in a one-element int64 tensor on the input's device, so drawing it needs no
host synchronisation, and ``torch.compile`` graphs keep the ops (fake implementations give
shapes, ``register_autograd`` the backward).

On CUDA tensors the kernels are compiled by Triton; on CPU tensors they run only under
Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is imported), which is how the
tests check them on machines without a GPU. Without triton installed this module still
imports (:data:`HAVE_TRITON` is False) and every caller takes another path.
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import Tensor

try:  # triton is optional: CPU installs work without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised by a test that hides the package
    triton = None
    tl = None

HAVE_TRITON = triton is not None
"""Whether triton imported."""

MAX_WIDTH = 8192
"""Widest row (N, or D per field) one program normalises; wider rows take the torch path."""

_TILE_ELEMENTS = 2048  # elements of one program's tile (rows x padded width) on a GPU
# The interpreter pays per operation, not per element: large tiles make its runs short. The
# results do not depend on the tiling (random bits are keyed by row and column).
_INTERPRETER_TILE_ELEMENTS = 1 << 16
_state: dict[str, object] = {"broken": None}


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_usable(device: torch.device, width: int) -> bool:
    """Whether the Triton kernels can normalise rows of ``width`` on ``device``.

    True for CUDA tensors (or CPU tensors under the interpreter) when triton imported, the
    width fits one program (:data:`MAX_WIDTH`), and no launch has failed in this process.
    """
    if not HAVE_TRITON or _state["broken"] is not None or width > MAX_WIDTH:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpreting()


def mark_broken(error: BaseException) -> None:
    """Record that Triton cannot run here: warn once; later calls take the torch path."""
    if _state["broken"] is None:
        _state["broken"] = f"{type(error).__name__}: {error}"
        warnings.warn(
            f"MC-LayerNorm's Triton kernel failed ({_state['broken'][:300]}); "
            "using the pure-torch path from now on",
            stacklevel=3,
        )


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _tiles(rows: int, groups: int, width: int, device: torch.device) -> tuple[int, int, int, int]:
    """Block sizes (SB samples x GB groups rows, NB columns) and num_warps of one program."""
    budget = _TILE_ELEMENTS if device.type == "cuda" else _INTERPRETER_TILE_ELEMENTS
    nb = max(8, _next_pow2(width))  # at least one byte of the packed subset mask
    gb = 1 if groups == 1 else min(_next_pow2(groups), 8)
    sb = max(1, budget // (gb * nb))
    samples = max(1, rows // groups)
    sb = min(sb, _next_pow2(samples))
    tile = sb * gb * nb
    warps = 4 if tile <= 2048 else (8 if tile <= 4096 else 16)
    return sb, gb, nb, warps


if HAVE_TRITON:
    # Right shifts of the two random words, 0 in use; tests raise them (under the
    # interpreter, which reads globals at run time) to force the rare tie-breaking branches.
    _HI_SHIFT = tl.constexpr(0)
    _LO_SHIFT = tl.constexpr(0)
    # Interpolated probes of the threshold search before it falls back to bisection.
    _INTERPOLATED = tl.constexpr(6)

    @triton.jit
    def _threshold(vals, valid, need, total):
        """Per row, a t in [0, 2^32) with #(valid & vals <= t) == need where one exists, else
        the smallest t with #(valid & vals <= t) >= need (vals uint32, total = #valid).

        A search on the value range that stops for a row as soon as a probe splits off
        exactly ``need`` values. Each probe interpolates inside the row's bracket [lo, hi]
        from the counts at its ends (the values are uniform, so the need-th smallest lies
        near ``lo + (hi - lo) * (need - count_lo) / (count_hi - count_lo)``): an exact split
        needs the probe between the need-th and the next value, a gap of about 2^32 / N,
        which interpolation reaches in a few probes where bisection takes about log2(N) + 2.
        From probe :data:`_INTERPOLATED` on, probes bisect, so every row ends (ties
        included) within 32 more; the loop ends when every row of the tile is done.
        """
        lo = tl.zeros((vals.shape[0],), dtype=tl.int64)
        hi = lo + 0xFFFFFFFF
        c_lo = tl.zeros((vals.shape[0],), dtype=tl.int32)
        c_hi = total
        t = hi
        found = lo != 0
        active = lo == 0
        probe = 0
        while tl.max(active.to(tl.int32), axis=0) > 0:
            share = ((need - c_lo).to(tl.float32) - 0.5) / tl.maximum(c_hi - c_lo, 1).to(tl.float32)
            guess = lo + ((hi - lo).to(tl.float32) * share).to(tl.int64)
            mid = tl.where(probe < _INTERPOLATED, guess, (lo + hi) >> 1)
            mid = tl.minimum(tl.maximum(mid, lo), tl.maximum(hi - 1, lo))
            below = valid & (vals <= mid.to(tl.uint32)[:, None])
            count = tl.sum(below.to(tl.int32), axis=1)
            exact = active & (count == need)
            t = tl.where(exact, mid, t)
            found = found | exact
            over = active & (count > need)
            under = active & (count < need)
            hi = tl.where(over, mid, hi)
            c_hi = tl.where(over, count, c_hi)
            lo = tl.where(under, mid + 1, lo)
            c_lo = tl.where(under, count, c_lo)
            active = active & ~exact & (lo < hi)
            probe += 1
        # rows without an exact split converged on the need-th smallest value (a tie there)
        return tl.where(found, t, lo).to(tl.uint32)

    @triton.jit
    def _subset(seed, rows, cols, n, k):
        """Boolean [RB, NB]: each row's k smallest of N keys of 64 Philox bits (exactly k).

        A threshold on the high words splits off exactly k elements (:func:`_threshold`);
        only when several elements share the k-th smallest high word and some but not all
        of them are needed (rare) does the low word decide among them, and then (about
        2^-64 per pair) the column index.
        """
        offsets = rows[:, None] * n + cols[None, :]
        c0, c1, _, _ = tl.randint4x(seed, offsets)
        hi = c0.to(tl.uint32, bitcast=True) >> _HI_SHIFT
        lo = c1.to(tl.uint32, bitcast=True) >> _LO_SHIFT
        valid = (cols < n)[None, :] & (rows >= 0)[:, None]
        t_hi = _threshold(hi, valid, k, tl.sum(valid.to(tl.int32), axis=1))
        below = tl.sum((valid & (hi < t_hi[:, None])).to(tl.int32), axis=1)
        tie = valid & (hi == t_hi[:, None])
        need = k - below
        ties = tl.sum(tie.to(tl.int32), axis=1)
        extra = ties - need
        sel = valid & (hi <= t_hi[:, None])
        if tl.max(extra, axis=0) > 0:
            t_lo = _threshold(lo, tie, need, ties)
            below_lo = tl.sum((tie & (lo < t_lo[:, None])).to(tl.int32), axis=1)
            tie_lo = tie & (lo == t_lo[:, None])
            rank = tl.cumsum(tie_lo.to(tl.int32), axis=1)
            pick = (tie & (lo < t_lo[:, None])) | (tie_lo & (rank <= (need - below_lo)[:, None]))
            sel = tl.where(extra[:, None] > 0, (valid & (hi < t_hi[:, None])) | pick, sel)
        return sel

    @triton.jit
    def _mcln_fwd_kernel(
        X,
        W,
        B,
        Y,
        MEAN,
        RSTD,
        BITS,
        SEED,
        samples,
        groups,
        n,
        nbytes,
        k,
        eps,
        HAS_W: tl.constexpr,
        HAS_B: tl.constexpr,
        FULL: tl.constexpr,
        SB: tl.constexpr,
        GB: tl.constexpr,
        NB: tl.constexpr,
    ):
        seed = tl.load(SEED)
        i = tl.arange(0, SB * GB)
        s = tl.program_id(0) * SB + i // GB
        g = tl.program_id(1) * GB + i % GB
        cols = tl.arange(0, NB)
        row_ok = (s < samples) & (g < groups)
        rows = s.to(tl.int64) * groups + g
        ok = row_ok[:, None] & (cols[None, :] < n)
        at = rows[:, None] * n + cols[None, :]
        x = tl.load(X + at, mask=ok, other=0.0).to(tl.float32)
        if FULL:  # LayerNorm: no random bits, no search
            sel = ok
        else:
            sel = _subset(seed, rows, cols, n, k)
        mean = tl.sum(tl.where(sel, x, 0.0), axis=1) / k
        xc = x - mean[:, None]
        var = tl.sum(tl.where(sel, xc * xc, 0.0), axis=1) / k
        var = tl.where(row_ok, var, 1.0)  # padding rows stay finite
        rstd = 1.0 / tl.sqrt(var + eps)
        y = xc * rstd[:, None]
        wat = g[:, None] * n + cols[None, :]
        if HAS_W:
            y = y * tl.load(W + wat, mask=ok, other=0.0).to(tl.float32)
        if HAS_B:
            y = y + tl.load(B + wat, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + at, y.to(Y.dtype.element_ty), mask=ok)
        tl.store(MEAN + rows, mean, mask=row_ok)
        tl.store(RSTD + rows, rstd, mask=row_ok)
        # the subset for the backward, 8 columns a byte (bit c % 8 of byte c // 8)
        bits = tl.reshape(sel.to(tl.int32), (SB * GB, NB // 8, 8))
        packed = tl.sum(bits << tl.arange(0, 8)[None, None, :], axis=2)
        cb = tl.arange(0, NB // 8)
        tl.store(
            BITS + rows[:, None] * nbytes + cb[None, :],
            packed.to(tl.uint8),
            mask=row_ok[:, None] & (cb < nbytes)[None, :],
        )

    @triton.jit
    def _mcln_bwd_kernel(
        DY,
        X,
        W,
        MEAN,
        RSTD,
        BITS,
        DX,
        DW,
        DB,
        samples,
        groups,
        n,
        nbytes,
        k,
        HAS_W: tl.constexpr,
        SB: tl.constexpr,
        GB: tl.constexpr,
        NB: tl.constexpr,
    ):
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        i = tl.arange(0, SB * GB)
        g = tl.program_id(1) * GB + i % GB
        cols = tl.arange(0, NB)
        col_ok = cols[None, :] < n
        wat = g[:, None] * n + cols[None, :]
        w_ok = (g < groups)[:, None] & col_ok
        if HAS_W:
            w = tl.load(W + wat, mask=w_ok, other=0.0).to(tl.float32)
        dw = tl.zeros((SB * GB, NB), dtype=tl.float32)
        db = tl.zeros((SB * GB, NB), dtype=tl.float32)
        for start in range(pid * SB, samples, programs * SB):
            s = start + i // GB
            row_ok = (s < samples) & (g < groups)
            rows = s.to(tl.int64) * groups + g
            ok = row_ok[:, None] & col_ok
            at = rows[:, None] * n + cols[None, :]
            x = tl.load(X + at, mask=ok, other=0.0).to(tl.float32)
            dy = tl.load(DY + at, mask=ok, other=0.0).to(tl.float32)
            mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)
            rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
            byte = tl.load(BITS + rows[:, None] * nbytes + (cols // 8)[None, :], mask=ok, other=0)
            sel = ((byte.to(tl.int32) >> (cols % 8)[None, :]) & 1) != 0
            xhat = (x - mean[:, None]) * rstd[:, None]
            xhat = tl.where(ok, xhat, 0.0)
            if HAS_W:
                gy = dy * w
            else:
                gy = dy
            a = tl.sum(gy, axis=1) / k
            c = tl.sum(gy * xhat, axis=1) / k
            dx = rstd[:, None] * (gy - tl.where(sel, a[:, None] + xhat * c[:, None], 0.0))
            tl.store(DX + at, dx.to(DX.dtype.element_ty), mask=ok)
            dw += dy * xhat
            db += dy
        # rows of the same group (field) share one affine pair: fold the SB samples together
        dw_part = tl.sum(tl.reshape(dw, (SB, GB, NB)), axis=0)
        db_part = tl.sum(tl.reshape(db, (SB, GB, NB)), axis=0)
        g2 = tl.program_id(1) * GB + tl.arange(0, GB)
        part_at = pid.to(tl.int64) * groups * n + g2[:, None] * n + cols[None, :]
        part_ok = (g2 < groups)[:, None] & col_ok
        tl.store(DW + part_at, dw_part, mask=part_ok)
        tl.store(DB + part_at, db_part, mask=part_ok)


if HAVE_TRITON:

    @triton.jit
    def _mask_kernel(MASK, SEED, rows_total, n, k, SB: tl.constexpr, NB: tl.constexpr):
        seed = tl.load(SEED)
        rows = tl.program_id(0) * SB + tl.arange(0, SB).to(tl.int64)
        cols = tl.arange(0, NB)
        ok = (rows < rows_total)[:, None] & (cols < n)[None, :]
        sel = _subset(seed, rows, cols, n, k)
        tl.store(MASK + rows[:, None] * n + cols[None, :], sel.to(tl.uint8), mask=ok)


def draw_seed(device: torch.device, generator: torch.Generator | None = None) -> Tensor:
    """The kernels' seed: one int64 in [0, 2^62) from torch's RNG, kept on ``device``."""
    gen_device = generator.device if generator is not None else device
    return torch.randint(0, 2**62, (1,), generator=generator, device=gen_device).to(device)


def subset_mask(rows: int, n: int, k: int, seed: Tensor) -> Tensor:
    """uint8 [rows, n]: the subsets the layer draws for rows 0..rows-1 of a groups=1 call
    (or rows ``b * G + g`` of a grouped call) with the same ``seed``."""
    mask = torch.empty(rows, n, dtype=torch.uint8, device=seed.device)
    if rows == 0:
        return mask
    sb, _, nb, warps = _tiles(rows, 1, n, seed.device)
    _mask_kernel[(triton.cdiv(rows, sb),)](mask, seed, rows, n, k, SB=sb, NB=nb, num_warps=warps)
    return mask


@torch.library.custom_op("ctrcal::mc_subset_mask", mutates_args=())
def mc_subset_mask(seed: Tensor, rows: int, n: int, k: int) -> Tensor:
    """uint8 [rows, n]: :func:`subset_mask` as an op that compiled graphs keep.

    A compiled graph can take the subsets from this op and run the statistics, the affine and
    their backward as ordinary tensor ops, which inductor fuses into the neighbouring
    operations (see :func:`ctrcal.layers.mc_layernorm.dispatch.compiled_mode`)."""
    return subset_mask(rows, n, k, seed)


@mc_subset_mask.register_fake
def _(seed, rows, n, k):
    return seed.new_empty(rows, n, dtype=torch.uint8)


def _programs(device: torch.device, wanted: int) -> int:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(wanted, 4 * sms))
    return max(1, min(wanted, 4))  # the interpreter runs programs one after another


def _mask_bytes(n: int) -> int:
    return (n + 7) // 8


def _forward_impl(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    seed: Tensor,
    groups: int,
    k: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    rows, n = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(rows, device=x.device, dtype=torch.float32)
    rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
    bits = torch.empty(rows, _mask_bytes(n), device=x.device, dtype=torch.uint8)
    if rows == 0:
        return y, mean, rstd, bits
    samples = rows // groups
    sb, gb, nb, warps = _tiles(rows, groups, n, x.device)
    grid = (triton.cdiv(samples, sb), triton.cdiv(groups, gb))
    _mcln_fwd_kernel[grid](
        x,
        weight if weight is not None else x,
        bias if bias is not None else x,
        y,
        mean,
        rstd,
        bits,
        seed,
        samples,
        groups,
        n,
        _mask_bytes(n),
        k,
        eps,
        HAS_W=weight is not None,
        HAS_B=bias is not None,
        FULL=k == n,
        SB=sb,
        GB=gb,
        NB=nb,
        num_warps=warps,
    )
    return y, mean, rstd, bits


def _backward_impl(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    bits: Tensor,
    groups: int,
    k: int,
) -> tuple[Tensor, Tensor, Tensor]:
    rows, n = x.shape
    dx = torch.empty_like(x)
    samples = rows // groups
    if rows == 0:
        zeros = torch.zeros(groups, n, device=x.device, dtype=torch.float32)
        return dx, zeros, zeros.clone()
    sb, gb, nb, warps = _tiles(rows, groups, n, x.device)
    programs = _programs(x.device, triton.cdiv(samples, sb))
    dw = torch.empty(programs, groups, n, device=x.device, dtype=torch.float32)
    db = torch.empty(programs, groups, n, device=x.device, dtype=torch.float32)
    grid = (programs, triton.cdiv(groups, gb))
    _mcln_bwd_kernel[grid](
        dy,
        x,
        weight if weight is not None else x,
        mean,
        rstd,
        bits,
        dx,
        dw,
        db,
        samples,
        groups,
        n,
        _mask_bytes(n),
        k,
        HAS_W=weight is not None,
        SB=sb,
        GB=gb,
        NB=nb,
        num_warps=warps,
    )
    return dx, dw.sum(0), db.sum(0)


# ---------------------------------------------------------------------------------------------
# torch.library ops: opaque to torch.compile (kept in the graph), differentiable


@torch.library.custom_op("ctrcal::mc_layer_norm_fwd", mutates_args=())
def mc_layer_norm_fwd(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    seed: Tensor,
    groups: int,
    k: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fused forward on x [R, N] (R = samples * groups): (y [R, N], mean [R], rstd [R],
    the subsets as bits [R, ceil(N / 8)] uint8)."""
    return _forward_impl(x, weight, bias, seed, groups, k, eps)


@mc_layer_norm_fwd.register_fake
def _(x, weight, bias, seed, groups, k, eps):
    rows, n = x.shape
    stats = x.new_empty(rows, dtype=torch.float32)
    bits = x.new_empty(rows, _mask_bytes(n), dtype=torch.uint8)
    return torch.empty_like(x), stats, stats.clone(), bits


@torch.library.custom_op("ctrcal::mc_layer_norm_bwd", mutates_args=())
def mc_layer_norm_bwd(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    mean: Tensor,
    rstd: Tensor,
    bits: Tensor,
    groups: int,
    k: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Fused backward: (dx [R, N], dweight [G, N] float32, dbias [G, N] float32)."""
    return _backward_impl(dy, x, weight, mean, rstd, bits, groups, k)


@mc_layer_norm_bwd.register_fake
def _(dy, x, weight, mean, rstd, bits, groups, k):
    n = x.shape[1]
    part = x.new_empty(groups, n, dtype=torch.float32)
    return torch.empty_like(x), part, part.clone()


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _seed, groups, k, _eps = inputs
    _y, mean, rstd, bits = output
    ctx.save_for_backward(x, weight, mean, rstd, bits)
    ctx.groups, ctx.k = groups, k
    ctx.has_bias = bias is not None
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _backward(ctx, dy, _dmean, _drstd, _dbits):
    x, weight, mean, rstd, bits = ctx.saved_tensors
    dx, dw, db = mc_layer_norm_bwd(dy.contiguous(), x, weight, mean, rstd, bits, ctx.groups, ctx.k)
    return (
        dx,
        dw.to(weight.dtype) if weight is not None else None,
        db.to(ctx.bias_dtype) if ctx.has_bias else None,
        None,
        None,
        None,
        None,
    )


mc_layer_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


def triton_mc_layer_norm(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    groups: int,
    k: int,
    eps: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    """MC-LayerNorm of x [R, N] with weight/bias [groups, N] (row r uses group r % groups).

    The caller checks :func:`triton_usable` first. Returns y [R, N] in x's dtype.
    """
    n = x.shape[1]
    # the full set (LayerNorm) draws nothing: torch's RNG stream stays as it was
    if k < n:
        seed = draw_seed(x.device, generator)
    else:
        seed = torch.zeros(1, dtype=torch.int64, device=x.device)
    x = x.contiguous()
    w = weight.reshape(groups, -1).contiguous() if weight is not None else None
    b = bias.reshape(groups, -1).contiguous() if bias is not None else None
    y, _mean, _rstd, _bits = mc_layer_norm_fwd(x, w, b, seed, groups, k, float(eps))
    return y
