"""Two torchrun agents (``--nnodes 2``, c10d rendezvous on 127.0.0.1) give the same training
as one agent: the Accumulator and the in-place audit do not confuse RANK with LOCAL_RANK."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import free_port

SCRIPT = Path(__file__).with_name("multinode_train.py")


def _torchrun(args: list[str], out: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", OUT_DIR=str(out))
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args, str(SCRIPT)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _wait(procs: list[subprocess.Popen[str]], timeout: float = 240) -> None:
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            assert p.returncode == 0, out[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    one, two = tmp_path_factory.mktemp("one_agent"), tmp_path_factory.mktemp("two_agents")
    port = free_port()
    _wait([_torchrun(["--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                      "--master-port", str(port)], one)])
    endpoint = f"127.0.0.1:{free_port()}"
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", endpoint, "--rdzv-id", "accumguard-multinode"]
    _wait([_torchrun([*common, "--node-rank", "0"], two),
           _torchrun([*common, "--node-rank", "1"], two)])
    return {name: [torch.load(d / f"rank-{r}.pt") for r in range(2)]
            for name, d in (("one", one), ("two", two))}


def test_two_agents_really_have_rank_different_from_local_rank(runs: dict) -> None:
    assert sorted(r["rank"] for r in runs["two"]) == [0, 1]
    assert all(r["local_rank"] == 0 for r in runs["two"])
    assert any(r["rank"] != r["local_rank"] for r in runs["two"])


def test_two_agents_train_like_one(runs: dict) -> None:
    for a, b in zip(runs["one"], runs["two"], strict=True):
        assert a["losses"] == pytest.approx(b["losses"], rel=1e-6, abs=0)
        for name, p in a["params"].items():
            # Same ranks, same data, same reduction order: equal within 1e-6 (measured bitwise).
            torch.testing.assert_close(b["params"][name], p, rtol=1e-6, atol=0)


def test_in_place_audit_passes_under_both_launches(runs: dict) -> None:
    assert all(r["audit_passed"] for rs in runs.values() for r in rs)
