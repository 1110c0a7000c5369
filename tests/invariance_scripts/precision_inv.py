"""``accumguard invariance`` targets: the effective batch (ACCUMGUARD_BATCH) split into K
(ACCUMGUARD_K) micro-batches of ACCUMGUARD_MICRO_BATCH, the same data for every K.

``masters_fp32``: a bf16 model, fp32 master weights, each micro-step's bf16 gradient added
into the fp32 masters (correct); ``masters_bf16``: the bf16 .grad sums the window, copied
to the masters at the boundary (F12); ``autocast``: fp32 weights, bf16 autocast (correct);
``bn``: an MLP with BatchNorm1d in train mode (correct accumulation, not K-invariant by
construction); ``contrastive``: an InfoNCE loss with in-batch negatives (the same).
"""

import os
import sys

import torch
import torch.nn.functional as F  # noqa: N812

MODE = sys.argv[1]
K = int(os.environ["ACCUMGUARD_K"])
B = int(os.environ["ACCUMGUARD_BATCH"])
MB = int(os.environ["ACCUMGUARD_MICRO_BATCH"])
STEPS, D, C = 3, 16, 8
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
data = [(torch.randn(B, D, generator=g), torch.randint(0, C, (B,), generator=g))
        for _ in range(STEPS)]


def mlp(norm: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    mid = [torch.nn.BatchNorm1d(32)] if norm else []
    return torch.nn.Sequential(torch.nn.Linear(D, 32), *mid, torch.nn.Tanh(),
                               torch.nn.Linear(32, C))


def micro(x: torch.Tensor, y: torch.Tensor):  # noqa: ANN201
    return [(x[i:i + MB], y[i:i + MB]) for i in range(0, B, MB)]


if MODE.startswith("masters"):
    model = mlp().to(torch.bfloat16)
    masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    opt = torch.optim.SGD(masters, lr=0.5)
    for x, y in data:
        for xb, yb in micro(x, y):
            (F.cross_entropy(model(xb.bfloat16()).float(), yb) / K).backward()
            if MODE == "masters_fp32":
                for p, m in zip(model.parameters(), masters, strict=True):
                    m.grad = p.grad.float() if m.grad is None else m.grad + p.grad.float()
                    p.grad = None
        if MODE == "masters_bf16":
            for p, m in zip(model.parameters(), masters, strict=True):
                m.grad = p.grad.float()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(model.parameters(), masters, strict=True):
                p.copy_(m)
else:
    model = mlp(norm=MODE == "bn")
    proj = torch.nn.Linear(D, 32)
    params = list(model.parameters()) + (list(proj.parameters()) if MODE == "contrastive" else [])
    opt = torch.optim.SGD(params, lr=0.5)
    for x, y in data:
        for xb, yb in micro(x, y):
            if MODE == "contrastive":  # two views of each sample, the others as negatives
                a = F.normalize(model[0](xb), dim=1)
                b = F.normalize(proj(xb + 0.1), dim=1)
                loss = F.cross_entropy(a @ b.T / 0.1, torch.arange(len(xb)))
            elif MODE == "autocast":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = model(xb)
                loss = F.cross_entropy(out.float(), yb)
            else:
                loss = F.cross_entropy(model(xb), yb)
            (loss / K).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
print("trained")
