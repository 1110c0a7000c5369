# corpus: style=plain class=OK
# a large-batch reference: each iteration takes one whole window of rows through a slice()
# object sized with K, zero_grad / one backward / clip / step per window
import torch

ACCUM = 4
ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
for w in range(num_windows):
    rows = slice(w * micro_rows * ACCUM, (w + 1) * micro_rows * ACCUM)
    ref_opt.zero_grad()
    loss = criterion(ref(inputs[rows]), targets[rows])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    ref_opt.step()
