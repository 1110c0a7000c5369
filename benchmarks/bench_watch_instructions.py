"""Overhead of ``accumguard watch`` on the demo LM counted in machine instructions, not seconds.

``bench_watch.py`` times the same loop in process CPU time; on a shared 2-core machine its
pairs spread by +-10 %, too wide to decide a 5 % bar. Instructions retired by the process
are counted by valgrind's callgrind and do not depend on what else the machine is doing.
Four runs of the same loop: plain and under :func:`accumguard.watch._recording.recording`
(what ``watch`` installs in each rank), each with a short and a long number of timed steps;
the difference of the two counts divided by the difference of the steps is the count of
one optimizer step in steady state (start-up, imports and warm-up cancel out).

    python benchmarks/bench_watch_instructions.py [--short 3] [--long 11] [--k 4] [--warm 3]
        [--src OTHER_TREE/src]

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
import os
import re
import shutil
import subprocess
import sys
import tempfile

#: where ``recording`` lived before the watch package (trees measured with ``--src``)
_OLD_HOME = ".".join(("accumguard", "runtime", "watch"))


def _child(mode: str, steps: int, k: int, warm: int) -> None:
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
    with tempfile.TemporaryDirectory() as tmp, recording(tmp):
        _steps(model, opt, data, k, warm)
        _steps(model, opt, data, k, steps)


def _count(mode: str, steps: int, k: int, warm: int, out_dir: str, src: str | None) -> int:
    out = os.path.join(out_dir, f"cg.{mode}.{steps}")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    if src:
        env["PYTHONPATH"] = os.path.abspath(src)
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           sys.executable, os.path.abspath(__file__), "--child", mode, "--steps", str(steps),
           "--k", str(k), "--warm", str(warm)]
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
    args = p.parse_args()
    if args.child:
        _child(args.child, args.steps, args.k, args.warm)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH: install it (Debian: apt-get install valgrind)")
    if args.long <= args.short:
        raise SystemExit(f"--long ({args.long}) must exceed --short ({args.short})")
    per_step: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as out_dir:
        for mode in ("plain", "watch"):
            short = _count(mode, args.short, args.k, args.warm, out_dir, args.src)
            long = _count(mode, args.long, args.k, args.warm, out_dir, args.src)
            per_step[mode] = (long - short) / (args.long - args.short)
            print(f"{mode}: {short:,} instructions with {args.short} steps, {long:,} with "
                  f"{args.long}: {per_step[mode]:,.0f} per optimizer step (K={args.k})",
                  flush=True)
    print(f"demo-lm, K={args.k}: watch / plain instructions per step = "
          f"{per_step['watch'] / per_step['plain']:.4f}")


if __name__ == "__main__":
    main()
