"""Domain-adaptation of a small BERT classifier in PyTorch Lightning (2 CPU ranks, torchrun).

* six domain tokens are added to the vocabulary (resize_token_embeddings);
* the lower encoder layer is frozen, the embeddings train at a tenth of the head's LR;
* the LR warm-up lives in an `optimizer_step` override (as in the Lightning docs), keyed on
  the number of optimizer steps taken so far;
* gradient clipping by norm and accumulate_grad_batches=3 are left to the Trainer.
"""
import hashlib

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl
from transformers import BertConfig, BertForSequenceClassification

SEED = 99
NEW_TOKENS = 6
BASE_VOCAB = 60
N_CLASSES = 3
MICRO_BS = 4
ACCUM = 3
PER_RANK_BATCHES = 9
WORLD = 2


def make_data():
    g = torch.Generator().manual_seed(SEED)
    n = WORLD * PER_RANK_BATCHES * MICRO_BS
    x = torch.randint(5, BASE_VOCAB, (n, 16), generator=g)
    y = torch.randint(0, N_CLASSES, (n,), generator=g)
    # the new domain tokens carry the label signal
    slot = torch.randint(1, 16, (n,), generator=g)
    x[torch.arange(n), slot] = BASE_VOCAB + 2 * y + torch.randint(0, 2, (n,), generator=g)
    x[:, 0] = 1
    return TensorDataset(x, y)


class DomainClassifier(pl.LightningModule):
    def __init__(self, lr=2e-3, emb_lr_scale=0.1, warmup_steps=3):
        super().__init__()
        self.save_hyperparameters()
        cfg = BertConfig(vocab_size=BASE_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=32, num_labels=N_CLASSES,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        self.net = BertForSequenceClassification(cfg)
        self.net.resize_token_embeddings(BASE_VOCAB + NEW_TOKENS)
        for p in self.net.bert.encoder.layer[0].parameters():
            p.requires_grad_(False)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(input_ids=x, attention_mask=torch.ones_like(x)).logits
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss, prog_bar=False, sync_dist=False)
        return loss

    def configure_optimizers(self):
        emb = [p for n, p in self.net.named_parameters() if "embeddings" in n and p.requires_grad]
        rest = [p for n, p in self.net.named_parameters() if "embeddings" not in n and p.requires_grad]
        return torch.optim.AdamW([
            {"params": emb, "lr": self.hparams.lr * self.hparams.emb_lr_scale, "base_lr": self.hparams.lr * self.hparams.emb_lr_scale},
            {"params": rest, "lr": self.hparams.lr, "base_lr": self.hparams.lr},
        ], weight_decay=0.01)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        # manual warm-up, no scheduler object
        scale = min(1.0, float(self.trainer.global_step + 1) / self.hparams.warmup_steps)
        for pg in optimizer.param_groups:
            pg["lr"] = scale * pg["base_lr"]
        optimizer.step(closure=optimizer_closure)


def sha256_params(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    pl.seed_everything(SEED, workers=True)
    model = DomainClassifier()
    loader = DataLoader(make_data(), batch_size=MICRO_BS, shuffle=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=WORLD,
        strategy="ddp",
        max_epochs=3,
        accumulate_grad_batches=ACCUM,
        gradient_clip_val=0.15,
        gradient_clip_algorithm="norm",
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    if trainer.is_global_zero:
        print(f"optimizer steps {trainer.global_step}", flush=True)
        print(f"FINAL_SHA256 {sha256_params(model.net)}", flush=True)


if __name__ == "__main__":
    main()
