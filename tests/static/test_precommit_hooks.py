"""The pre-commit hook definitions (``.pre-commit-hooks.yaml``) run what they say: each
hook's entry is a working accumguard command that fails a commit on a buggy file and
passes a correct one, and the DeepSpeed-config hook selects config files only."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "lint_corpus"


def _hooks() -> dict[str, dict]:
    return {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def _run(entry: str, *files: Path) -> int:
    prog, *args = entry.split()
    assert prog == "accumguard"
    return subprocess.run([sys.executable, "-m", "accumguard.cli", *args, *map(str, files)],
                          capture_output=True, text=True, timeout=120).returncode


def test_hooks_are_system_hooks_with_the_documented_ids() -> None:
    hooks = _hooks()
    assert set(hooks) == {"accumguard-lint", "accumguard-check-config"}
    assert all(h["language"] == "system" for h in hooks.values())  # never installs torch


def test_lint_hook_fails_a_buggy_script_and_passes_a_correct_one() -> None:
    entry = _hooks()["accumguard-lint"]["entry"]
    assert _run(entry, CORPUS / "bug_plain_zero_grad_top.py") != 0
    ok = sorted(CORPUS.glob("ok_*.py"))[0]
    assert _run(entry, ok) == 0


def test_config_hook_selects_deepspeed_configs_only(tmp_path: Path) -> None:
    pattern = re.compile(_hooks()["accumguard-check-config"]["files"])
    assert pattern.search("configs/ds_zero2.json") and pattern.search("deepspeed.json")
    assert not pattern.search("package.json") and not pattern.search("configs/model.json")
    bad = tmp_path / "ds_config.json"
    bad.write_text('{"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2, '
                   '"gradient_accumulation_steps": 2}')
    assert _run(_hooks()["accumguard-check-config"]["entry"], bad) != 0
