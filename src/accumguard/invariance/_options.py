"""``accumguard invariance``: what to run: options, ``--ks``/``--batch`` parsing, the
``{K}``/``{MB}`` placeholders, and the refusal of commands that cannot vary K."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from accumguard.core.errors import AccumguardError, ConfigError

__all__ = ["InvarianceOptions", "CommandFailedError", "parse_ks", "micro_batch",
           "expand_command", "check_command", "PLACEHOLDER_K", "PLACEHOLDER_MB", "ENV_K",
           "ENV_MB", "ENV_BATCH", "ENV_SEED", "ENV_NO_DROPOUT"]

PLACEHOLDER_K = "{K}"
PLACEHOLDER_MB = "{MB}"
ENV_K = "ACCUMGUARD_K"
ENV_MB = "ACCUMGUARD_MICRO_BATCH"
ENV_BATCH = "ACCUMGUARD_BATCH"
ENV_SEED = "ACCUMGUARD_SEED"
ENV_NO_DROPOUT = "ACCUMGUARD_NO_DROPOUT"


class CommandFailedError(AccumguardError, RuntimeError):
    """The user's command failed, was killed, timed out or never stepped an optimizer."""

    def __init__(self, message: str, *, k: int, exit_code: int | None) -> None:
        super().__init__(message)
        self.k = k
        self.exit_code = exit_code


@dataclass(frozen=True, kw_only=True)
class InvarianceOptions:
    """What to run and how to judge it. Validated at construction."""

    command: tuple[str, ...]
    ks: tuple[int, ...] = (1, 4)
    steps: int = 3
    batch: int | None = None  # per-rank effective batch; MB = batch / K
    no_dropout: bool = False
    tolerance: float | None = None  # default: from the parameters' dtype
    timeout: float = 900.0  # per run, seconds
    seed: int = 0
    workdir: Path | None = None  # where the per-K recordings go (default: a temp dir)

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no command given; put it after `--`, e.g. "
                              "accumguard invariance --ks 1,4 -- python train.py --accum {K}")
        if len(self.ks) < 2:
            raise ConfigError(f"--ks {','.join(map(str, self.ks))} names {len(self.ks)} K; "
                              "give at least two, e.g. --ks 1,4 (the first is the reference)")
        if len(set(self.ks)) != len(self.ks):
            raise ConfigError(f"--ks {','.join(map(str, self.ks))} repeats a K; "
                              "give distinct values, e.g. --ks 1,4")
        for k in self.ks:
            if not isinstance(k, int) or k < 1:
                raise ConfigError(f"K={k!r} in --ks must be a positive integer")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(f"--steps ({self.steps!r}) must be a positive integer: the number "
                              "of optimizer steps each run makes")
        if self.batch is not None:
            for k in self.ks:
                micro_batch(self.batch, k)
        if self.tolerance is not None and not (self.tolerance > 0):
            raise ConfigError(f"--tolerance ({self.tolerance!r}) must be positive")
        if not (self.timeout > 0):
            raise ConfigError(f"--timeout ({self.timeout!r}) must be positive (seconds per run)")


def parse_ks(text: str) -> tuple[int, ...]:
    """``"1,4"`` → ``(1, 4)``, with a message that shows the expected form."""
    try:
        ks = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--ks {text!r} must be comma-separated positive integers, "
                          "e.g. --ks 1,4") from None
    if not ks:
        raise ConfigError(f"--ks {text!r} selects no K; e.g. --ks 1,4")
    return ks


def micro_batch(batch: int, k: int) -> int:
    """The micro-batch that keeps the per-rank effective batch ``batch`` at ``k`` micro-steps."""
    if not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"--batch ({batch!r}) must be a positive integer: the per-rank "
                          "effective batch (samples per optimizer step on one rank)")
    if batch % k:
        divisors = [d for d in range(1, batch + 1) if batch % d == 0]
        raise ConfigError(f"--batch {batch} is not divisible by K={k}: the micro-batch would be "
                          f"{batch / k:g} samples. Pick K among the divisors of {batch} "
                          f"({', '.join(map(str, divisors))}) or a batch that is a multiple of "
                          f"every K")
    return batch // k


