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
    # no error (GA 1 on ZeRO-0/3 would be right); a warning naming the configs that are wrong
    assert [(f.code, f.severity.value) for f in lint_source(textwrap.dedent(src))] == [("AG139", "warning")]


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


# ---------------------------------------------------------------- registry and catalogue


def test_every_script_code_has_a_check_and_families_are_modules() -> None:
    from accumguard.static.lint.registry import all_checks

    checks = all_checks()
    owners: dict[str, list[str]] = {}
    for c in checks:
        for code in c.codes:
            owners.setdefault(code, []).append(c.name)
    script_codes = [c for c in RULES if c.startswith("AG1")]
    assert all(owners.get(c) for c in script_codes), owners
    assert {c.family for c in checks} == {"window", "schedule", "loss", "sync", "reduce", "deepspeed",
                                          "accelerate", "scale", "horizon", "precision", "terms",
                                          "tokenmean", "lrcounter", "epochtail", "moeaux", "twice", "ampclip",
                                          "hfscale", "fused", "hookclip", "hftokens", "tailscale", "hfterms",
                                          "lgmanual", "lgstep", "lgwindow", "unclearedopt", "tokhorizon",
                                          "factored", "microstat", "prefetch", "hookgrad", "resume", "synctail", "dsbatch", "dssched", "hookreduce", "hfmean", "fsdproot", "fsdpunits", "gradwrite", "acctail", "emastep", "commhook", "clipgrads", "accloader",
                                          "syncclip", "syncorder", "wrapgate", "dphorizon", "spawnworld", "hfclip", "unreduced", "argdrop", "dsstep", "wrapbypass", "lowbuffer", "stephorizon", "tempreduce", "syncwhole", "lgkschedule", "dsblocks", "hfsuper", "dsunmanaged", "hfmodel", "chunktail", "tokiters", "lgunsplit", "dszero", "cliporder", "funcclip", "hfwarmup", "hfsetters", "dslateflag", "probebackward", "fabricbypass", "fracepoch", "resumeskip", "lastpass", "meancount", "fsdpfactor", "gatedclip", "hfheld", "coefstep", "handhorizon", "kworld", "hflossfunc", "acctwice", "fabricunset", "plainheads", "lateunfreeze", "latemodule", "hookcount", "unregistered", "accstep", "uncalled", "droppedwrap"}


def test_select_is_applied_before_rules_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from accumguard.static.lint import registry

    def explode(ctx: object) -> list[object]:
        raise AssertionError("an unselected rule ran")

    checks = registry.all_checks()
    monkeypatch.setattr(registry, "all_checks", lambda: [*checks, registry.Check(("AG105",), "test", explode)])
    assert [f.code for f in lint_source(BUGGY, select=["AG101"])] == ["AG101"]
    assert lint_source(BUGGY, select=["AG1"], ignore=["AG105", "AG101"]) == []
    with pytest.raises(LintError, match="unselected rule ran"):  # (a rule's failure: reported)
        lint_source(BUGGY, select=["AG105"])
    names = {c.name for c in registry.selected_checks(["AG11"], None)}
    assert names == {
        "sync_flag_polarity", "forward_always_under_no_sync", "whole_window_under_no_sync", "loss_divided_by_world_under_ddp",
        "rank_local_token_mean_under_ddp", "no_sync_beside_a_conditional_one",
        "scheduler_per_process", "engine_gating", "boundary_counter_off_by_one",
        "sync_flag_after_forward", "partial_window_leaks_into_next_epoch",
        "hf_compute_loss_ignores_num_items", "hf_compute_loss_func_ignores_num_items",
        "hf_compute_loss_falls_back_to_micro_mean",
        "scheduler_in_micro_step_hook", "lightning_manual_batch_idx_off_by_one",
        "lightning_manual_epoch_tail", "deepspeed_boundary_off_by_one"}


def test_registry_refuses_codes_outside_the_catalogue() -> None:
    from accumguard.static.lint.registry import rule

    with pytest.raises(ValueError, match="AG999"):
        rule("AG999")(lambda ctx: [])


def test_failure_class_words_come_from_the_taxonomy() -> None:
    from accumguard.core import taxonomy

    for r in RULES.values():
        if r.failure_class:
            assert r.failure_class in taxonomy.TAXONOMY
            assert r.class_title == taxonomy.TAXONOMY[r.failure_class].title
    assert RULES["AG110"].failure_class == "F14"
    (f,) = lint_source(BUGGY)
    assert f.class_title == taxonomy.title("F1")


