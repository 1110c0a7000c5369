"""``accumguard advise`` end to end on 2 gloo ranks: DDP with ``no_sync`` around the backward
only (a deferral that does nothing), every mode measured, the deferred one recommended,
the user's files untouched. One advise run (3 torchrun launches) for the whole module.

The DDP run is the real ``python -m accumguard.cli advise`` process; the other runs call the
same CLI entry point (``accumguard.cli.main``) in this process, with the environment a
launched CLI gets (``helpers.launcher_env``): each still launches its command once per mode
(torchrun, the ``deepspeed`` launcher, ``python``), without one more Python + torch start-up
for the CLI itself (2.4 s of CPU each, 44 s of wall at a load of 14)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_watch import SCRIPTS

from accumguard.advise import candidates, not_applicable
from accumguard.cli.advise import parse_bytes

from helpers import free_port, launcher_env

SCRIPT = SCRIPTS / "advise_train.py"
PARAM_BYTES = (32 * 256 + 256 + 256 * 256 + 256 + 256 * 8 + 8) * 4


def _sha() -> str:
    return hashlib.sha256(SCRIPT.read_bytes()).hexdigest()


@pytest.fixture
def advise(accumguard_cli: Any) -> Any:
    """``advise(*args)`` -> (exit code, what the CLI printed on stdout then stderr):
    ``accumguard advise ARGS`` run through the CLI's entry point in this process, under a
    launched CLI's environment (conftest's ``accumguard_cli``)."""

    def run(*args: str) -> tuple[int, str]:
        code, out, err = accumguard_cli("advise", *args)
        return code, out + err

    return run


@pytest.fixture(scope="module")
def ddp_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("advise")
    before = _sha()
    report = tmp / "advise.json"
    for _ in range(2):  # once more after gloo's known teardown abort / a port taken meanwhile
        cmd = [sys.executable, "-m", "accumguard.cli", "advise", "--steps", "6", "--json",
               str(report), "--memory-budget", "100GB", "--", sys.executable, "-m",
               "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(free_port()), str(SCRIPT), "--engine", "ddp"]
        proc = subprocess.run(cmd, env=launcher_env(), capture_output=True, text=True,
                              timeout=900)
        if proc.returncode == 0:
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _sha() == before, "advise changed the user's script"
    data: dict[str, Any] = json.loads(report.read_text())
    data["stdout"] = proc.stdout
    return data


def test_every_ddp_mode_is_measured(ddp_report: dict[str, Any]) -> None:
    modes = {m["mode"]: m for m in ddp_report["modes"]}
    assert list(modes) == ["as-written", "ddp-every", "ddp-deferred"]
    assert ddp_report["engine"] == "ddp" and ddp_report["accumulation_steps"] == 4
    for m in modes.values():
        assert m["error"] is None, m
        assert m["seconds_per_step"]["steps"] == 5 and m["seconds_per_step"]["median"] > 0
        assert m["updates_equal"] is True and m["update_rel_diff"] <= 1e-4, m
        assert m["memory_kind"] == "peak RSS (CPU)" and m["peak_memory_bytes"] > 0
    # the ledger's closed form: no_sync around the backward does nothing (4 all-reduces of
    # the whole gradient per step, as syncing every micro-step); deferred: one
    for name, calls in (("as-written", 4), ("ddp-every", 4), ("ddp-deferred", 1)):
        assert modes[name]["gradient_collectives_per_step"] == calls
        assert modes[name]["gradient_bytes_per_step"] == calls * PARAM_BYTES


def test_a_deferred_mode_is_recommended(ddp_report: dict[str, Any]) -> None:
    """Deferring saves 3 all-reduces of the whole gradient per step. The recommendation is
    the fastest mode with equal updates unless the timings cannot separate it from a mode
    that moves fewer bytes (that mode's median inside the fastest's min-max): then the
    fewer bytes win. On this 2-core machine a few steps spread 2-5x, so the deferred mode
    is recommended unless it was measured clearly slower, and the report says why."""
    modes = {m["mode"]: m for m in ddp_report["modes"]}
    best = ddp_report["recommended"]["mode"]
    fastest = min((m for m in modes.values() if m["updates_equal"]),
                  key=lambda m: m["seconds_per_step"]["median"])
    assert f"recommended: {best}" in ddp_report["stdout"]
    deferred = modes["ddp-deferred"]["seconds_per_step"]
    if deferred["median"] <= fastest["seconds_per_step"]["max"]:
        assert best == "ddp-deferred", ddp_report["stdout"]
        assert "no_sync" in ddp_report["recommended"]["how"]
        if fastest["mode"] != best:
            assert "do not separate" in ddp_report["recommended"]["basis"]
    else:
        assert best == fastest["mode"], ddp_report["stdout"]


def test_choose_breaks_timing_ties_by_bytes() -> None:
    """In-process: a tie on time goes to the fewest bytes and says why; a mode clearly
    faster wins on time even when it moves more."""
    from accumguard.advise._modes import candidates
    from accumguard.advise.run import ModeResult, choose

    modes = {m.name: m for m in candidates("ddp")}

    def res(name: str, secs: list[float], grad_bytes: float) -> ModeResult:
        return ModeResult(modes[name], seconds=secs, grad_bytes=grad_bytes, peak_bytes=1)

    every = res("as-written", [0.018, 0.024, 0.062], 4e5)
    deferred = res("ddp-deferred", [0.021, 0.049, 0.094], 1e5)
    best, basis = choose([every, deferred])
    assert best is deferred and "do not separate" in basis and "1e+05 B" in basis
    slow = res("ddp-deferred", [0.07, 0.08, 0.09], 1e5)
    assert choose([every, slow]) == (every, "fastest median")
    assert choose([]) == (None, "")
    # a tie on time and on bytes, the other mode's peak a few bytes lower (a CI run's
    # "fewest bytes (1.22e+06 B against 1.22e+06 B)"): the fastest stays
    twin = ModeResult(modes["ddp-every"], seconds=[0.017, 0.024, 0.049], grad_bytes=4e5,
                      peak_bytes=0)
    assert choose([every, twin]) == (every, "fastest median")


def test_fsdp2_modes(tmp_path: Path, advise: Any) -> None:
    """FSDP2 never deferring (3 groups): every mode measured with equal updates; deferring
    cuts the reduce-scatters to one per group per step, the unsharded window also the
    all-gathers (one round per window instead of two per micro-step)."""
    report = tmp_path / "advise.json"
    code, out = advise("--steps", "4", "--json", str(report), "--", sys.executable, "-m",
                       "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                       "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT),
                       "--engine", "fsdp2")
    assert code == 0, out
    modes = {m["mode"]: m for m in json.loads(report.read_text())["modes"]}
    assert list(modes) == ["as-written", "fsdp2-every", "fsdp2-deferred", "fsdp2-unsharded"]
    assert all(m["updates_equal"] for m in modes.values()), modes
    got = {k: (m["gradient_collectives_per_step"], m["parameter_collectives_per_step"])
           for k, m in modes.items()}
    assert got == {"as-written": (12, 24), "fsdp2-every": (12, 24),
                   "fsdp2-deferred": (3, 24), "fsdp2-unsharded": (3, 3)}, got
    assert modes["fsdp2-deferred"]["gradient_bytes_per_step"] == PARAM_BYTES


def test_modes_and_reasons() -> None:
    assert [m.name for m in candidates("fsdp2")] == ["as-written", "fsdp2-every",
                                                     "fsdp2-deferred", "fsdp2-unsharded"]
    assert "no window" in (not_applicable("ddp", 1) or "")
    assert "DeepSpeed" in (not_applicable("deepspeed", 4) or "")
    assert not_applicable("deepspeed", 4, 2) is None
    assert [m.name for m in candidates("deepspeed", 2)] == [
        "as-written", "ds-coalesced", "ds-contiguous-gradients-off",
        "ds-coalesced-contiguous-off", "ds-overlap-comm-on"]
    assert [m.name for m in candidates("deepspeed", 3)] == [
        "as-written", "ds-coalesced", "ds-overlap-comm-on", "ds-z3-params-persistent"]
    assert not_applicable("ddp", 4) is None
    assert parse_bytes("8GB") == 8 * 10 ** 9 and parse_bytes("1MiB") == 2 ** 20


def test_usage_errors_and_a_single_process_command(tmp_path: Path, advise: Any) -> None:
    """No command, a bad size, a failing command: exit 2. One process without DDP/FSDP2:
    measured as written, and the report says why no mode applies."""
    for extra in ([], ["--memory-budget", "lots", "--", "python", "x.py"],
                  ["--", sys.executable, "-c", "raise SystemExit(3)"]):
        code, out = advise(*extra)
        assert code == 2, (extra, out)
    script = tmp_path / "local.py"
    script.write_text(
        "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(12):\n    (m(torch.randn(3, 4)).sum() / 4).backward()\n"
        "    if (i + 1) % 4 == 0:\n        opt.step()\n        opt.zero_grad()\n")
    code, out = advise("--steps", "3", "--", sys.executable, str(script))
    assert code == 0, out
    assert "no other mode applies: one process without DDP/FSDP2/DeepSpeed" in out
    assert "recommended: as-written" in out


#: ds_train.py's model: Linear(8, 32) and Linear(32, 1), fp32
DS_PARAM_BYTES = (8 * 32 + 32 + 32 + 1) * 4


def _ds_advise(advise: Any, tmp_path: Path, stage: int, modes: list[str],
               launcher: list[str]) -> dict[str, dict[str, Any]]:
    """``advise --only MODES`` on ds_train.py's native accumulation (config GA = K = 4):
    the command as written and the given modes, one launch each; the script untouched."""
    pytest.importorskip("deepspeed")
    ds_script = SCRIPTS / "ds_train.py"
    before = hashlib.sha256(ds_script.read_bytes()).hexdigest()
    report = tmp_path / "advise.json"
    # --timeout: each run is ~30-60 s quiet; a loaded CI machine took > 600 s for one (2026-12-06)
    code, out = advise("--steps", "3", "--timeout", "1500", "--json", str(report), "--only", *modes,
                       "--",
                       *launcher, str(ds_script), "--mode", "native", "--stage", str(stage))
    assert code == 0, out
    assert hashlib.sha256(ds_script.read_bytes()).hexdigest() == before
    data = json.loads(report.read_text())
    assert data["engine"] == "deepspeed" and data["accumulation_steps"] == 4
    assert data["recommended"] is not None, out
    return {m["mode"]: m for m in data["modes"]}


def test_deepspeed_zero2_coalesced_without_contiguous_gradients(tmp_path: Path,
                                                                 advise: Any) -> None:
    """DeepSpeed ZeRO-2 native accumulation: the whole gradient reduced inside each of the
    4 backwards; coalesced (entered from outside, with ``contiguous_gradients: false`` set
    in the config DeepSpeed reads): once per step, the same updates. accumguard's own
    deferred path is listed with why it is not run. (2 launches; the config-only modes go
    through the same config door.)"""
    modes = _ds_advise(advise, tmp_path, 2, ["ds-coalesced-contiguous-off"],
                       ["deepspeed", "--num_gpus", "2", "--master_port", str(free_port())])
    assert list(modes) == ["as-written", "ds-coalesced-contiguous-off", "accumguard-deferred"]
    for name in ("as-written", "ds-coalesced-contiguous-off"):
        assert modes[name]["error"] is None and modes[name]["updates_equal"] is True, modes
        assert modes[name]["memory_kind"] == "peak RSS (CPU)"
    assert modes["as-written"]["gradient_bytes_per_step"] == 4 * DS_PARAM_BYTES
    # one reduction pass of the summed gradient (and a scalar of DeepSpeed's own)
    got = modes["ds-coalesced-contiguous-off"]["gradient_bytes_per_step"]
    assert DS_PARAM_BYTES <= got < DS_PARAM_BYTES + 64, got
    assert modes["accumguard-deferred"]["error"].startswith("not run: it replaces the training")


def test_deepspeed_zero3_parameters_kept_and_coalesced(tmp_path: Path, advise: Any) -> None:
    """ZeRO-3 native accumulation against every parameter kept gathered
    (``stage3_param_persistence_threshold`` set in the config DeepSpeed reads) and against
    DeepSpeed's coalesced reduction entered from outside: both applied, measured, the
    updates equal (torchrun launcher). ds_train.py's 321 parameters are already under
    DeepSpeed's default threshold (1e5), so the gathers per step do not change with the
    threshold (4 in both: measured); coalesced reduces once per step instead of in each of
    the 4 backwards."""
    modes = _ds_advise(advise, tmp_path, 3, ["ds-coalesced", "ds-z3-params-persistent"],
                       [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-addr", "127.0.0.1", "--master-port", str(free_port())])
    assert list(modes) == ["as-written", "ds-coalesced", "ds-z3-params-persistent",
                           "accumguard-deferred"]
    for name in ("as-written", "ds-coalesced", "ds-z3-params-persistent"):
        assert modes[name]["error"] is None and modes[name]["updates_equal"] is True, modes
    base, kept = modes["as-written"], modes["ds-z3-params-persistent"]
    assert kept["parameter_collectives_per_step"] == base["parameter_collectives_per_step"]
    coalesced = modes["ds-coalesced"]
    assert coalesced["gradient_bytes_per_step"] < base["gradient_bytes_per_step"] / 2, modes
