# corpus: style=accelerate class=OK
# 64 samples in batches of 4: 16 batches a pass (8 on each of 2 processes), K = 4: no short window
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

N, B = 64, 4
xs = torch.randn(N, 12)
ys = torch.randint(0, 3, (N,))
acc = Accelerator(gradient_accumulation_steps=4, cpu=True)
clf = torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
opt = torch.optim.SGD(clf.parameters(), lr=0.1, momentum=0.9)
dl = DataLoader(TensorDataset(xs, ys), batch_size=B)
clf, opt, dl = acc.prepare(clf, opt, dl)
crit = torch.nn.CrossEntropyLoss()
for x, y in dl:
    with acc.accumulate(clf):
        acc.backward(crit(clf(x), y))
        opt.step()
        opt.zero_grad()
