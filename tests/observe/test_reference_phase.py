"""A script that trains with accumulation and then, in the same process, runs a
large-batch reference (a new model and optimizer, one backward per step on each whole
window, often with its own scheduler): the reference's steps belong to another optimizer
object, so they neither continue the training's DataLoader pass (its short last window is
the end of its run, not F13) nor count towards the training schedule's horizon (F4).
Blind round 25 found both as false errors. Each optimizer object's number is recorded
(``opt_serial``)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812

from accumguard.observe.rules import RunRecording, analyze
from accumguard.watch._findings import load_recordings
from accumguard.watch._recording import recording

K = 4


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _linear(total_steps: int):  # noqa: ANN202 - a schedule factory, as scripts write one
    return lambda s: max(0.0, 1 - s / total_steps)


def _run(tmp: Path, *, reference: bool, horizon_factor: int = 1) -> list[tuple[str, str]]:
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g))
            for _ in range(10)]  # 10 batches: windows 4, 4, 2 per epoch
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    steps = 2 * 3
    with recording(tmp):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _linear(steps // horizon_factor))
        for _ in range(2):
            n = len(loader)
            for i, (x, y) in enumerate(loader):
                size = K if i < n - n % K else n % K  # the tail normalised by its own size
                (F.cross_entropy(model(x), y) / size).backward()
                if (i + 1) % K == 0 or i + 1 == n:
                    opt.step()
                    sched.step()
                    opt.zero_grad()
        if reference:
            ref = _model()
            ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
            rsched = torch.optim.lr_scheduler.LambdaLR(ropt, _linear(3 * steps))
            for _ in range(6):  # 18 reference steps: 24 in the run, 4 x (= K) the training's
                for w0 in range(0, len(data), K):
                    xs, ys = zip(*data[w0:w0 + K], strict=True)
                    F.cross_entropy(ref(torch.cat(xs)), torch.cat(ys)).backward()
                    ropt.step()
                    rsched.step()
                    ropt.zero_grad()
    found, _, _ = analyze(load_recordings(tmp))
    return [(f.cls, f.severity.value) for f in found]


def test_a_reference_run_after_the_training_is_not_its_continuation(tmp_path: Path) -> None:
    assert [f for f in _run(tmp_path / "a", reference=False) if f[1] == "error"] == []
    found = _run(tmp_path / "b", reference=True)
    assert [f for f in found if f[1] == "error"] == [], found


def test_the_training_schedule_is_still_judged_beside_a_reference_run(tmp_path: Path) -> None:
    """A horizon 3x short ends early whatever follows (a factor of neither W nor K: a
    note), and the reference's steps do not stretch it to another factor."""
    found = _run(tmp_path, reference=True, horizon_factor=3)
    assert ("F4", "note") in found, found
    assert [f for f in found if f[1] == "error"] == [], found


class _ScriptK:
    """A K the script's source declares."""

    def __init__(self, value: int) -> None:
        self.value, self.divides_loss, self.where = value, True, "train.py:7"

    def describe(self) -> str:
        return f"accum_steps = {self.value} declared in the script (train.py:7)"


def test_a_short_last_window_of_the_training_is_not_f13_before_a_reference() -> None:
    """Windows 4, 4, 3 per DataLoader pass (the tail normalised by its size), then a
    reference optimizer's windows of one backward: the training's last window ends its
    optimizer's run. The same windows from one optimizer object continue the pass (F13)."""
    def steps(serial_ref: int) -> list[dict[str, object]]:
        train = [{"step": i, "backwards": n, "data_pass_starts": [0] if i % 3 == 0 else [],
                  "opt_serial": 1} for i, n in enumerate([4, 4, 3, 4, 4, 3])]
        ref = [{"step": 6 + i, "backwards": 1, "opt_serial": serial_ref} for i in range(6)]
        return train + ref

    found = analyze(RunRecording(steps={0: steps(2)}), script=_ScriptK(K))[0]
    assert [f for f in found if f.severity.value == "error"] == [], found
    same = analyze(RunRecording(steps={0: steps(1)}), script=_ScriptK(K))[0]
    assert "F13" in {f.cls for f in same if f.severity.value == "error"}, same


def _phases(first: list[int], second: list[int], serial_b: int) -> RunRecording:
    a = [{"step": i, "backwards": n, "opt_serial": 1} for i, n in enumerate(first)]
    b = [{"step": len(first) + i, "backwards": n, "opt_serial": serial_b}
         for i, n in enumerate(second)]
    return RunRecording(steps={0: a + b})


def _codes(rec: RunRecording) -> list[tuple[str, str]]:
    return [(f.cls, f.severity.value) for f in analyze(rec, k_flag=K)[0]]


def test_a_later_optimizer_stepping_on_whole_batches_is_a_phase_not_f1() -> None:
    """K = 4 declared (a framework, a flag); the training optimizer accumulated 4, then
    another optimizer object made the run's last steps after one backward each (the
    script's large-batch reference): a note, no error. The same steps by the training's
    own optimizer, or a run that never accumulated, are F1."""
    assert _codes(_phases([4, 4, 4], [1, 1, 1, 1], 2)) == [("F1", "note")]
    assert ("F1", "error") in _codes(_phases([4, 4, 4], [1, 1, 1, 1], 1))
    assert ("F1", "error") in _codes(_phases([1, 1, 1], [1, 1, 1, 1], 2))
