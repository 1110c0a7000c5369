"""Many ``accumguard watch`` cases for the price of one launch.

A test that launched ``accumguard watch -- python SCRIPT ARGS`` (or ``-- torchrun ...
SCRIPT ARGS``) once per parametrised case paid a Python + torch (+ process group) start-up
per case, 5-15 s each on this machine, to test a rule. :func:`watch_many` runs every case
of a module in ONE launch of the same launcher (``watch_scripts/run_many.py`` runs the
scripts one after the other in the same process, each recorded in its own directory as the
bootstrap of ``watch`` records it), then judges each directory with
:func:`accumguard.watch._report.judge`: the function the CLI calls after the
command ends, with the same command line (so K declared in the script's source is read the
same way), giving the same report, findings and exit code.

What this does not test: the launch itself (bootstrap injection, exit codes of the real
command, output pass-through); tests/runtime/test_watch.py keeps one real launch per
launcher for that.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import free_port, launcher_env

DRIVER = Path(__file__).resolve().parent / "watch_scripts" / "run_many.py"
_RETRY = ("EADDRINUSE", "Address already in use", "DistNetworkError",
          "terminate called without an active exception")


@dataclass(frozen=True)
class Ran:
    """What a case's script did (the ``proc`` the CLI tests looked at): its exit code and
    output, every rank's joined."""

    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class Watched:
    """One case judged as ``accumguard watch --json`` would report it."""

    code: int
    findings: list[dict[str, Any]]
    report: dict[str, Any]
    proc: Ran

    def __iter__(self) -> Any:  # code, findings, report, proc = watched (as _watch returned)
        return iter((self.code, self.findings, self.report, self.proc))


def _split(command: list[str]) -> tuple[list[str], list[str]]:
    """(launcher prefix, [script, *args]): the script is the first ``*.py`` argument."""
    i = next(i for i, a in enumerate(command) if a.endswith(".py"))
    return command[:i], command[i:]


_PORT_FLAGS = ("--master-port", "--master_port", "--main_process_port")


def _no_port(prefix: list[str]) -> list[str]:
    return [a for i, a in enumerate(prefix) if not (i and prefix[i - 1] in _PORT_FLAGS)]


def _fresh_port(prefix: list[str]) -> list[str]:
    return [str(free_port()) if i and prefix[i - 1] in _PORT_FLAGS else a
            for i, a in enumerate(prefix)]


def watch_many(out: Path, cases: dict[str, list[str]], *, k: int | None = None,
               ks: dict[str, int | None] | None = None,
               timeout: float = 1800) -> dict[str, Watched]:
    """Run every case (name -> the command ``watch`` would be given) in one launch and judge
    each. All commands must share the launcher (``python`` or the same ``torchrun``
    options); ``k`` is ``--accumulation-steps``, ``ks`` the same per case."""
    from accumguard.watch._report import judge

    prefixes = {tuple(_no_port(_split(c)[0])) for c in cases.values()}
    assert len(prefixes) == 1, f"one launcher per sweep, got {prefixes}"
    prefix = _split(next(iter(cases.values())))[0]
    nproc = next((int(prefix[i + 1]) for i, a in enumerate(prefix)
                  if a in ("--nproc-per-node", "--nproc_per_node", "--num_processes",
                            "--num_gpus")), 1)
    spec = out / "spec.json"
    for attempt in range(2):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        spec.write_text(json.dumps({"out": str(out), "runs": [
            {"name": name, "argv": _split(cmd)[1]} for name, cmd in cases.items()]}))
        proc = subprocess.run([*_fresh_port(prefix), str(DRIVER), str(spec)],
                              env=launcher_env(), capture_output=True, text=True,
                              timeout=timeout)
        done = all((out / "_status" / f"{name}.rank{r}.json").exists()
                   for name in cases for r in range(nproc))
        if done or attempt or not any(m in proc.stderr for m in _RETRY):
            break
    assert done, f"the sweep did not finish (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    results = {}
    for name, cmd in cases.items():
        status = [json.loads((out / "_status" / f"{name}.rank{r}.json").read_text())
                  for r in range(nproc)]
        code = next((s["code"] for s in status if s["code"]), 0)
        result = judge(out / name, command=cmd, code=code,
                       accumulation_steps=(ks or {}).get(name, k))
        report = json.loads(json.dumps(result.report, default=str))  # as --json writes it
        ran = Ran(code, "".join(s["stdout"] for s in status),
                  "".join(s["stderr"] for s in status))
        results[name] = Watched(result.exit_code, report.get("findings", []), report, ran)
    return results


def python_command(script: Path | str, *args: str) -> list[str]:
    return [sys.executable, str(script), *args]


def torchrun_modes(tmp: Path, script_text: str, modes: tuple[str, ...]) -> dict[str, Watched]:
    """``script_text`` written to ``tmp`` and run once per mode (its first argument) under
    ``torchrun --nproc-per-node 2``, all in one launch (:func:`watch_many`)."""
    script = tmp / "script.py"
    script.write_text(script_text)
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
              "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script)]
    return watch_many(tmp / "runs", {m: [*launch, m] for m in modes})
