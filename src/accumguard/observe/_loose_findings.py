"""The F10 findings for parameters a data-parallel engine never reduces, in the engine's
words: DDP's registered set, the DeepSpeed engine's module (the step record's
``unwrapped``, read by :mod:`._rank_rules` when the ranks' received gradients differ), and
the comparisons of those parameters' gradients across ranks (DDP's loose ``.grad`` read after
the step, FSDP2's parameters outside every ``fully_shard`` unit)."""

from __future__ import annotations

from accumguard.observe._records import Finding, StepWindow, _mk, _n

__all__ = ["ddp_loose_finding", "ds_loose_finding", "loose_grads_differ", "outside_units",
           "spread"]


def ddp_loose_finding(step: int, evidence: str, loose: list[str]) -> Finding:
    return _mk("F10", "error", None, step, None,
               evidence + f"; the optimizer steps parameters that DDP does not "
               f"reduce ({', '.join(loose)}): DDP averages the gradients of the "
               "parameters its module held, requiring a gradient, when DDP was built (not "
               "one outside that module, one replaced or added after, one frozen then and "
               "unfrozen later, or one it ignores), so each rank steps those on its own "
               "gradient",
               title_="parameters DDP does not reduce are never averaged over "
                      "the ranks",
               fix="Make them parameters of the module DDP wraps before wrapping it "
                   "(heads kept in a plain dict or list are not: hold them in an "
                   "nn.ModuleDict or nn.ModuleList; a loss module's learnable temperature or "
                   "weights included; replace a head before accelerator.prepare, "
                   "fabric.setup or DDP(...), not after; unfreeze before "
                   "wrapping, or wrap again after unfreezing), or all-reduce their "
                   "gradients (sum, then divide by the world size) at each window's "
                   "end, before the optimizer step.")


def ds_loose_finding(step: int, evidence: str, loose: list[str]) -> Finding:
    return _mk("F10", "error", None, step, None,
               evidence + f"; the optimizer steps parameters the DeepSpeed engine's module "
               f"does not hold ({', '.join(loose)}): the engine averages the gradients of "
               "its own module's parameters only (at every ZeRO stage), so each rank steps "
               "those on its own gradient",
               title_="parameters outside the DeepSpeed engine's module are never averaged "
                      "over the ranks",
               fix="Make the module that holds them (a loss module's learnable weights) a "
                   "submodule of the model given to deepspeed.initialize, or all-reduce their "
                   "gradients (sum, then divide by the world size) before engine.step() at "
                   "the accumulation boundary.")


def spread(sums: list[list[float]]) -> float:
    """How far apart the ranks' received-gradient checksums are, relative to their scale."""
    scale = max(abs(v[2]) for v in sums) or 1e-30
    return max(abs(a[i] - b[i]) for a in sums for b in sums for i in (0, 1)) / scale


def loose_grads_differ(step: int, row: dict[int, StepWindow]) -> Finding | None:
    """DDP, where the step's own checksum does not cover them (not kept: a backward inside
    the step's closure, Lightning; or they are not the wrapped model's), and DeepSpeed (a
    torch optimizer of the script's own stepping what the engine's module does not hold): the
    ``.grad`` of the stepped parameters no engine reduces, read right after the step, differs
    across ranks."""
    engines = {s.engine for s in row.values()}
    if len(row) < 2 or len(engines) != 1 or not engines <= {"ddp", "deepspeed"}:
        return None
    sums = {r: s.loose_checksum for r, s in row.items() if s.loose_checksum}
    names = next((s.unwrapped for s in row.values() if s.unwrapped), None)
    if len(sums) != len(row) or not names:
        return None
    if _loose_spread(list(sums.values())) <= 1e-5:
        return None
    if engines == {"deepspeed"}:
        return ds_loose_finding(step, f"the gradient of the parameters the DeepSpeed engine "
                                f"does not hold differs across ranks at step {_n(step)} "
                                f"({_loose_text(sums)}, read after the step)", names)
    return ddp_loose_finding(step, f"the gradient of the parameters DDP does not reduce "
                              f"differs across ranks at step {_n(step)} ({_loose_text(sums)}, "
                              "read after the step)", names)


def _loose_spread(sums: list[list[float]]) -> float:
    """How far apart the ranks' loose-parameter readings are: the step checksum's columns
    (sum, even-position sum, abs sum) or the ``.grad`` read after the step (sum, sum of
    squares; ``_loose._loose_grads``), whichever the record holds (one form per step); a
    step whose ranks hold different forms is not compared (0)."""
    if len({len(v) for v in sums}) != 1:
        return 0.0
    if len(sums[0]) >= 3:
        return spread(sums)
    scale = max(max(abs(v[0]), abs(v[1])) for v in sums) or 1e-30
    return max(abs(a[i] - b[i]) for a in sums for b in sums for i in (0, 1)) / scale


def _loose_text(sums: dict[int, list[float]]) -> str:
    square = all(len(v) == 2 for v in sums.values())
    text = ", ".join(f"rank {r}: {v[1] if square else v[0]:.6g}" for r, v in sorted(sums.items()))
    return ("its sums of squares " if square else "checksums ") + text


def outside_units(step: int, row: dict[int, StepWindow]) -> Finding | None:
    """FSDP2: the stepped parameters no ``fully_shard`` unit holds (plain tensors, not
    DTensors) received different gradients on the ranks: FSDP2 never reduced them and
    nothing else did, so each rank trains its own copy."""
    sums = {r: s.loose_checksum for r, s in row.items() if s.loose_checksum}
    names = next((s.unwrapped for s in row.values() if s.unwrapped), None)
    if len(sums) < 2 or len(sums) != len(row) or not names:
        return None
    if _loose_spread(list(sums.values())) <= 1e-5:
        return None
    text = _loose_text(sums)
    return _mk("F10", "error", None, step, None,
               f"the optimizer steps parameters no fully_shard unit holds ({', '.join(names)}: "
               f"plain tensors, not DTensors), and the gradient it received for them differs "
               f"across ranks at step {_n(step)} ({text}): FSDP2 reduces only the "
               "parameters of the modules fully_shard was applied to, and no all-reduce of "
               "the script averaged these, so each rank steps its own copy on its own gradient",
               title_="parameters outside every fully_shard unit are never averaged over "
                      "the ranks",
               fix="Make them parameters of a module fully_shard is applied to (the root "
                   "call fully_shard(model) takes every parameter of model not in an inner "
                   "unit: a loss module's learnable temperature belongs inside model), or "
                   "all-reduce their gradients (sum, then divide by the world size) at each "
                   "window's end, before the optimizer step.")