def expand_command(command: Sequence[str], k: int, mb: int | None) -> list[str]:
    """Replace ``{K}`` and ``{MB}`` in every argument (also inside ``--x={K}``)."""
    out = []
    for arg in command:
        if PLACEHOLDER_MB in arg and mb is None:
            raise ConfigError(f"the command uses {PLACEHOLDER_MB} in {arg!r} but no --batch was "
                              "given: pass --batch B (the per-rank effective batch) so that "
                              "MB = B / K can be computed")
        arg = arg.replace(PLACEHOLDER_K, str(k))
        if mb is not None:
            arg = arg.replace(PLACEHOLDER_MB, str(mb))
        out.append(arg)
    return out


def _mentions_env(command: Sequence[str]) -> bool | None:
    """Whether a script file named in the command reads ACCUMGUARD_K / _MICRO_BATCH.

    ``None`` when no readable ``.py`` file is named (``python -m pkg``, a shell
    wrapper ...): then nobody can tell."""
    seen_file = False
    for arg in command:
        path = Path(arg)
        if path.suffix not in (".py", ".sh") or not path.is_file():
            continue
        seen_file = True
        with contextlib.suppress(OSError):
            text = path.read_text(encoding="utf-8", errors="replace")
            if ENV_K in text or ENV_MB in text:
                return True
    return False if seen_file else None


def check_command(command: Sequence[str], *, batch: int | None) -> list[str]:
    """Refuse a command that cannot vary K, or cannot start; return warnings to print.

    Every K would run the same training (and trivially agree) if the command
    neither has a ``{K}``/``{MB}`` placeholder nor reads the environment
    variables: that is an error when the named script visibly does not read
    them, a warning when no script file is visible.
    """
    notes: list[str] = []
    exe = command[0]
    if shutil.which(exe) is None:
        where = "is not a file" if os.sep in exe else "was not found on PATH"
        raise ConfigError(f"command not found: {exe!r} {where}. Put the command after `--`, "
                          "e.g. accumguard invariance --ks 1,4 -- python train.py --accum {K}")
    has_k = any(PLACEHOLDER_K in a for a in command)
    has_mb = any(PLACEHOLDER_MB in a for a in command)
    if has_mb and batch is None:
        raise ConfigError(f"the command uses {PLACEHOLDER_MB} but no --batch was given: pass "
                          "--batch B (the per-rank effective batch); MB = B / K")
    if not has_k and not has_mb:
        reads = _mentions_env(command)
        hint = (f"put {PLACEHOLDER_K} (accumulation steps) and {PLACEHOLDER_MB} (micro-batch, "
                f"with --batch B) where the script takes them, e.g. -- torchrun train.py "
                f"--gradient_accumulation_steps {PLACEHOLDER_K} --micro_batch_size "
                f"{PLACEHOLDER_MB}, or read the environment variables {ENV_K} and {ENV_MB} in "
                "the script")
        if reads is False:
            raise ConfigError(f"the command has no {PLACEHOLDER_K} or {PLACEHOLDER_MB} "
                              f"placeholder and the script does not read {ENV_K} or {ENV_MB}: "
                              f"every K would run the same training. {hint}")
        if reads is None:
            notes.append(f"the command has no {PLACEHOLDER_K}/{PLACEHOLDER_MB} placeholder; "
                         f"assuming it reads {ENV_K}/{ENV_MB} from the environment (otherwise "
                         f"every K runs the same training). {hint}")
    elif has_k and not has_mb and batch is None:
        notes.append(f"the command sets K ({PLACEHOLDER_K}) but not the micro-batch "
                     f"({PLACEHOLDER_MB}): the script must keep the effective batch fixed "
                     "itself, or the runs compare different batch sizes")
    return notes


