"""Overhead of ``accumguard watch`` on the demo LM counted in machine instructions, not seconds.

``bench_watch.py`` times the same loop in process CPU time; on a shared 2-core machine its
pairs spread by +-10 %, too wide to decide a 5 % bar. Instructions retired by the process
are counted by valgrind's callgrind and do not depend on what else the machine is doing.
Four runs of the same loop: plain and under :func:`accumguard.watch._recording.recording`
(what ``watch`` installs in each rank), each with a short and a long number of timed steps;
the difference of the two counts divided by the difference of the steps is the count of
one optimizer step in steady state (start-up, imports and warm-up cancel out).

    python benchmarks/bench_watch_instructions.py [--short 3] [--long 11] [--k 4] [--warm 3]
        [--src OTHER_TREE/src] [--schedule native|emulated]

The sampled work (the conservation checksums, the loss record) runs on wall-time budgets, and
under valgrind time is not what it is natively: callgrind emulates the model's vectorised
kernels (MKL's AVX2 GEMMs) many times slower per instruction than the observer's Python, so
the checksums look cheap next to a step and the budgets let them into most windows (on the
demo LM 5 of the 8 extra steps were checked under callgrind, none natively). With
``--schedule native`` (the default) the loop first runs once natively and the windows its
budgets chose are replayed under callgrind (printed: ``checked`` and ``loss record``): the
count is that of the run a user's process makes. ``--schedule emulated`` lets the budgets
decide under callgrind (the figure the earlier versions of this script printed).

``--src`` measures another checkout (e.g. ``git worktree add /tmp/old REV``) with this
file's loop: the two trees' per-step counts side by side are deterministic, unlike their
times.

An instruction is not a second: memory stalls and cache misses are not counted, and the
observation layer's work is Python bytecode (instruction-heavy, cache-friendly), so the
ratio is an estimate of the time ratio, not a measurement of it. Needs ``valgrind`` on
PATH; each run takes a few minutes (torch's import alone is about 5 G instructions).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

#: where ``recording`` lived before the watch package (trees measured with ``--src``)
_OLD_HOME = ".".join(("accumguard", "runtime", "watch"))


def _pin(obs: Any, plan: dict[str, list[int]], log: dict[str, list[int]]) -> None:
    """Make the observer's sampled work follow ``plan`` (the windows checked and the windows
    whose losses are recorded, by window index) when it has the keys, and log the windows
    its budgets (or the plan) chose into ``log``."""
    checked, recorded = plan.get("checked"), plan.get("recorded")
    tracking, take = obs._tracking, obs.losses.take

    def pinned_tracking() -> bool:
        first = obs._window_checked is None
        if first and checked is not None and obs._trackable():
            obs._window_checked = obs.step in checked
        out = bool(tracking())
        if first and out:
            log["checked"].append(obs.step)
        return out

    def pinned_take(applied: bool, **kw: Any) -> Any:
        if applied and obs.losses.on:
            log["recorded"].append(obs.step)
        out = take(applied, **kw)
        if applied and recorded is not None:
            obs.losses.on = obs.step + 1 in recorded
        return out

    obs._tracking, obs.losses.take = pinned_tracking, pinned_take


def _child(mode: str, steps: int, k: int, warm: int, plan_file: str | None = None,
           log_file: str | None = None) -> None:
    import torch

    from accumguard.demo.toy import TinyCausalLM, make_lm_batches

    try:
        from accumguard.watch._recording import recording
    except ImportError:  # a tree from before the watch package (--src of an older commit),
        import importlib  # where recording lived in the module this tree moved away

        recording = importlib.import_module(_OLD_HOME).recording

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_watch import _steps  # the loop bench_watch.py times (imports no accumguard)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyCausalLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = make_lm_batches(seed=0, world_size=1, micro_batches=16, micro_batch_size=4,
                           seq_len=32)[0]
    _steps(model, opt, data, k, 3)
    if mode == "plain":
        _steps(model, opt, data, k, warm)
        _steps(model, opt, data, k, steps)
        return
    plan = {}
    if plan_file and os.path.exists(plan_file):
        with open(plan_file, encoding="utf-8") as fh:
            plan = json.load(fh)
    log: dict[str, list[int]] = {"checked": [], "recorded": []}
    with tempfile.TemporaryDirectory() as tmp, recording(tmp) as obs:
        _pin(obs, plan, log)
        _steps(model, opt, data, k, warm)
        _steps(model, opt, data, k, steps)
    if log_file:  # the windows sampled (a native run's: the plan of the callgrind runs)
        with open(log_file, "w", encoding="utf-8") as fh:
            json.dump(log, fh)


def _env(src: str | None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    if src:
        env["PYTHONPATH"] = os.path.abspath(src)
    return env


def _native_plan(steps: int, k: int, warm: int, plan_file: str, src: str | None) -> None:
    """Run the watched loop natively once: its budgets' choice of windows goes to
    ``plan_file``."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "watch", "--steps", str(steps),
           "--k", str(k), "--warm", str(warm), "--log", plan_file]
    subprocess.run(cmd, env=_env(src), capture_output=True, text=True, timeout=600, check=True)


