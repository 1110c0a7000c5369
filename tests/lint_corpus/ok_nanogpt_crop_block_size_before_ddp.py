# corpus: style=nanogpt class=OK
# nanoGPT's order: crop the block size first, then wrap in DDP (which registers the new
# parameter)
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class GPT(nn.Module):
    def __init__(self, block_size=64):
        super().__init__()
        self.block_size = block_size
        self.wpe = nn.Embedding(block_size, 32)
        self.head = nn.Linear(32, 50)

    def forward(self, idx):
        return self.head(self.wpe(torch.arange(idx.size(1))))

    def crop_block_size(self, block_size):
        self.block_size = block_size
        self.wpe.weight = nn.Parameter(self.wpe.weight[:block_size])


raw = GPT()
raw.crop_block_size(32)
model = DDP(raw)
optimizer = torch.optim.AdamW(raw.parameters(), lr=6e-4)
for it in range(100):
    for micro in range(4):
        model.require_backward_grad_sync = micro == 3
        (model(x).logsumexp(-1).mean() / 4).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
