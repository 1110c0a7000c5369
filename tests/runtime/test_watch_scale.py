"""The window-scale rules under the real ``accumguard watch`` CLI, on an unmodified script
(no ``-k``: K comes from the script's own declaration or from the windows), as in blind
evaluation round 5: the loss divided by K twice (b06) is LOSS_SCALE, the final partial
window divided by K (b08) is F7, a step after every ``torch.autograd.grad`` (b11) is F1;
their correct twins exit 0 with no error.

Every case runs in one ``python`` launch (tests/watch_sweep.py), recorded as ``watch``
records it and judged by the function the CLI calls; tests/runtime/test_watch.py launches
the real CLI."""

from __future__ import annotations

import sys
import textwrap

import pytest
from test_watch import _errors
from watch_sweep import Watched, watch_many

SCRIPT = textwrap.dedent('''
    """Small regression/classification loops, one per mode (argv[1])."""
    import sys

    import torch
    import torch.nn.functional as F

    accumulation_steps = 4
    MODE = sys.argv[1]
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=0.05)
    gen = torch.Generator().manual_seed(1)


    def batch():
        x = torch.randn(6, 8, generator=gen)
        return x, torch.randint(0, 3, (6,), generator=gen)


    def scaled_loss(x, y):  # a helper that already divides by K
        return F.cross_entropy(net(x), y) / accumulation_steps


    if MODE in ("double_div", "single_div", "two_losses"):
        for step in range(3):
            for micro in range(accumulation_steps):
                x, y = batch()
                if MODE == "double_div":
                    loss = scaled_loss(x, y) / accumulation_steps
                elif MODE == "single_div":
                    loss = scaled_loss(x, y)
                else:  # two weighted terms, one weight equal to 1/K
                    z = net(x)
                    loss = (0.25 * F.cross_entropy(z, y) + 0.75 * z.pow(2).mean()) \\
                        / accumulation_steps
                loss.backward()
            opt.step()
            opt.zero_grad()
    elif MODE in ("partial_k", "partial_real"):
        data = [batch() for _ in range(6)]  # one epoch: windows of 4 and 2
        n = len(data)
        for i, (x, y) in enumerate(data):
            size = min(accumulation_steps, n - (i - i % accumulation_steps))
            div = accumulation_steps if MODE == "partial_k" else size
            (F.mse_loss(net(x), F.one_hot(y, 3).float()) / div).backward()
            if (i + 1) % accumulation_steps == 0 or i + 1 == n:
                opt.step()
                opt.zero_grad()
    else:  # grad_step, grad_accum: gradients made with torch.autograd.grad
        for step in range(3):
            bufs = [torch.zeros_like(p) for p in params]
            for micro in range(accumulation_steps):
                x, y = batch()
                loss = F.cross_entropy(net(x), y) / accumulation_steps
                grads = torch.autograd.grad(loss, params)
                if MODE == "grad_accum":
                    for b, g in zip(bufs, grads):
                        b.add_(g)
                    continue
                for p, g in zip(params, grads):
                    p.grad = g
                opt.step()
                opt.zero_grad(set_to_none=True)
            if MODE == "grad_accum":
                for p, b in zip(params, bufs):
                    p.grad = b
                opt.step()
                opt.zero_grad(set_to_none=True)
    print("trained")
''')


CASES = [
    ("double_div", {"LOSS_SCALE"}), ("single_div", set()), ("two_losses", set()),
    ("partial_k", {"F7"}), ("partial_real", set()),
    ("grad_step", {"F1"}), ("grad_accum", set()),
]


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Watched]:
    tmp = tmp_path_factory.mktemp("scale")
    script = tmp / "train_scale.py"
    script.write_text(SCRIPT)
    return watch_many(tmp / "runs", {mode: [sys.executable, str(script), mode]
                                     for mode, _ in CASES})


@pytest.mark.parametrize(("mode", "expected"), CASES)
def test_window_scale_under_watch(watched: dict[str, Watched], mode: str,
                                  expected: set[str]) -> None:
    code, findings, _, proc = watched[mode]
    assert proc.stdout.strip() == "trained", proc.stderr[-2000:]
    assert _errors(findings) == expected, findings
    assert code == (1 if expected else 0)
    for f in findings:
        if f["severity"] == "error":
            assert "train_scale.py:" in f["evidence"], f
