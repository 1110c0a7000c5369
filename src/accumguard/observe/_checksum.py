"""Cheap per-parameter gradient checksums and the gradient-conservation verdict.

A checksum of a gradient ``g`` is three numbers: ``sum(g)``, the sum over its even
flat positions, and ``sum(|g|)`` (the scale, for tolerances). The first two are
linear, so the checksum of a sum of contributions is the sum of their checksums;
two functionals, because a softmax output's gradient sums to zero over classes.

Conservation: the gradient the optimizer receives must be the sum of what the
window's backward passes contributed. A contribution is measured as
``checksum(after backward) - checksum(before backward)``; when nothing touches the
gradients between backward passes these telescope. A reset inside the window
(``zero_grad`` between micro-steps, an engine that overwrites at every backward)
shows as a *wipe*: the gradient before backward i differs from the one after
backward i-1. A wipe is an error only if the optimizer then receives the wiped
gradient and not the sum (an fp32 gradient-buffer pattern moves ``.grad`` aside
between backwards and puts the full sum back before the step: correct).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from accumguard.core.window import Conservation

__all__ = ["CONSERVATION_BUDGET", "FORCED_CHECKS", "Conservation", "checksums", "conservation",
           "grad_versions", "sampled"]

#: Fraction of a run's wall time the conservation checksums may take once the windows that
#: are always checked are done: the guard and the framework callbacks sample windows within
#: it (their bars are 2 % per step in total; the per-event hooks take about half).
CONSERVATION_BUDGET = 0.005
#: Windows checked whatever the budget after a zero_grad inside an unchecked window.
FORCED_CHECKS = 2


def sampled(step: int, every: int) -> bool:
    """Is window ``step`` the sampled one of its block of ``every``? Step 0 always. The phase
    moves back by one each block (0, 2N-1, 3N-2, ...), so a pattern whose period divides
    ``every`` (two optimizers taking turns, a bug every other window) is not always missed.
    Deterministic: every rank samples the same steps (the probe all-gathers on them)."""
    return every <= 1 or (step + step // every) % every == 0


def _local(g: torch.Tensor) -> torch.Tensor:
    to_local = getattr(g, "to_local", None)  # FSDP2 DTensor: this rank's shard
    return to_local() if callable(to_local) else g


# Parameters up to this size are checksummed in groups of equal size and dtype (one stacked
# tensor, three reductions per group instead of three per parameter: the per-op overhead, not
# the arithmetic, is the cost of a small model's checksums); a stacked group copies at most
# _GROUP_ELEMS elements. Larger parameters are reduced on their own (no copy).
_GROUP_MAX = 1 << 16
_GROUP_ELEMS = 1 << 22


@torch.no_grad()
def checksums(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[P, 3]`` float64 CPU: (sum, even-position sum, abs sum) of each ``.grad`` (0 if None)."""
    out = torch.zeros((len(params), 3), dtype=torch.float64)
    # grouped by size, dtype and device; a group of one shape is stacked as it is (no
    # per-parameter flatten), and nothing is detached (no_grad): a small model's cost is the
    # number of ops, not the arithmetic
    groups: dict[tuple[int, torch.dtype, torch.device], list[tuple[int, torch.Tensor]]] = {}
    single: list[tuple[int, torch.Tensor]] = []
    for i, p in enumerate(params):
        g = p.grad
        if g is None:
            continue
        f = g if type(g) is torch.Tensor else _local(g)  # (a plain tensor: no lookup)
        if f.layout != torch.strided:  # a sparse gradient (nn.Embedding(sparse=True))
            out[i] = _sparse_sums(f)
            continue
        n = f.numel()
        if n > _GROUP_MAX or n == 0:
            single.append((i, f.reshape(-1)))
        else:
            groups.setdefault((n, f.dtype, f.device), []).append((i, f))
    order: list[int] = []
    parts: list[torch.Tensor] = []
    for members in groups.values():
        if len(members) == 1:
            single += [(i, f.reshape(-1)) for i, f in members]
            continue
        per = max(2, _GROUP_ELEMS // members[0][1].numel())
        for c in range(0, len(members), per):
            chunk = members[c:c + per]
            same = all(f.shape == chunk[0][1].shape for _, f in chunk)
            m = torch.stack([f if same else f.reshape(-1) for _, f in chunk]
                            ).reshape(len(chunk), -1)
            # |g| summed directly: the L1-norm kernels are several times slower on CPU
            parts.append(torch.stack([m.sum(1), m[:, ::2].sum(1), m.abs().sum(1)], 1)
                         .to("cpu", torch.float64))
            order += [i for i, _ in chunk]
    if single:
        flats = [f for _, f in single]
        sums = torch.stack([f.sum() for f in flats] + [f[::2].sum() for f in flats]
                           + [f.abs().sum() for f in flats])
        parts.append(sums.to("cpu", torch.float64).reshape(3, -1).t())
        order += [i for i, _ in single]
    if parts:
        out[torch.tensor(order)] = torch.cat(parts)
    return out


def _sparse_sums(g: torch.Tensor) -> torch.Tensor:
    """The three sums of a sparse gradient, equal to those of its dense form: the values of
    the coalesced tensor (duplicate indices added, as the dense tensor does; a new tensor,
    the gradient is not changed) at their positions in the dense flat order."""
    c = (g if g.layout == torch.sparse_coo else g.to_sparse()).coalesce()
    v = c.values()
    nnz = int(v.shape[0])
    if nnz == 0:
        return torch.zeros(3, dtype=torch.float64)
    idx = c.indices()
    lin = torch.zeros(nnz, dtype=torch.int64, device=idx.device)
    for d in range(c.sparse_dim()):  # row-major index over the sparse dims
        lin = lin * int(c.shape[d]) + idx[d]
    flat = v.reshape(nnz, -1)
    dense = int(flat.shape[1])
    even = (lin[:, None] * dense + torch.arange(dense, device=idx.device)) % 2 == 0
    return torch.stack([flat.sum(), (flat * even).sum(), flat.abs().sum()]).to(
        "cpu", torch.float64)


def grad_versions(params: Sequence[torch.Tensor]) -> list[tuple[int, int] | None]:
    """Identity and in-place version of each ``.grad``: equal lists mean untouched grads,
    so a checksum need not be recomputed. A tensor subclass's version is no witness
    (FSDP2's DTensor ``.grad`` scaled in place by ``clip_grad_norm_`` keeps both its own
    and its local shard's version): it gets a mark that equals no other, so its checksum
    is always taken again."""
    return [None if (g := p.grad) is None else (id(g), int(g._version))
            if type(g) is torch.Tensor else (id(g), -next(_UNVERSIONED)) for p in params]


#: marks of ``.grad`` tensors whose in-place version cannot be trusted (never equal)
_UNVERSIONED = itertools.count(1)


#: A window whose gradient was moved out between its backwards and given back at the step
#: differs from the exact sum by at most this (relative: a bf16 buffer's rounding is
#: u*sqrt(K)/3, 0.0026 at K = 4, 0.026 at K = 512) and by at most this share of the mass
#: moved out; a clear that lost gradient differs by about that share.
RETURNED_MAX = 0.03
RETURNED_SHARE = 0.1


def lost_share(lost: float, starts: list[torch.Tensor], scale: float) -> float:
    """The share of the window's mass removed between backwards, net of a leftover."""
    if not starts:
        return lost
    return max(0.0, lost - float(starts[0][:, 2].sum()) / scale)


def _rel(x: torch.Tensor, scale: float) -> float:
    return float(x[:, :2].abs().sum()) / scale if scale > 0 else 0.0


def conservation(*, starts: list[torch.Tensor], ends: list[torch.Tensor],
                 received: torch.Tensor, tol: float) -> Conservation:
    """Judge one window from the checksums before/after each backward and at the step.

    All tensors are ``[P, 3]`` over the same parameters. ``tol`` is relative (derived
    from the gradient dtype by the caller).
    """
    n = int(received.shape[0])
    contrib = sum((e - s for s, e in zip(starts, ends, strict=True)),
                  torch.zeros_like(received))
    scale = float(sum(float((e - s)[:, 2].abs().sum()) for s, e in zip(starts, ends,
                                                                       strict=True)))
    scale = max(scale, float(received[:, 2].sum()), 1e-30)
    stale = _rel(starts[0], scale) if starts else 0.0
    wiped_t = torch.zeros_like(received)
    wipes: list[int] = []
    lost = 0.0
    added = 0.0
    for i in range(1, len(starts)):
        gap = ends[i - 1] - starts[i]
        wiped_t += gap
        if _rel(gap, scale) > tol:
            wipes.append(i)
            mass = float(gap[:, 2].sum())
            lost += max(0.0, mass) / scale
            added += max(0.0, -mass) / scale
    if wipes:  # a leftover the clears removed is not the window's gradient
        lost = lost_share(lost, starts, scale)
    first_wipe = wipes[0] if wipes else None
    wiped = _rel(wiped_t, scale)
    # what the optimizer got vs the sum of contributions, up to one positive scale
    a = received[:, :2].reshape(-1)
    b = contrib[:, :2].reshape(-1)
    denom = float(b @ b)
    c = float(a @ b) / denom if denom > 0 else 1.0
    c = c if c > 0 else 1.0
    resid = float((a - c * b).abs().sum()) / max(float(a.abs().sum()), float(b.abs().sum()) * c,
                                                 1e-30)
    received_rel = resid
    # A wipe inside the window is the cause when there is one: a leftover it cleared never
    # reached the optimizer (a zero_grad in the middle of every window leaves a stale start
    # in the next one, and removes it with that window's first micro-steps). Unless what was
    # removed came back: the optimizer received the sum of the contributions up to a
    # difference far smaller than the mass moved out (a loop that moves each micro-step's
    # gradient into a buffer of its own and gives the buffer back at the step): "returned",
    # the window reached the optimizer whole, with that difference (rounding in the buffer)
    if wiped > tol and received_rel > tol and lost > 0 \
            and received_rel <= min(RETURNED_MAX, RETURNED_SHARE * lost):
        ok, reason = True, "returned"
    elif wiped > tol and received_rel > tol:
        ok, reason = False, "wiped"
    elif stale > tol and received_rel > tol:
        ok, reason = False, "stale"
    else:
        ok, reason = True, ""
    return Conservation(n, wiped, stale, received_rel, ok, reason,
                        first_wipe=None if reason == "stale" else first_wipe,
                        wipes=() if reason == "stale" else tuple(wipes),
                        lost=min(lost, 1.0) if reason == "wiped" else 0.0,
                        added=added if reason == "wiped" else 0.0, scale=c,
                        contrib_sums=tuple(b.tolist()), received_sums=tuple(a.tolist()))
