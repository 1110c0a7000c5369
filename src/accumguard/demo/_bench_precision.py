"""Precision table of ``accumguard bench --precision``: bf16 parameters, fp32 vs bf16
accumulation, fp32 master weights, against the fp64 reference (single process)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn


def precision_rows(ks: tuple[int, ...] = (4, 64, 512), dim: int = 64, micro: int = 4,
                   lr: float = 1e-2) -> list[dict[str, Any]]:
    """bf16 parameters, single process, per K: bf16 accumulation (``accumulation_dtype=
    "native"``), fp32 accumulation (``"auto"``) and fp32 accumulation with fp32 master
    weights (``master_weights=True``). Relative errors of the gradient one SGD step (``lr``)
    receives, against (a) the fp64 reference of the whole batch (includes the bf16
    forward/backward of each micro-step, which no accumulation can fix) and (b) the exact
    (fp64) sum of the very bf16 micro-gradients the run computed: the accumulation error
    alone; (b) for the fp32 window sum before any cast; the relative error of the *update*
    of the weights the optimizer steps (the bf16 parameters, or the fp32 masters: the run's
    real weights) against the fp64 reference's update; seconds per optimizer step and the
    bytes of the fp32 buffers (main gradients, masters)."""
    from accumguard import Accumulator

    def loss(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = ((m(b[0].to(torch.bfloat16)).float() - b[1]) ** 2).sum()
        return out

    def bf16_copy(base: nn.Module) -> nn.Module:
        m = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
        m.load_state_dict(base.state_dict())
        return m.to(torch.bfloat16)

    def flat_grad(m: nn.Module) -> torch.Tensor:
        return torch.cat([p.grad.double().flatten() for p in m.parameters()
                          if p.grad is not None])

    def stepped(o: torch.optim.Optimizer) -> list[torch.Tensor]:  # masters, if swapped in
        return [p for group in o.param_groups for p in group["params"]]

    def flat(ts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.detach().double().flatten() for t in ts])

    def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
        return float((x - ref).norm() / ref.norm())

    rows = []
    for k in ks:
        g = torch.Generator().manual_seed(k)
        data = [(torch.randn(micro, dim, generator=g) + 1.0, torch.randn(micro, dim, generator=g))
                for _ in range(k)]
        torch.manual_seed(0)
        base = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
        base.load_state_dict(bf16_copy(base).state_dict())  # same (bf16-rounded) start
        ref = bf16_copy(base).double()
        total = sum(((ref(x.double()) - y.double()) ** 2).sum() for x, y in data)
        (total / (k * micro)).backward()
        ref_g = flat_grad(ref)
        exact = torch.zeros_like(ref_g)  # exact sum of the bf16 micro-gradients
        one = bf16_copy(base)
        for b in data:
            one.zero_grad(set_to_none=True)
            loss(one, b).backward()  # type: ignore[no-untyped-call]  # torch: Tensor.backward is unannotated
            exact += flat_grad(one)
        exact /= k * micro
        for mode in ("native", "auto", "master"):
            model = bf16_copy(base)
            seen: list[torch.Tensor] = []
            opt = torch.optim.SGD(model.parameters(), lr=lr)

            def record(o: torch.optim.Optimizer, a: tuple[object, ...], kw: dict[str, object],
                       s: list[torch.Tensor] = seen) -> None:
                s.append(flat([p.grad for p in stepped(o) if p.grad is not None]))

            opt.register_step_pre_hook(record)
            acc = Accumulator(model, opt, accumulation_steps=k, master_weights=mode == "master",
                              accumulation_dtype="native" if mode == "native" else "auto")
            before = flat(stepped(opt))
            main = acc.engine.main_grads
            if main is not None:
                main.keep_last = True
            t0 = time.perf_counter()
            for w in acc.windows(data):
                def micro_loss(b: tuple[torch.Tensor, torch.Tensor],
                               m: nn.Module = model) -> torch.Tensor:
                    return loss(m, b)

                w.run(micro_loss)
            secs = time.perf_counter() - t0
            last = main.last_sum if main is not None else None
            masters = acc.masters
            rows.append({"K": k, "accumulation": acc.accumulation_dtype
                         + (" + master weights" if masters is not None else ""),
                         "error_vs_fp64": rel(seen[0], ref_g),
                         "accumulation_error": rel(seen[0], exact),
                         "fp32_sum_accumulation_error": (None if last is None else
                                                         rel(last.double(), exact)),
                         "update_error_vs_fp64": rel(flat(stepped(opt)) - before, -lr * ref_g),
                         "lr": lr, "seconds": secs,
                         "extra_bytes": (0 if main is None else main.nbytes)
                         + (0 if masters is None else masters.nbytes)})
            acc.close()
    return rows


def precision_table(rows: list[dict[str, Any]]) -> str:
    lr = rows[0]["lr"] if rows else 0.0
    lines = ["| K | accumulation | step gradient vs fp64 reference | step gradient vs exact sum "
             "of the bf16 micro-gradients | fp32 window sum vs that exact sum | update of the "
             f"stepped weights vs fp64 (SGD lr={lr:g}) | s / step | extra memory (bytes) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        se = r["fp32_sum_accumulation_error"]
        lines.append(f"| {r['K']} | {r['accumulation']} | {r['error_vs_fp64']:.2e} | "
                     f"{r['accumulation_error']:.2e} | {'-' if se is None else f'{se:.2e}'} | "
                     f"{r['update_error_vs_fp64']:.2e} | {r['seconds']:.3f} | "
                     f"{r['extra_bytes']} |")
    return "\n".join(lines)
