"""``accumguard audit`` in-process: exit codes, key lines of the table, the JSON schema.

The setup and loops below are what a user writes in their own file; the CLI loads
them by file path and by dotted module name (this module is importable as
``test_cli_audit`` because tests/ is on sys.path).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import accumguard.cli.report
import accumguard.verify
from accumguard.cli.audit import audit_main
from accumguard.demo.toy import TokenMLP, count_tokens, make_rank_batches, token_loss
from accumguard.verify.contract import AuditSetup, LoopContext

K = 2
SCHEMA = json.loads((Path(accumguard.verify.__file__).parent / "audit.schema.json").read_text())


def _validate(doc: dict) -> None:
    from verify.schema_check import validate

    validate(doc, SCHEMA)


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    return TokenMLP()


def _opt(params):  # noqa: ANN001, ANN201
    return torch.optim.SGD(params, lr=0.5)


def _data(rank: int, world: int) -> list:
    return make_rank_batches(seed=9, world_size=world, micro_batches=4)[rank]


def make_setup() -> AuditSetup:
    return AuditSetup(build_model=_model, make_optimizer=_opt, rank_batches=_data,
                      loss_fn=token_loss, accumulation_steps=K, count_fn=count_tokens)


SETUP = make_setup()


def good_loop(ctx: LoopContext) -> None:
    model = DDP(ctx.model)
    opt = ctx.make_optimizer(model.parameters())
    k = ctx.accumulation_steps
    for start in range(0, len(ctx.batches), k):
        window = ctx.batches[start:start + k]
        n = torch.tensor(float(sum(int(count_tokens(b)) for b in window)))
        dist.all_reduce(n)
        for j, batch in enumerate(window):
            with contextlib.nullcontext() if j == len(window) - 1 else model.no_sync():
                loss, _ = ctx.loss_fn(model, batch)
                (loss * ctx.world_size / n).backward()
        opt.step()
        opt.zero_grad()


def mean_of_means_loop(ctx: LoopContext) -> None:
    model = DDP(ctx.model)
    opt = ctx.make_optimizer(model.parameters())
    k = ctx.accumulation_steps
    for i, batch in enumerate(ctx.batches):
        last = (i + 1) % k == 0
        with contextlib.nullcontext() if last else model.no_sync():
            loss, n = ctx.loss_fn(model, batch)
            (loss / n / k).backward()
        if last:
            opt.step()
            opt.zero_grad()


def raising_loop(ctx: LoopContext) -> None:
    if ctx.rank == 1:
        raise ValueError("boom from the user's loop")
    dist.barrier()


def test_a_correct_loop_exits_0_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "report.json"
    code = audit_main([f"{__file__}:make_setup", f"{__file__}:good_loop", "--steps", "1",
                       "--json", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "PASS" in text and "good_loop" in text and "engine=ddp" in text
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 2 and doc["passed"] is True
    _validate(doc)
    rep = doc["reports"]["good_loop"]
    assert rep["optimizer_steps"] == rep["reference_steps"] == 1  # --steps 1
    for key in ("tolerance", "tolerance_reason", "steps", "totals", "first_divergence",
                "diagnosis", "losses", "notes", "failures", "max_update_error"):
        assert key in rep
    step = rep["steps"][0]
    assert step["update_error"] <= 1e-5
    assert step["counts"]["backward"] == K and step["counts"]["grad_collective_rounds"] == 1


def test_a_broken_loop_exits_1_with_diagnosis(tmp_path, capsys, monkeypatch) -> None:
    # Plain-text fallback, as printed when rich is not installed.
    monkeypatch.setattr(accumguard.cli.report, "_rich_console", lambda file: None)
    out = tmp_path / "report.json"
    code = audit_main(["audit", "test_cli_audit:SETUP", "test_cli_audit:mean_of_means_loop",
                       "--fp32-reference", "--json", str(out), "--world-size", "2"])
    text = capsys.readouterr().out
    assert code == 1, text
    assert text.startswith("FAIL  mean_of_means_loop")
    assert "first divergence: step 0" in text
    assert "diagnosis: F5" in text and "fix:" in text
    assert "float32 reference" in text
    doc = json.loads(out.read_text())
    _validate(doc)
    rep = doc["reports"]["mean_of_means_loop"]
    assert rep["passed"] is False and rep["diagnosis"]["bug_id"] == "F5"
    assert rep["reference_dtype"] == "float32"


def test_a_raising_rank_exits_2_naming_the_rank(capsys) -> None:
    code = audit_main(["test_cli_audit:SETUP", "test_cli_audit:raising_loop", "--timeout", "60",
                       "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "rank 1" in err and "boom from the user's loop" in err


@pytest.mark.parametrize("argv, message", [
    (["nocolon", "x:y"], "expected MODULE:NAME"),
    (["no_such_module_xyz:SETUP", "test_cli_audit:good_loop"], "No module named"),
    (["test_cli_audit:NOPE", "test_cli_audit:good_loop"], "has no attribute"),
    (["test_cli_audit:K", "test_cli_audit:good_loop"], "expected an AuditSetup"),
    (["test_cli_audit:SETUP", "test_cli_audit:K"], "not a function"),
])
def test_bad_arguments_exit_2(argv, message, capsys) -> None:
    assert audit_main(argv) == 2
    assert message in capsys.readouterr().err


def test_help_exits_0(capsys) -> None:
    assert audit_main(["--help"]) == 0
    assert "MODULE:SETUP" in capsys.readouterr().out
