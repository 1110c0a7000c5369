"""The F10 findings for parameters a data-parallel engine never reduces, in the engine's
words: DDP's registered set, DeepSpeed ZeRO-0's engine module (the step record's
``unwrapped``, read by :mod:`._rank_rules` when the ranks' received gradients differ)."""

from __future__ import annotations

from accumguard.observe._records import Finding, _mk

__all__ = ["ddp_loose_finding", "ds_loose_finding"]


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
               f"does not hold ({', '.join(loose)}): under ZeRO stage 0 the engine averages "
               "the gradients of its own module's parameters only, so each rank steps those "
               "on its own gradient",
               title_="parameters outside the DeepSpeed engine's module are never averaged "
                      "over the ranks",
               fix="Make the module that holds them (a loss module's learnable weights) a "
                   "submodule of the model given to deepspeed.initialize, or all-reduce their "
                   "gradients (sum, then divide by the world size) before engine.step() at "
                   "the accumulation boundary.")
