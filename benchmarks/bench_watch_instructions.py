"""Overhead of ``accumguard watch`` on the demo LM in *instructions*, not seconds: each run is
executed under ``valgrind --tool=callgrind``, whose instruction count does not depend on what
else the machine is doing (this machine's CPU time per step wanders by +-25 %, so timed ratios
of two trees a few points apart cannot be told apart; counted ones can).

Per-step instructions are the difference between a run of ``--long`` and one of ``--short``
optimizer steps (the import, model build and warm-up cancel), plain and watched (every window
observed, as in the first 64 steps of any watched run). Prints both and their ratio.
Instructions are a proxy for CPU time: an instruction of Python's interpreter and one of a
vectorised kernel do not cost the same, so the ratio is a second opinion beside
``bench_watch.py``, not a replacement. Needs valgrind; each run takes a few minutes.

    python benchmarks/bench_watch_instructions.py [--short 6] [--long 18] [--k 4] [--warm 4]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor


def _child(mode: str, steps: int, k: int, warm: int) -> None:
    import torch

    from accumguard.demo.toy import TinyCausalLM, make_lm_batches, token_loss

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyCausalLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = make_lm_batches(seed=0, world_size=1, micro_batches=16, micro_batch_size=4,
                           seq_len=32)[0]

    def run(n: int) -> None:
        for s in range(n):
            for j in range(k):
                loss, _ = token_loss(model, data[(s * k + j) % len(data)])
                (loss / 100).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()

    run(2)
    if mode == "plain":
        run(warm + steps)
        return
    from accumguard.watch._recording import recording

    with tempfile.TemporaryDirectory() as tmp, recording(tmp, observe_steps=None):
        run(warm + steps)


def _count(mode: str, steps: int, k: int, warm: int) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
           os.path.abspath(__file__), "--child", mode, "--steps", str(steps), "--k", str(k),
           "--warm", str(warm)]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=3600)
    m = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        raise SystemExit(f"{mode} {steps}: valgrind run failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    return int(m.group(1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", choices=["plain", "watch"])
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--short", type=int, default=6)
    p.add_argument("--long", type=int, default=18)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--warm", type=int, default=4)
    p.add_argument("--jobs", type=int, default=2, help="valgrind runs at once")
    args = p.parse_args()
    if args.child:
        _child(args.child, args.steps, args.k, args.warm)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt install valgrind)")
    runs = [(m, n) for m in ("plain", "watch") for n in (args.short, args.long)]
    with ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(zip(runs, pool.map(lambda r: _count(r[0], r[1], args.k, args.warm), runs),
                          strict=True))
    per = {m: (counts[(m, args.long)] - counts[(m, args.short)]) / (args.long - args.short)
           for m in ("plain", "watch")}
    print(f"demo-lm, K={args.k}, every window observed: plain {per['plain'] / 1e6:.1f} M "
          f"instructions/step, watch {per['watch'] / 1e6:.1f} M, ratio "
          f"{per['watch'] / per['plain']:.4f}")


if __name__ == "__main__":
    main()
