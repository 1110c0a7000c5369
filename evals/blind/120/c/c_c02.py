"""Tiny causal LM with PyTorch Lightning on 2 CPU ranks, K = 2, after growing the vocabulary.

The pretrained-style vocabulary (60 tokens) gets 4 added special tokens: the embedding and
the untied output layer are resized, old rows copied. The position table is frozen.
Two AdamW groups (no decay on norms/biases/embeddings), a warm-up + linear decay sized from
`estimated_stepping_batches`, and a gradient clip of 0.3 that acts.
"""
import hashlib
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
import pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset

warnings.filterwarnings("ignore")
OLD_VOCAB, NEW_VOCAB, SEQ, D = 60, 64, 24, 48


def grow_embedding(emb: nn.Embedding, n_new: int) -> nn.Embedding:
    new = nn.Embedding(n_new, emb.embedding_dim)
    with torch.no_grad():
        new.weight.normal_(0, 0.02)
        new.weight[: emb.num_embeddings] = emb.weight
    return new


def grow_linear_out(lin: nn.Linear, n_new: int) -> nn.Linear:
    new = nn.Linear(lin.in_features, n_new, bias=True)
    with torch.no_grad():
        new.weight.zero_()
        new.bias.zero_()
        new.weight[: lin.out_features] = lin.weight
        new.bias[: lin.out_features] = lin.bias
    return new


class LM(pl.LightningModule):
    def __init__(self, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, D)
        self.pos = nn.Embedding(SEQ, D)
        self.pos.weight.requires_grad_(False)
        self.block = nn.TransformerEncoderLayer(D, 4, 2 * D, dropout=0.0, batch_first=True, norm_first=True)
        self.ln = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, vocab)

    def resize_token_embeddings(self, n):
        self.tok = grow_embedding(self.tok, n)
        self.lm_head = grow_linear_out(self.lm_head, n)

    def forward(self, idx):
        T = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(T))
        mask = nn.Transformer.generate_square_subsequent_mask(T)
        return self.lm_head(self.ln(self.block(h, src_mask=mask, is_causal=True)))

    def training_step(self, batch, batch_idx):
        (seq,) = batch
        logits = self(seq[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))

    def configure_optimizers(self):
        decay, no_decay = [], []
        for n, p in self.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim < 2 or n.startswith("tok") else decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}], lr=3e-3)
        total = self.trainer.estimated_stepping_batches
        warm = 2
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (total - s) / (total - warm)))
        return [opt], [{"scheduler": sched, "interval": "step"}]


class ClipProbe(pl.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_rank == 0 and trainer.global_step in (0, 5):
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            print(f"step {trainer.global_step} pre-clip grad norm {torch.norm(torch.stack([g.norm() for g in grads])):.3f}")


def main():
    pl.seed_everything(11, workers=True)
    g = torch.Generator().manual_seed(11)
    data = torch.randint(0, NEW_VOCAB, (128, SEQ + 1), generator=g)
    data[:, 2::3] = (data[:, 1:-1:3] + 5) % NEW_VOCAB
    model = LM(OLD_VOCAB)
    model.resize_token_embeddings(NEW_VOCAB)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3,
                         accumulate_grad_batches=2, gradient_clip_val=0.3, gradient_clip_algorithm="norm",
                         deterministic=True, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[ClipProbe()])
    trainer.fit(model, DataLoader(TensorDataset(data), batch_size=8, shuffle=False))
    if trainer.global_rank == 0:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        print(f"optimizer steps {trainer.global_step}")
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
