"""Sequence tagger, Accelerate + DeepSpeed ZeRO-3 with a frozen pretrained embedding.

Accelerate's accumulate() drives DeepSpeed's boundary; the schedule is
DeepSpeed's WarmupLR handed through prepare(), so the engine steps it once per
optimizer step (its warm-up is in optimizer steps). Clipping at 0.3 in the
DeepSpeed config. Final weights gathered from the ZeRO-3 shards.
"""
import hashlib

import deepspeed
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs, set_seed
from deepspeed.runtime.lr_schedules import WarmupLR


class Settings:
    seed = 3
    vocab, tags, dim, seq = 60, 7, 24, 10
    per_device_bs = 4
    accum = 2
    epochs = 2
    batches_per_rank = 8
    lr = 5e-3
    warmup = 3
    clip = 0.3


class Tagger(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.dim)
        self.rnn_in = nn.Linear(2 * s.dim, s.dim)
        self.classifier = nn.Linear(s.dim, s.tags)

    def forward(self, tokens):
        e = self.embed(tokens)
        left = torch.cat([torch.zeros_like(e[:, :1]), e[:, :-1]], 1)
        return self.classifier(torch.tanh(self.rnn_in(torch.cat([e, left], -1))))


def dataset(s, world):
    g = torch.Generator().manual_seed(s.seed)
    n = s.per_device_bs * s.batches_per_rank * world
    toks = torch.randint(0, s.vocab, (n, s.seq), generator=g)
    tags = (toks * 3 + torch.roll(toks, 1, 1)) % s.tags
    return TensorDataset(toks, tags)


def train(s):
    ds_cfg = {
        "train_micro_batch_size_per_gpu": s.per_device_bs,
        "gradient_accumulation_steps": s.accum,
        "gradient_clipping": s.clip,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10 ** 9,
    }
    acc = Accelerator(gradient_accumulation_steps=s.accum,
                      deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_cfg),
                      kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    set_seed(s.seed)
    model = Tagger(s)
    model.embed.weight.requires_grad_(False)  # "pretrained", kept frozen
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=s.lr)
    sched = WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=s.lr, warmup_num_steps=s.warmup,
                     warmup_type="linear")
    loader = DataLoader(dataset(s, acc.num_processes), batch_size=s.per_device_bs, shuffle=False)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)

    for epoch in range(s.epochs):
        for tokens, tags in loader:
            with acc.accumulate(model):
                logits = model(tokens)
                loss = F.cross_entropy(logits.reshape(-1, s.tags), tags.reshape(-1))
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
        acc.print(f"epoch {epoch} loss {loss.item():.4f}")
    return acc, model


def main():
    acc, engine = train(Settings)
    params = [p for _, p in engine.module.named_parameters()]
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        h = hashlib.sha256()
        for _, p in engine.module.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    if acc.is_main_process:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
