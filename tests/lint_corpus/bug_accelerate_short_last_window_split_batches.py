# corpus: style=accelerate class=F7
# split_batches: each process takes a slice of every batch, so the pass is 14 batches on
# any number of processes; K = 4 leaves a window of 2 at the end of each pass
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm

N_ROWS = 112
ACCUM = 4

accelerator = Accelerator(gradient_accumulation_steps=ACCUM, split_batches=True)
encoder = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))
opt = torch.optim.AdamW(encoder.parameters(), lr=2e-4)
rows = torch.randn(N_ROWS, 32)
labels = torch.randint(0, 10, (N_ROWS,))
train_dl = DataLoader(TensorDataset(rows, labels), batch_size=8, shuffle=True)
encoder, opt, train_dl = accelerator.prepare(encoder, opt, train_dl)
for step, (xb, yb) in enumerate(tqdm(train_dl)):
    with accelerator.accumulate(encoder):
        logits = encoder(xb)
        loss = torch.nn.functional.cross_entropy(logits, yb, label_smoothing=0.1)
        accelerator.backward(loss)  # expect: AG157
        opt.step()
        opt.zero_grad()
