"""Lightning Fabric with ``strategy="ddp"`` on 2 CPU processes: the script calls Fabric's
``_FabricModule``, which holds the DDP model ``fabric.setup`` made. ``python fabric_ddp.py
OUT`` runs three loops of K = 3 under ``no_backward_sync`` in one launch, each recorded in
``OUT/<case>`` as ``watch``'s bootstrap records it: ``ok`` (correct), ``world`` (the loss
divided by ``fabric.world_size`` on top of DDP's average: F10) and ``dict_heads`` (the task
heads kept in a plain dict: the optimizer steps them, DDP never averages them: F10)."""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812
from lightning_fabric import Fabric

from accumguard.watch._recording import recording

K = 3
STEPS = 4


class Net(torch.nn.Module):
    def __init__(self, plain_dict: bool) -> None:
        super().__init__()
        self.trunk = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU())
        heads = {"a": torch.nn.Linear(16, 3), "b": torch.nn.Linear(16, 2)}
        self.heads = heads if plain_dict else torch.nn.ModuleDict(heads)

    def head_parameters(self) -> list[torch.nn.Parameter]:
        return [p for h in self.heads.values() for p in h.parameters()]

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        z = self.trunk(x)
        return {k: h(z) for k, h in self.heads.items()}


def run(fabric: Fabric, case: str) -> None:
    torch.manual_seed(0)
    model = Net(case == "dict_heads")
    params = list(dict.fromkeys([*model.parameters(), *model.head_parameters()]))
    model, opt = fabric.setup(model, torch.optim.SGD(params, lr=0.3))
    g = torch.Generator().manual_seed(1 + fabric.global_rank)
    for i in range(STEPS * K):
        x = torch.randn(4, 10, generator=g)
        ya, yb = torch.randint(0, 3, (4,), generator=g), torch.randint(0, 2, (4,), generator=g)
        last = (i + 1) % K == 0
        with fabric.no_backward_sync(model, enabled=not last):
            out = model(x)
            loss = F.cross_entropy(out["a"], ya) + F.cross_entropy(out["b"], yb)
            if case == "world":
                loss = loss / fabric.world_size
            fabric.backward(loss / K)
        if last:
            opt.step()
            opt.zero_grad()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    for case in ("ok", "world", "dict_heads"):
        with recording(out / case):
            run(fabric, case)
