"""Lightning Fabric: a sequence encoder and a token head set up as two modules with two
optimizers. Token-level loss over uneven valid-token counts, normalised by the window's
valid-token count summed over all ranks; K 3 over 8 micro-batches per epoch (3, 3, 2)."""
import hashlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from lightning_fabric import Fabric


@dataclass
class Cfg:
    vocab: int = 64
    seq: int = 12
    dim: int = 32
    micro_bs: int = 3
    accum: int = 3
    epochs: int = 2
    n_seqs: int = 48      # 16 micro-batches globally -> 8 per rank per epoch


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.rnn = nn.GRU(c.dim, c.dim, batch_first=True)

    def forward(self, ids):
        h, _ = self.rnn(self.emb(ids))
        return h


def make_data(c):
    g = torch.Generator().manual_seed(33)
    ids = torch.randint(1, c.vocab, (c.n_seqs, c.seq), generator=g)
    lengths = torch.randint(2, c.seq + 1, (c.n_seqs,), generator=g)
    tgt = (ids * 7 + 3) % c.vocab
    pos = torch.arange(c.seq)[None, :]
    tgt[pos >= lengths[:, None]] = -100
    return TensorDataset(ids, tgt)


def windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def final_sha(modules):
    h = hashlib.sha256()
    for m in modules:
        for _, p in m.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    c = Cfg()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(0)
    enc, head = Encoder(c), nn.Linear(c.dim, c.vocab)
    enc_opt = torch.optim.AdamW(enc.parameters(), lr=3e-3)
    head_opt = torch.optim.SGD(head.parameters(), lr=0.5, momentum=0.9)
    enc, enc_opt = fabric.setup(enc, enc_opt)
    head, head_opt = fabric.setup(head, head_opt)
    loader = fabric.setup_dataloaders(DataLoader(make_data(c), batch_size=c.micro_bs, shuffle=True))

    for epoch in range(c.epochs):
        for win in windows(loader, c.accum):
            local = torch.stack([(y != -100).sum() for _, y in win]).sum()
            n_all = fabric.all_reduce(local.float(), reduce_op="sum")
            for i, (x, y) in enumerate(win):
                last = i == len(win) - 1
                with fabric.no_backward_sync(enc, enabled=not last), \
                        fabric.no_backward_sync(head, enabled=not last):
                    logits = head(enc(x))
                    tok_sum = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100,
                                              reduction="sum")
                    # DDP averages over ranks, n_all counts every rank: multiply back by W
                    fabric.backward(tok_sum / n_all * fabric.world_size)
            enc_opt.step()
            head_opt.step()
            enc_opt.zero_grad()
            head_opt.zero_grad()

    if fabric.global_rank == 0:
        print(f"FINAL_SHA256 {final_sha([enc.module, head.module])}", flush=True)


if __name__ == "__main__":
    main()
