"""CTC acoustic model on 2 DDP ranks (torchrun) with bf16 autocast, EMA and a clip.

Micro-batches hold a different number of utterances per rank and per micro-step (bucketing
by length). The window loss is the CTC sum over all its utterances on all ranks divided by
that all-ranks utterance count; DDP averages over ranks, so each rank multiplies by W.
"""
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclass
class Hparams:
    n_mels: int = 16
    vocab: int = 12          # 0 is blank
    hidden: int = 48
    accum: int = 2
    steps: int = 12
    lr: float = 1e-3
    clip: float = 1.0
    ema: float = 0.9
    seed: int = 21


class AcousticModel(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.conv = nn.Conv1d(hp.n_mels, hp.hidden, 3, padding=1)
        self.rnn = nn.GRU(hp.hidden, hp.hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hp.hidden, hp.vocab)

    def forward(self, feats):                       # feats: B x T x n_mels
        h = F.gelu(self.conv(feats.transpose(1, 2))).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.out(h)


class Bucketer:
    """Length-bucketed batches: short utterances come in larger groups."""

    def __init__(self, hp, rank):
        self.hp = hp
        self.g = torch.Generator().manual_seed(hp.seed * 7 + rank)

    def next(self):
        T = int(torch.randint(20, 41, (1,), generator=self.g))
        n_utt = 6 if T < 30 else 3
        feats = torch.randn(n_utt, T, self.hp.n_mels, generator=self.g)
        in_lens = T - torch.randint(0, 6, (n_utt,), generator=self.g)
        tgt_lens = torch.randint(3, 9, (n_utt,), generator=self.g)
        targets = torch.randint(1, self.hp.vocab, (n_utt, 8), generator=self.g)
        return feats, in_lens, targets, tgt_lens


def ctc_sum(model, batch):
    feats, in_lens, targets, tgt_lens = batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(feats)
    logp = F.log_softmax(logits.float(), -1).transpose(0, 1)
    return F.ctc_loss(logp, targets, in_lens, tgt_lens, blank=0, reduction="sum", zero_infinity=True)


def main():
    hp = Hparams()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(hp.seed)
    net = AcousticModel(hp)
    ema = AcousticModel(hp).requires_grad_(False)
    ema.load_state_dict(net.state_dict())
    model = DDP(net)
    opt = torch.optim.Adam(model.parameters(), lr=hp.lr)
    data = Bucketer(hp, rank)

    for step in range(hp.steps):
        window = [data.next() for _ in range(hp.accum)]
        n_utt = torch.tensor(float(sum(b[0].size(0) for b in window)))
        dist.all_reduce(n_utt)
        for i, batch in enumerate(window):
            model.require_backward_grad_sync = i == hp.accum - 1
            loss = ctc_sum(model, batch) * world / n_utt
            loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), hp.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), net.parameters()):
                pe.mul_(hp.ema).add_(p, alpha=1 - hp.ema)
        if rank == 0 and step % 4 == 0:
            print(f"step {step} utts {int(n_utt)} grad-norm {gnorm:.3f}")

    if rank == 0:
        h = hashlib.sha256()
        for _, p in net.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
