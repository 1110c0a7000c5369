"""The token-weight probe: per micro-step, how many tokens had a label and what weight the
loss gave each of them, read from the gradient of the logits (no labels, no loss code).

For a token cross-entropy the gradient of the loss w.r.t. one token's logits row is
``s · (softmax(z) − onehot(y))``: its only negative entry sits at the label, rows of
ignored tokens are zero, and ``s`` is the weight the loop gave each token of that
micro-batch (``1/N`` when exact). From the gradient and the logits the probe recovers
the valid-token count ``n_i`` and ``Σ s·(1−p_y)``, ``Σ (1−p_y)`` (their ratio is
``s_i``): one ``argmin`` over the gradient and one fused cross-entropy over the logits
per micro-step, inside the backward; the sums wait for :meth:`TokenWeightProbe.take`. The
verdict on a window's records is :func:`accumguard.observe.rules.classify_token_weights`.

Label smoothing (``cross_entropy(label_smoothing=eps)``, the HF Trainer's
``label_smoothing_factor``) changes the row to ``s · (softmax(z) − (1−eps)·onehot(y) −
eps/V)`` but not ``s``, the normaliser: every off-label entry is ``s·p_j − c`` with one
``c = s·eps/V``. The probe also reads the entry of the least probable class ``m``: from the
label's and ``m``'s entries ``s = −(g_y + (V−1)·g_m) / (1 − p_y − (V−1)·p_m)`` for any
``eps`` (0 included), checked against the largest entry (``(g_j − g_m) = s·(p_j − p_m)``).
A window whose rows are not a plain cross-entropy's but fit this form is judged with it.

Used by the framework callbacks (:mod:`accumguard.integrations`); one place for both.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from accumguard.core.errors import ConfigError
from accumguard.observe._failsafe import Failsafe, hook_method
from accumguard.observe._hookref import ModuleHook

__all__ = ["TokenWeightProbe", "find_logits_module"]

#: How much better the label-smoothed form must fit a window's rows than a plain
#: cross-entropy's before the weights are read with it (a plain cross-entropy fits both to
#: rounding; a smoothed one misses the plain form by about eps).
_SMOOTH_MARGIN = 10.0


def find_logits_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose output is the logits: a transformers model's output embeddings
    (``lm_head``), searched through wrappers (DDP, a LightningModule holding a model), else
    the last ``nn.Linear`` registered in ``model``."""
    for m in model.modules():
        get = getattr(m, "get_output_embeddings", None)
        if callable(get):
            out = get()
            if isinstance(out, torch.nn.Module):
                return out
    last = None
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            last = m
    if last is None:
        raise ConfigError(
            f"found no module producing logits in {type(model).__name__} (no "
            "get_output_embeddings(), no nn.Linear); pass logits_module=<the output layer>")
    return last


