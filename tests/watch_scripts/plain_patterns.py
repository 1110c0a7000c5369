"""Single-process loops in several real-world styles; ``--case`` picks one.

Correct: ``namespace`` (model returns a SimpleNamespace, a trainer class), ``heads``
(loss from several heads), ``gan`` (two optimizers), ``fp32buf`` (bf16 model, fp32
gradient buffers), ``k1`` (no accumulation), ``epochs`` (3 epochs of 10 batches, K=4,
the short window of each epoch stepped and normalised by its own count).
``token_budget`` (windows of varying length by a token budget).
Broken: ``leak`` (epochs without stepping the partial window: it leaks into the next, F7),
``first_short`` (``i % K == 0`` with i from 0: a first window of 1, F13),
``loader_leak`` (a DataLoader's leftover leaks into the next epoch: F7; ``loader_ok`` steps
it: correct).
``--sweep DIR`` runs every case in this one process, each recorded in ``DIR/<case>``
(the clipping is looked up at call time: ``clip_grad_norm_`` below is bound at import).
"""

import argparse
import types

import torch

p = argparse.ArgumentParser()
p.add_argument("--case", default=None)
p.add_argument("--sweep", default=None, help="run every case, each recorded in DIR/<case>")
args = p.parse_args()
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(6, 12)
        self.a = torch.nn.Linear(12, 3)
        self.b = torch.nn.Linear(12, 1)

    def forward(self, x, y):  # noqa: ANN001, ANN201
        h = torch.relu(self.body(x))
        logits = self.a(h)
        return types.SimpleNamespace(logits=logits, aux=self.b(h),
                                     loss=torch.nn.functional.cross_entropy(logits, y,
                                                                            reduction="sum"))


def batch(n: int = 4):  # noqa: ANN201
    return torch.randn(n, 6), torch.randint(0, 3, (n,))


class Trainer:
    def __init__(self, k: int) -> None:
        self.model = Net()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.k = k

    def fit(self, steps: int) -> None:
        for _ in range(steps):
            batches = [batch() for _ in range(self.k)]
            n = sum(len(y) for _, y in batches)
            for x, y in batches:
                out = self.model(x, y)
                (out.loss / n).backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 5.0)
            self.opt.step()
            self.opt.zero_grad()


def namespace() -> None:
    Trainer(k=4).fit(4)


def k1() -> None:
    Trainer(k=1).fit(6)


def heads() -> None:
    m = Net()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    for i in range(12):
        x, y = batch()
        out = m(x, y)
        loss = out.loss / 16 + 0.1 * out.aux.pow(2).mean() / 4
        loss.backward()
        if (i + 1) % 4 == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)


def gan() -> None:
    G = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))
    D = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    og = torch.optim.Adam(G.parameters(), lr=1e-3)
    od = torch.optim.Adam(D.parameters(), lr=1e-3)
    bce = torch.nn.BCEWithLogitsLoss()
    for _ in range(5):
        real, z = torch.randn(4, 6), torch.randn(4, 3)
        od.zero_grad()
        fake = G(z)
        d_loss = bce(D(real), torch.ones(4, 1)) + bce(D(fake.detach()), torch.zeros(4, 1))
        d_loss.backward()
        od.step()
        og.zero_grad()
        g_loss = bce(D(fake), torch.ones(4, 1))
        g_loss.backward()
        og.step()


def fp32buf() -> None:
    m = Net().to(torch.bfloat16)
    master = [q.detach().float().clone().requires_grad_(True) for q in m.parameters()]
    opt = torch.optim.AdamW(master, lr=1e-3)
    bufs = [torch.zeros_like(q) for q in master]
    for i in range(12):
        x, y = batch()
        m(x.bfloat16(), y).loss.div(16).backward()
        for b, q in zip(bufs, m.parameters(), strict=True):
            if q.grad is not None:
                b += q.grad.float()
                q.grad = None
        if (i + 1) % 4 == 0:
            for b, q in zip(bufs, master, strict=True):
                q.grad = b.clone()
                b.zero_()
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                for q, mq in zip(m.parameters(), master, strict=True):
                    q.copy_(mq)


def epochs(case: str) -> None:
    """3 epochs of 10 batches, K = 4. ``epochs``: the short last window of each epoch is
    stepped with its own count (correct). ``leak``: it is not stepped and leaks into the
    next epoch's first window (F7). ``first_short``: the boundary test ``i % K == 0``
    with i from 0 steps after the first micro-batch (windows 1, 4, 4, ...: F13)."""
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    data = [batch() for _ in range(10)]
    K = 4
    for _epoch in range(3):
        for i, (x, y) in enumerate(data):
            if case == "first_short":
                (m(x, y).loss / (K * 4)).backward()
                if i % K == 0:
                    opt.step()
                    opt.zero_grad()
                continue
            last = (i + 1) % K == 0 or (case == "epochs" and i + 1 == len(data))
            count = K * 4 if (i // K) < len(data) // K else (len(data) % K) * 4
            (m(x, y).loss / count).backward()
            if last:
                opt.step()
                opt.zero_grad()


def loader_epochs(case: str) -> None:
    """A DataLoader of 5 batches, K = 4, 3 epochs. ``loader_ok`` steps the short last
    window of each epoch; ``loader_leak`` does not: its leftover leaks into the next
    epoch (windows 4, 5, 5: by sizes alone a constant K+1, the DataLoader pass shows F7)."""
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    ds = torch.utils.data.TensorDataset(torch.randn(20, 6), torch.randint(0, 3, (20,)))
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    K = 4
    for _epoch in range(3):
        for i, (x, y) in enumerate(loader):
            # the window's own sample count: 16, or 4 for the epoch's short last window
            # (dividing that one by 16 too is F7: the partial window scaled as a full one)
            start = i - i % K
            count = 4 * min(K, len(loader) - start) if case == "loader_ok" else 16
            (m(x, y).loss / count).backward()
            if (i + 1) % K == 0 or (case == "loader_ok" and i + 1 == len(loader)):
                opt.step()
                opt.zero_grad()


def token_budget() -> None:
    """Accumulate until a token budget is reached: micro-batches of varying length, so
    windows of 3 to 6 micro-batches; the loss normalised by the window's own count:
    correct, with no fixed K."""
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    lengths = [6, 4, 4, 2, 2, 2, 4, 4, 2, 4, 4, 4, 4, 2, 2, 2, 2, 6, 6, 4, 4, 4, 2, 2, 4]
    pending: list[tuple[torch.Tensor, torch.Tensor]] = []
    for n in lengths:
        pending.append(batch(n))
        total = sum(len(y) for _, y in pending)
        if total >= 14:
            for x, y in pending:
                (m(x, y).loss / total).backward()
            opt.step()
            opt.zero_grad()
            pending = []


CASES = {"namespace": namespace, "k1": k1, "heads": heads, "gan": gan, "fp32buf": fp32buf,
         "epochs": lambda: epochs("epochs"), "leak": lambda: epochs("leak"),
         "first_short": lambda: epochs("first_short"), "token_budget": token_budget,
         "loader_ok": lambda: loader_epochs("loader_ok"),
         "loader_leak": lambda: loader_epochs("loader_leak")}

if args.sweep:
    from pathlib import Path

    from accumguard.watch._recording import recording

    for name, fn in CASES.items():
        with recording(Path(args.sweep) / name):
            fn()
elif args.case in CASES:
    CASES[args.case]()
else:
    raise SystemExit(f"unknown case {args.case}")
print("ok", args.case or args.sweep)