def _count(mode: str, steps: int, k: int, warm: int, out_dir: str, src: str | None,
           plan_file: str | None = None, log_file: str | None = None) -> int:
    out = os.path.join(out_dir, f"cg.{mode}.{steps}")
    env = _env(src)
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           sys.executable, os.path.abspath(__file__), "--child", mode, "--steps", str(steps),
           "--k", str(k), "--warm", str(warm)]
    if plan_file:
        cmd += ["--plan", plan_file]
    if log_file:
        cmd += ["--log", log_file]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    found = re.findall(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if not found:
        raise SystemExit(f"no instruction count in callgrind's output:\n{proc.stderr[-2000:]}")
    return int(found[-1].replace(",", ""))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--short", type=int, default=3)
    p.add_argument("--long", type=int, default=11)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--warm", type=int, default=3)
    p.add_argument("--child", choices=("plain", "watch"))
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--src", help="the src/ directory of another tree to measure (PYTHONPATH)")
    p.add_argument("--schedule", choices=("native", "emulated"), default="native",
                   help="the sampled windows: those a native run's budgets chose (replayed "
                        "under callgrind), or those the budgets choose under callgrind")
    p.add_argument("--plan", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args.child, args.steps, args.k, args.warm, args.plan, args.log)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH: install it (Debian: apt-get install valgrind)")
    if args.long <= args.short:
        raise SystemExit(f"--long ({args.long}) must exceed --short ({args.short})")
    per_step: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as out_dir:
        plans: dict[int, str | None] = {args.short: None, args.long: None}
        if args.schedule == "native":
            for n in plans:
                plans[n] = os.path.join(out_dir, f"plan.{n}.json")
                _native_plan(n, args.k, args.warm, str(plans[n]), args.src)
                with open(str(plans[n]), encoding="utf-8") as fh:
                    chosen = json.load(fh)
                print(f"native run of {n} steps (+{args.warm} warm): windows checked "
                      f"{chosen['checked']}, loss record {chosen['recorded']}", flush=True)
        for mode in ("plain", "watch"):
            counts = []
            for n in (args.short, args.long):
                log = os.path.join(out_dir, f"log.{mode}.{n}.json")
                counts.append(_count(mode, n, args.k, args.warm, out_dir, args.src,
                                     plans[n] if mode == "watch" else None,
                                     log if mode == "watch" else None))
                if mode == "watch":
                    with open(log, encoding="utf-8") as fh:
                        chosen = json.load(fh)
                    print(f"under callgrind, {n} steps: windows checked {chosen['checked']}, "
                          f"loss record {chosen['recorded']}", flush=True)
            short, long = counts
            per_step[mode] = (long - short) / (args.long - args.short)
            print(f"{mode}: {short:,} instructions with {args.short} steps, {long:,} with "
                  f"{args.long}: {per_step[mode]:,.0f} per optimizer step (K={args.k})",
                  flush=True)
    print(f"demo-lm, K={args.k}: watch / plain instructions per step = "
          f"{per_step['watch'] / per_step['plain']:.4f}")


if __name__ == "__main__":
    main()