class TokenWeightProbe:
    """Per micro-step ``(valid tokens, Σ token weight·(1−p_y), Σ (1−p_y))`` from dL/dlogits.

    The ratio of the last two is the weight ``s_i`` the loss gave each token of the
    micro-batch; see the module docstring. Records accumulate in :attr:`records` until
    :meth:`take` collects them.
    """

    def __init__(self, module: torch.nn.Module, *, failsafe: Failsafe | None = None) -> None:
        #: the door of its hooks: an internal error never reaches the training
        self.failsafe = failsafe if failsafe is not None else Failsafe()
        # per probed micro-step: (g_y, -log p_y), one entry per token (see _on_grad)
        self.records: list[tuple[torch.Tensor, ...]] = []
        self.scale = 1.0  # multiplies the weights of records taken next (set by exact paths)
        self.low_precision = False  # a bf16/fp16 logits gradient was seen
        self._module = module
        self._vocab = 0  # the logits' last dimension (label smoothing's V)
        self._handle: Any = module.register_forward_hook(ModuleHook(self._on_forward))

    @property
    def active(self) -> bool:
        """Probe the next forwards? Off on steps that are not checked: the hook is removed
        then, so the logits layer takes torch's plain call path (no cost at all)."""
        return self._handle is not None

    @active.setter
    def active(self, on: bool) -> None:
        if on and self._handle is None:
            self._handle = self._module.register_forward_hook(ModuleHook(self._on_forward))
        elif not on and self._handle is not None:
            self._handle.remove()
            self._handle = None

    def close(self) -> None:
        self.active = False

    @hook_method
    def _on_forward(self, module: Any, args: Any, output: Any) -> None:
        logits = output
        if not isinstance(logits, torch.Tensor):
            logits = getattr(output, "logits", None)
        if (not isinstance(logits, torch.Tensor) or not logits.requires_grad
                or not torch.is_grad_enabled()):
            return
        logits.register_hook(  # type: ignore[no-untyped-call]
            functools.partial(self._on_grad, logits.detach()))

    @hook_method
    def _on_grad(self, logits: torch.Tensor, grad: torch.Tensor) -> None:
        # Only what needs the [tokens, vocab] tensors runs here, inside the backward (where
        # each torch op costs about twice its usual dispatch): one min over the gradient and
        # one fused cross-entropy over the logits. The per-token arithmetic is left to take().
        with torch.no_grad():
            v = grad.shape[-1]
            g = grad.reshape(-1, v)
            gy, y = g.min(dim=-1)  # the label's entry: s·(p_y − 1) < 0
            if gy.dtype not in (torch.float32, torch.float64):
                self.low_precision = True  # bf16/fp16 logits: judge in fp32 (exact widening)
                gy = gy.float()
            # -log p_y by the fused cross-entropy kernel (one op for gather + logsumexp)
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, v).to(gy.dtype), y,
                                                    reduction="none")
            # the signature take() checks: a row s·(softmax − onehot) sums to 0 and its only
            # negative entry is the label's (so its abs sum is −2 g_y). Not so when the module
            # is not the logits of a token cross-entropy (a hidden layer taken for the logits,
            # a regression head): then nothing is judged.
            # and a non-label entry is s·p_j with p from these logits: checked on the
            # largest one (logits scaled after this module, as Cohere's logit_scale or
            # Granite's logits_scaling do, break it: p_y read here is then not the loss's)
            gj, j = g.max(dim=-1)
            z = logits.reshape(-1, v)
            zy = z.gather(1, y[:, None])
            zjy = (z.gather(1, j[:, None]) - zy).squeeze(1).to(gy.dtype)
            # the least probable class: label smoothing's uniform part (see the module doc)
            zm, m = z.min(dim=-1)
            gm = g.gather(1, m[:, None]).squeeze(1).to(gy.dtype)
            zmy = (zm[:, None] - zy).squeeze(1).to(gy.dtype)
            self._vocab = v
            self.records.append((gy, nll, g.sum(-1, dtype=gy.dtype),
                                 g.abs().sum(-1, dtype=gy.dtype), gj.to(gy.dtype), zjy, gm,
                                 zmy))

    def discard(self) -> None:
        """Forget the records and the scale since the last :meth:`take` (an unchecked step)."""
        self.records = []
        self.scale = 1.0

    def take(self) -> torch.Tensor:
        """The records since the last call, as an ``[m, 4]`` float64 CPU tensor, one row per
        probed micro-step: (valid tokens, Σ s·(1−p_y), Σ (1−p_y), signature error) (weights
        scaled). The signature error is the relative distance of the gradient rows from a
        token cross-entropy's (0 when they are one; see :meth:`_on_grad`)."""
        recs = self.records
        self.records = []
        scale, self.scale = self.scale, 1.0
        if not recs:
            return torch.zeros(0, 4, dtype=torch.float64)
        with torch.no_grad():
            # all micro-steps at once: token rows, then per-micro-step sums by index
            gy = torch.cat([r[0] for r in recs])
            nll = torch.cat([r[1] for r in recs])
            sizes = torch.tensor([len(r[0]) for r in recs], device=gy.device)
            which = torch.repeat_interleave(torch.arange(len(recs), device=gy.device), sizes,
                                            output_size=len(gy))  # no device sync
            row_sum = torch.cat([r[2] for r in recs])
            abs_sum = torch.cat([r[3] for r in recs])
            gj = torch.cat([r[4] for r in recs])
            zjy = torch.cat([r[5] for r in recs])
            gm = torch.cat([r[6] for r in recs])
            zmy = torch.cat([r[7] for r in recs])
            valid = (gy < 0).to(gy.dtype)  # ignored tokens have an all-zero row (g_y = 0)
            off = row_sum.abs() + (abs_sum + 2 * gy.clamp(max=0)).abs()
            one_minus_p = -torch.expm1(-nll)
            pj = torch.exp(zjy - nll)  # p_j = p_y · exp(z_j − z_y)
            # s·p_j·(1 − p_y) + s·(p_y − 1)·p_j = 0 for a cross-entropy row
            ratio_off = (gj * one_minus_p + gy * pj).abs()
            ratio_scale = (gj * one_minus_p).abs() + (gy * pj).abs()
            # label smoothing: s = num / den from the label and the least probable class,
            # the same s as (g_j − g_m) / (p_j − p_m) from the largest entry
            pm = torch.exp(zmy - nll)
            vm1 = float(max(self._vocab - 1, 0))
            # (a row whose label is its least probable class says nothing here: left out)
            other = (zmy != 0).to(gy.dtype)
            num = -(gy + vm1 * gm) * other
            den = (one_minus_p - vm1 * pm) * other
            ls_off = (den * (gj - gm) - num * (pj - pm)).abs()
            ls_scale = (den * (gj - gm)).abs() + (num * (pj - pm)).abs()
            # float64: index_add_ adds the rows one after another (atomics on CUDA), whose
            # fp32 error grows with the token count (1e-3 of the weight at 256 k tokens)
            cols = torch.stack([valid, -gy, one_minus_p * valid, off, abs_sum, ratio_off,
                                ratio_scale, num * valid, den * valid, row_sum.abs(), ls_off,
                                ls_scale], dim=1).double()
            sums = torch.zeros(len(recs), 12, dtype=torch.float64, device=gy.device)
            sums.index_add_(0, which, cols)
            sums = sums.cpu()
        tiny = torch.finfo(torch.float64).tiny
        out = sums[:, :4].clone()
        out[:, 3] = torch.maximum(sums[:, 3] / sums[:, 4].clamp(min=tiny),
                                  sums[:, 5] / sums[:, 6].clamp(min=tiny))
        smooth = torch.maximum(sums[:, 9] / sums[:, 4].clamp(min=tiny),
                               sums[:, 10] / sums[:, 11].clamp(min=tiny))
        # the smoothed form explains the window's rows far better than a plain
        # cross-entropy: label smoothing; the weights are read with it (only when every
        # micro-step had rows it could read: no row whose least probable class differs from
        # its label, as with equal logits, explains nothing)
        if (float(sums[:, 11].min()) > 0
                and float(smooth.max()) * _SMOOTH_MARGIN < float(out[:, 3].max())):
            out[:, 1:3] = sums[:, 7:9]
            out[:, 3] = smooth
        if scale != 1.0:
            out[:, 1] *= scale
        return out
