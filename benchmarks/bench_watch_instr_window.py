"""Watch's per-step work in machine instructions, counted only over the measured steps.

``bench_watch_instructions.py`` counts whole processes (torch's import included) and takes
the difference of a short and a long run: four runs under callgrind, 20-30 minutes each on
a loaded machine, and the difference of the two runs also holds whatever sampled work
(conservation checksums, loss records, both on wall-time budgets) fell into the extra
steps of the long run. This one runs a single process under callgrind with the
instrumentation off (``--instr-atstart=no``) and switches it on only around the measured
steps, through callgrind's client requests (a small C helper compiled on the fly: needs
``gcc`` and valgrind's headers). The same loop as ``bench_watch.py`` (demo LM, K = 4), each
count dumped apart, per optimizer step:

* ``plain``: the loop alone;
* ``watch``: under :func:`accumguard.watch._recording.recording`, the sampled work as its
  budgets decide (after ``--warm`` watched steps);
* ``base``: the same with the sampled work off (the per-event work watch always pays);
* ``loss``: the loss record on in every window;
* ``check``: the conservation checksums on in every window.

The budgets cap the sampled work at a share of the run's time (conservation 1 %, the loss
record 0.5 %), so a long run pays about ``base`` plus those shares; ``loss`` and ``check``
show what one recorded or checked window costs.

    python benchmarks/bench_watch_instr_window.py [--steps 4] [--warm 3]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

_HELPER = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
void cg_dump(const char *s) { CALLGRIND_DUMP_STATS_AT(s); }
"""
MODES = ("plain", "watch", "base", "loss", "check")


def _child(lib: str, steps: int, warm: int) -> None:
    import torch

    import accumguard.observe._losses as losses
    from accumguard.demo.toy import TinyCausalLM, make_lm_batches
    from accumguard.watch._recording import recording

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_watch import _steps  # the loop bench_watch.py times

    cg = ctypes.CDLL(lib)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyCausalLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = make_lm_batches(seed=0, world_size=1, micro_batches=16, micro_batch_size=4,
                           seq_len=32)[0]
    _steps(model, opt, data, 4, 3)

    def measure(tag: str) -> None:
        cg.cg_start()
        _steps(model, opt, data, 4, 1)  # (translations made, not counted)
        cg.cg_zero()
        _steps(model, opt, data, 4, steps)
        cg.cg_dump(tag.encode())
        cg.cg_stop()

    with tempfile.TemporaryDirectory() as tmp, recording(tmp):  # a first install, removed:
        _steps(model, opt, data, 4, 3)  # its one-off work stays out of the counted steps
    measure("plain")
    with tempfile.TemporaryDirectory() as tmp, recording(tmp) as obs:
        _steps(model, opt, data, 4, warm)
        measure("watch")
        losses._ALWAYS, losses._BUDGET = 0, 0.0  # no loss record from the next window on
        obs.losses.on = False
        obs._t_checks = 1e9  # the conservation budget spent
        _steps(model, opt, data, 4, 1)
        measure("base")
        losses._ALWAYS = 10**9  # a loss record in every window
        obs.losses.on = True
        _steps(model, opt, data, 4, 1)
        measure("loss")
        losses._ALWAYS = 0
        obs.losses.on = False
        obs.budget, obs._t_checks = None, 0.0  # every window checked
        _steps(model, opt, data, 4, 1)
        measure("check")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warm", type=int, default=3)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args.child, args.steps, args.warm)
        return
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH")
    with tempfile.TemporaryDirectory() as out:
        lib = os.path.join(out, "libcg.so")
        src = os.path.join(out, "cg.c")
        with open(src, "w", encoding="utf-8") as fh:
            fh.write(_HELPER)
        subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", lib, src], check=True,
                       timeout=120)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
               f"--callgrind-out-file={out}/cg.out", sys.executable, os.path.abspath(__file__),
               "--child", lib, "--steps", str(args.steps), "--warm", str(args.warm)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=7200,
                              check=False)
        if proc.returncode != 0:
            raise SystemExit(f"exited {proc.returncode}:\n{proc.stderr[-2000:]}")
        counts: dict[str, float] = {}
        for path in glob.glob(os.path.join(out, "cg.out.*")):
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            tag = re.search(r"^desc: Trigger: Client Request: (\S+)", text, re.M)
            total = re.search(r"^summary:\s+(\d+)", text, re.M)
            if tag and total:
                counts[tag.group(1)] = int(total.group(1)) / args.steps
    plain = counts.get("plain")
    if not plain:
        raise SystemExit(f"no count of the plain loop: {counts}")
    for mode in MODES:
        if mode in counts:
            print(f"{mode:6s} {counts[mode]:14,.0f} instructions per optimizer step, "
                  f"x plain {counts[mode] / plain:.4f}")


if __name__ == "__main__":
    main()