def test_lint_error_is_part_of_the_hierarchy() -> None:
    from accumguard.core.errors import AccumguardError, ConfigError

    with pytest.raises(AccumguardError) as info:
        lint_source("def f(:\n", path="x.py")
    assert isinstance(info.value, LintError) and isinstance(info.value, ConfigError)
    assert (info.value.path, info.value.line) == ("x.py", 1)


# ---------------------------------------------------------------- issue 11: false alarms and misses


def test_k1_loop_summing_losses_is_not_accumulation() -> None:
    src = """
    for batch in loader:
        optimizer.zero_grad()
        loss = 0
        for micro_batch in batch.split(micro_bs):
            loss += model(micro_batch).mean()
        loss.backward()
        optimizer.step()
    """
    assert codes(src) == []
    # the same loop with a backward per micro-batch and a step per micro-batch is F1
    bad = src.replace("            loss += model(micro_batch).mean()\n        loss.backward()",
                      "            (model(micro_batch).mean() / n_micro).backward()\n            optimizer.step()")
    assert [c for c, _ in codes(bad)] == ["AG101"]


def test_in_place_division_on_data_counts_as_averaging() -> None:
    src = """
    world = dist.get_world_size()
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad.data)
            p.grad.data /= world
        optimizer.step()
    """
    assert codes(src) == []
    assert [c for c, _ in codes(src.replace("            p.grad.data /= world\n", ""))] == ["AG107"]


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("micro == K - 1", []),
        ("micro < K - 1", ["AG111"]),
        ("not is_last", ["AG111"]),
        ("is_last", []),
        ("(micro + 1) % K != 0", ["AG111"]),
        ("(micro + 1) % K == 0", []),
        ("some_helper(micro)", []),  # unknown polarity: no guess
    ],
)
def test_sync_flag_polarity(flag: str, expected: list[str]) -> None:
    src = f"""
    fully_shard(model)
    for step in range(steps):
        for micro in range(K):
            is_last = micro == K - 1
            model.set_requires_gradient_sync({flag})
            (model(next(it)).sum() / K).backward()
        optimizer.step()
        optimizer.zero_grad()
    """
    assert [c for c, _ in codes(src)] == expected


def test_loss_divided_by_world_only_under_ddp_and_only_when_backpropagated() -> None:
    src = """
    model = DDP(net)
    world_size = dist.get_world_size()
    for x, y in loader:
        loss = crit(model(x), y) / world_size
        loss.backward()
        optimizer.step()
    """
    assert [c for c, _ in codes(src)] == ["AG112"]
    assert codes(src.replace("model = DDP(net)", "model = net")) == []
    logging = src.replace("loss = crit(model(x), y) / world_size\n        loss.backward()",
                          "loss = crit(model(x), y)\n        loss.backward()\n        shown = loss.item() / world_size")
    assert codes(logging) == []


def test_scheduler_per_process() -> None:
    src = """
    for batch in loader:
        loss.backward()
        optimizer.step()
        for _ in range(accelerator.num_processes):
            lr_scheduler.step()
    """
    assert [c for c, _ in codes(src)] == ["AG114"]
    assert codes(src.replace("range(accelerator.num_processes)", "range(2, n_layers)")) == []


@pytest.mark.parametrize(
    ("test", "expected"),
    [
        ("(i + 1) % K == 0", ["AG111"]),  # no_sync on the last micro-step: inverted
        ("(i + 1) % K != 0", []),
        ("i % K == 0", []),  # the *first* micro-step (a counter from 0): polarity unknown
        ("not is_last", []),
        ("is_last", ["AG111"]),
    ],
)
def test_no_sync_chosen_on_the_boundary_is_inverted(test: str, expected: list[str]) -> None:
    src = f"""
    model = DDP(net)
    for i, batch in enumerate(loader):
        is_last = (i + 1) % K == 0
        if {test}:
            with model.no_sync():
                (model(batch).sum() / K).backward()
        else:
            (model(batch).sum() / K).backward()
        if is_last:
            optimizer.step()
            optimizer.zero_grad()
    """
    assert [c for c, _ in codes(src)] == expected


def test_grads_cleared_by_hand() -> None:
    src = """
    for i, (x, y) in enumerate(loader):
        for p in model.parameters():
            p.grad = None
        (crit(model(x), y) / accum).backward()
        if (i + 1) % accum == 0:
            optimizer.step()
    """
    assert codes(src) == [("AG102", 4)]
    # accumulating into an own buffer, then clearing .grad, is a hand-written accumulation
    own = src.replace("            p.grad = None", "            buf[p] += p.grad\n            p.grad = None")
    assert codes(own) == []
