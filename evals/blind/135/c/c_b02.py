"""Lightning distillation: a small student LM learns from a frozen teacher LM (KD + CE),
DDP on 2 ranks, accumulate_grad_batches=3, linear warm-up then linear decay per optimizer step."""
import argparse
import hashlib

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset


def tiny_lm(vocab, dim, layers, seed):
    g = torch.Generator().manual_seed(seed)
    layer = nn.TransformerEncoderLayer(dim, 2, dim * 2, dropout=0.0, batch_first=True)
    m = nn.ModuleDict(dict(emb=nn.Embedding(vocab, dim),
                           enc=nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
                           head=nn.Linear(dim, vocab)))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    return m


def lm_logits(m, ids):
    T = ids.shape[1]
    causal = torch.triu(torch.full((T, T), float("-inf")), 1)
    return m["head"](m["enc"](m["emb"](ids), mask=causal))


class Distiller(pl.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.save_hyperparameters(vars(args))
        self.student = tiny_lm(args.vocab, 32, 1, seed=args.seed)
        self.teacher = tiny_lm(args.vocab, 48, 2, seed=args.seed + 7)
        self.teacher.requires_grad_(False)
        self.teacher.eval()

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        x, y = ids[:, :-1], ids[:, 1:]
        s = lm_logits(self.student, x)
        with torch.no_grad():
            t = lm_logits(self.teacher, x)
        T = self.hparams.temperature
        kd = F.kl_div(F.log_softmax(s / T, -1).flatten(0, 1), F.log_softmax(t / T, -1).flatten(0, 1),
                      log_target=True, reduction="batchmean") * T * T
        ce = F.cross_entropy(s.flatten(0, 1), y.flatten())
        return self.hparams.alpha * kd + (1 - self.hparams.alpha) * ce

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.student.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        total = self.trainer.estimated_stepping_batches
        warm = self.hparams.warmup_steps
        loop = self.trainer.fit_loop

        def schedule(_):
            done = loop.total_batch_idx + 1
            if done < warm:
                return done / warm
            return max(0.0, (total - done) / max(1, total - warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--seq", type=int, default=17)
    ap.add_argument("--micro_bs", type=int, default=4)
    ap.add_argument("--accum", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup_steps", type=int, default=6)
    ap.add_argument("--alpha", type=float, default=0.7)
    ap.add_argument("--temperature", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()

    pl.seed_everything(args.seed, workers=True)
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, args.vocab, (2 * 12 * args.micro_bs, args.seq), generator=g)
    loader = DataLoader(TensorDataset(ids), batch_size=args.micro_bs, shuffle=False)

    model = Distiller(args)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
                         accumulate_grad_batches=args.accum, deterministic=True,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)

    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
