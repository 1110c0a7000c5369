"""Unit tests of the lint heuristics, the suppression comments, the output formats and the CLI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from accumguard.cli.lint import lint_main
from accumguard.static import RULES
from accumguard.static.lint import LintError, lint_source


def codes(src: str) -> list[tuple[str, int]]:
    return [(f.code, f.line or 0) for f in lint_source(textwrap.dedent(src))]


BUGGY = """\
grad_accum_steps = 4
for i, batch in enumerate(loader):
    loss = model(batch) / grad_accum_steps
    loss.backward()
    optimizer.step()
"""


# ---------------------------------------------------------------- heuristics


def test_plain_loop_without_accumulation_is_clean() -> None:
    assert codes(
        """
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
            scheduler.step()
        """
    ) == []


def test_unguarded_step_with_accumulation_is_ag101() -> None:
    assert codes(BUGGY) == [("AG101", 5)]


def test_logging_modulo_is_not_accumulation_evidence() -> None:
    assert codes(
        """
        for i, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = crit(model(x), y)
            loss.backward()
            optimizer.step()
            if i % 100 == 0:
                print(loss.item())
        """
    ) == []


@pytest.mark.parametrize(
    "guard",
    [
        "if (i + 1) % K == 0:",
        "if accelerator.sync_gradients:",
        "if is_last:",
        "if engine.is_gradient_accumulation_boundary():",
        "if micro_step == grad_accum - 1:",
        "if i == len(loader) - 1:",
        "if ready:",  # a flag derived from a modulo below
    ],
)
def test_boundary_guards_are_recognised(guard: str) -> None:
    src = f"""
    grad_accum = K = 4
    for i, batch in enumerate(loader):
        ready = (i + 1) % K == 0
        is_last = ready
        (model(batch) / K).backward()
        {guard}
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    """
    assert codes(src) == []


def test_early_continue_guard() -> None:
    assert codes(
        """
        for i, b in enumerate(loader):
            (model(b) / accum_steps).backward()
            if (i + 1) % accum_steps:
                continue
            optimizer.step()
            optimizer.zero_grad()
        """
    ) == []


def test_non_boundary_if_does_not_guard() -> None:
    assert codes(
        """
        for i, b in enumerate(loader):
            (model(b) / accum_steps).backward()
            if not args.dry_run:
                optimizer.step()
        """
    ) == [("AG101", 5)]


def test_one_root_cause_one_finding() -> None:
    # step, scheduler, clip and zero_grad all per micro-step: only AG101 is reported
    assert codes(
        """
        for b in loader:
            (model(b) / gradient_accumulation_steps).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
        """
    ) == [("AG101", 5)]


def test_env_step_and_unknown_receivers_are_not_optimizer_steps() -> None:
    assert codes(
        """
        for t in range(accum_steps):
            obs, r, done, _ = env.step(action)
            loss.backward()
            self.step()
        """
    ) == []


def test_steps_in_nested_function_are_not_in_the_window() -> None:
    assert codes(
        """
        for b in loader:
            (model(b) / accum).backward()
            def later():
                optimizer.step()
        """
    ) == []


def test_model_zero_grad_inside_accelerate_accumulate() -> None:
    assert codes(
        """
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(batch).loss)
                optimizer.step()
                optimizer.zero_grad()
                model.zero_grad()
        """
    ) == [("AG102", 7)]


def test_mean_of_means_needs_token_hint() -> None:
    base = """
    for i, b in enumerate(loader):
        loss = F.cross_entropy(model(b), b.y{kw})
        loss = loss / grad_accum_steps
        loss.backward()
        if (i + 1) % grad_accum_steps == 0:
            optimizer.step()
    """
    assert codes(base.format(kw="")) == []
    assert codes(base.format(kw=", ignore_index=-100")) == [("AG104", 4)]
    assert codes(base.format(kw=", ignore_index=-100, reduction='sum'")) == []


def test_finding_fields_are_complete() -> None:
    (f,) = lint_source(BUGGY, path="train.py")
    assert f.path == "train.py" and f.line == 5 and f.col == 5
    assert f.severity.value == "error" and f.failure_class == "F1"
    assert "optimizer.step()" in f.message and f.fix == RULES["AG101"].fix


# ---------------------------------------------------------------- robustness


@pytest.mark.parametrize(
    "src",
    [
        "",
        "x = 1\n",
        "async def f():\n    async for b in it:\n        await b.backward()\n        opt.step()\n",
        "while True:\n    (a % b).backward()\n    x[0].step()\n",
        "for x in y: f()(g).backward(); (lambda: o.step())()\n",
        "with a.no_sync():\n    loss.backward()\n",
        "dist.all_reduce()\ndist.all_reduce(*grads)\n",
        "m.require_backward_grad_sync = True\n",
        "def training_step(self, b):\n    self.manual_backward(b)\n    self.optimizers()[0].step()\n",
    ],
)
def test_odd_but_valid_python_does_not_crash(src: str) -> None:
    lint_source(src, prefilter=False)


def test_syntax_error_is_a_lint_error_with_position() -> None:
    with pytest.raises(LintError) as info:
        lint_source("for x in y:\nprint(x)\n", path="bad.py")
    assert (info.value.path, info.value.line) == ("bad.py", 2)
    assert "SyntaxError" in info.value.message


# ---------------------------------------------------------------- suppression


def test_suppression_comment_specific_code() -> None:
    src = BUGGY.replace("optimizer.step()", "optimizer.step()  # accumguard: ignore[AG101]")
    assert codes(src) == []


def test_suppression_comment_other_code_keeps_finding() -> None:
    src = BUGGY.replace("optimizer.step()", "optimizer.step()  # accumguard: ignore[AG102, AG103]")
    assert codes(src) == [("AG101", 5)]


def test_bare_suppression_comment_silences_all() -> None:
    src = BUGGY.replace("optimizer.step()", "optimizer.step()  # accumguard: ignore")
    assert codes(src) == []


def test_suppression_text_inside_string_is_not_a_comment() -> None:
    src = BUGGY.replace("optimizer.step()", "optimizer.step('# accumguard: ignore')")
    assert codes(src) == [("AG101", 5)]


# ---------------------------------------------------------------- CLI and formats


@pytest.fixture
def buggy(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    p.write_text(BUGGY, encoding="utf-8")
    return p


def test_cli_text_output_and_exit_code(buggy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lint_main([str(buggy)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{buggy}:5:5: AG101 ")
    assert out[1].startswith("  help: ")


def test_cli_concise(buggy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lint_main([str(buggy), "--format", "concise"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{buggy}:5:5: AG101 ") and not lines[1].startswith("  ")


def test_cli_clean_exit_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "ok.py"
    p.write_text("print('hi')\n", encoding="utf-8")
    assert lint_main([str(p)]) == 0
    assert capsys.readouterr().out == ""


def test_cli_directory(buggy: Path) -> None:
    assert lint_main([str(buggy.parent)]) == 1


def test_cli_json(buggy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lint_main([str(buggy), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1 and doc["tool"] == "accumguard lint"
    (item,) = doc["findings"]
    assert item["code"] == "AG101" and item["line"] == 5 and item["column"] == 5
    assert item["severity"] == "error" and item["failure_class"] == "F1"
    assert item["fix"] and item["message"] and item["path"] == str(buggy)


def test_cli_sarif(buggy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lint_main([str(buggy), "--format", "sarif"]) == 1
    log = json.loads(capsys.readouterr().out)
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    assert run["tool"]["driver"]["name"] == "accumguard"
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == ["AG101"]
    (res,) = run["results"]
    assert res["ruleId"] == "AG101" and res["level"] == "error" and res["ruleIndex"] == 0
    region = res["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (5, 5)


def test_cli_select_and_ignore(buggy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lint_main([str(buggy), "--ignore", "AG101"]) == 0
    assert lint_main([str(buggy), "--select", "AG102,AG103"]) == 0
    assert lint_main([str(buggy), "--select", "AG1"]) == 1
    assert lint_main([str(buggy), "--select", "AG1", "--ignore", "AG10"]) == 0
    capsys.readouterr()


def test_cli_unknown_code_is_usage_error(buggy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lint_main([str(buggy), "--select", "XX9"]) == 2
    assert "unknown rule code" in capsys.readouterr().err


def test_cli_syntax_error_exit_2(tmp_path: Path, buggy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n    pass\n", encoding="utf-8")
    assert lint_main([str(bad), str(buggy)]) == 2
    cap = capsys.readouterr()
    assert cap.err.startswith(f"{bad}:1:") and "SyntaxError" in cap.err
    assert "AG101" in cap.out  # the other files are still reported


def test_cli_missing_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lint_main([str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_cli_no_args_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert lint_main([]) == 2
    capsys.readouterr()


def test_cli_output_file(buggy: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert lint_main([str(buggy), "--format", "json", "-o", str(out)]) == 1
    assert json.loads(out.read_text())["findings"][0]["code"] == "AG101"


def test_every_rule_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text(encoding="utf-8")
    for code in RULES:
        assert f"## {code}" in doc, f"{code} missing from docs/rules.md"


def test_itertools_accumulate_is_not_accumulation_evidence() -> None:
    assert codes(
        """
        from itertools import accumulate
        offsets = list(accumulate(sizes))
        for x, y in loader:
            optimizer.zero_grad()
            crit(model(x), y).backward()
            optimizer.step()
        """
    ) == []


@pytest.mark.parametrize("stage", [0, 1, 2, 3, None])
def test_deepspeed_config_found_from_dict_literal(stage: int | None) -> None:
    zero = "" if stage is None else f', "zero_optimization": {{"stage": {stage}}}'
    src = f"""
    import deepspeed
    engine, _, _, _ = deepspeed.initialize(model=m, config={{"train_batch_size": 8,
        "gradient_clipping": 0.0{zero}}})
    for i, b in enumerate(loader):
        engine.backward(engine(b))
        if (i + 1) % 4 == 0:
            engine.step()
    """
    # ZeRO-1/2 keep the last micro-batch only with GA 1; ZeRO-0 (the default) and 3 are right
    assert codes(src) == ([("AG109", 8)] if stage in (1, 2) else [])


def test_deepspeed_managed_false_is_the_documented_fix() -> None:
    src = """
    import deepspeed
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
           "zero_optimization": {"stage": 2}, "managed_gradient_accumulation": False}
    engine, _, _, _ = deepspeed.initialize(model=m, config=cfg)
    for i, b in enumerate(loader):
        engine.backward(engine(b))
        if (i + 1) % 4 == 0:
            engine.step()
    """
    assert codes(src) == []
    assert codes(src.replace("False", "True")) == [("AG109", 9)]


def test_config_checks_apply_to_dict_literals() -> None:
    src = """
    import deepspeed
    ds_config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 8,
        "train_batch_size": 30,
        "zero_optimization": {"stage": 1},
    }
    engine, _, _, _ = deepspeed.initialize(model=m, config=ds_config)
    """
    # batch arithmetic (no W fits 30 = 4 x 8 x W) at its key's line; clipping unset at the dict
    assert codes(src) == [("AG203", 3), ("AG201", 6)]
    fixed = src.replace('"train_batch_size": 30,', '"train_batch_size": 64, "gradient_clipping": 0.0,')
    assert codes(fixed) == []
    # computed values are not judged, a **spread hides keys: no absence-based finding
    assert codes(src.replace('"train_batch_size": 30,', '"train_batch_size": args.tbs, **extra,')) == []
    # a key set after the literal counts
    later = src.replace("    engine, _", '    ds_config["gradient_clipping"] = 1.0\n    engine, _').replace(
        '"train_batch_size": 30,', "")
    assert codes(later) == []


def test_deepspeed_without_config_in_sight_is_not_guessed() -> None:
    src = """
    import deepspeed
    engine, _, _, _ = deepspeed.initialize(model=m, config=args.ds_config)
    for i, b in enumerate(loader):
        engine.backward(engine(b))
        if (i + 1) % 4 == 0:
            engine.step()
    """
    assert codes(src) == []


def test_all_reduce_in_library_code_is_not_checked() -> None:
    # tensor parallelism sums grad_input on purpose; no training loop in the file
    assert codes(
        """
        def backward(ctx, grad_output):
            dist.all_reduce(grad_output)
            return grad_output
        """
    ) == []


def test_manual_reduction_on_the_non_ddp_branch_is_fine() -> None:
    assert codes(
        """
        model = DDP(net) if use_ddp else net
        for x in loader:
            model(x).sum().backward()
            if not use_ddp:
                for p in net.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= world_size
            optimizer.step()
        """
    ) == []
