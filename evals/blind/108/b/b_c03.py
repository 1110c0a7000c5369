"""Sequence classification with R-Drop (two dropout passes, symmetric KL) in an
HF Trainer subclass that overrides training_step; bf16 autocast, a DataLoader
worker process, and a callback that keeps the encoder frozen for the first
optimizer steps by clearing its gradient right before the step.
Windows per epoch: 4,4,4,4,4,2 (the Trainer divides the short one by 2).

Run: torchrun --nproc-per-node 2 ... b_c03.py
"""
import hashlib
import os
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import Trainer, TrainerCallback, TrainingArguments, set_seed

CFG = SimpleNamespace(vocab=64, dim=32, seq=12, classes=4, accum=4, bs=3, samples=132, epochs=2,
                      alpha=1.0, freeze_steps=3, lr=2e-3, seed=9)


class Classifier(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.encoder = nn.Sequential(nn.Linear(c.dim, 64), nn.GELU(), nn.Dropout(0.2), nn.Linear(64, c.dim))
        self.drop = nn.Dropout(0.2)
        self.cls = nn.Linear(c.dim, c.classes)

    def forward(self, input_ids, labels=None):
        h = self.emb(input_ids).mean(dim=1)
        h = h + self.encoder(h)
        logits = self.cls(self.drop(h))
        return {"logits": logits}


class ToyClassification(torch.utils.data.Dataset):
    def __init__(self, c):
        g = torch.Generator().manual_seed(c.seed)
        self.x = torch.randint(0, c.vocab, (c.samples, c.seq), generator=g)
        self.y = (self.x[:, :3].sum(dim=1) % c.classes)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.y[i]}


class RDropTrainer(Trainer):
    def __init__(self, *a, alpha=1.0, **kw):
        super().__init__(*a, **kw)
        self.alpha = alpha

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        inputs = self._prepare_inputs(inputs)
        ids, y = inputs["input_ids"], inputs["labels"]
        with self.compute_loss_context_manager():
            logits = model(input_ids=torch.cat([ids, ids], dim=0))["logits"].float()
            l1, l2 = logits.chunk(2, dim=0)
            ce = 0.5 * (F.cross_entropy(l1, y) + F.cross_entropy(l2, y))
            lp1, lp2 = F.log_softmax(l1, -1), F.log_softmax(l2, -1)
            kl = 0.5 * (F.kl_div(lp1, lp2, log_target=True, reduction="batchmean")
                        + F.kl_div(lp2, lp1, log_target=True, reduction="batchmean"))
            loss = ce + self.alpha * kl
        # every micro-batch has the same size: the window mean is the mean of the micro-means
        loss = loss / self.current_gradient_accumulation_steps
        self.accelerator.backward(loss)
        return loss.detach()


class FrozenWarmup(TrainerCallback):
    def __init__(self, steps):
        self.steps = steps

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step < self.steps:
            for p in model.encoder.parameters():
                p.grad = None


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(CFG.seed)
    torch.use_deterministic_algorithms(True)
    model = Classifier(CFG)
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", os.path.basename(__file__)[:-3] + "_out"),
        per_device_train_batch_size=CFG.bs,
        gradient_accumulation_steps=CFG.accum,
        num_train_epochs=CFG.epochs,
        learning_rate=CFG.lr,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=1.0,
        bf16=True,
        dataloader_num_workers=1,
        dataloader_persistent_workers=True,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
        seed=CFG.seed,
        data_seed=CFG.seed,
    )
    trainer = RDropTrainer(model=model, args=args, train_dataset=ToyClassification(CFG), alpha=CFG.alpha,
                           callbacks=[FrozenWarmup(CFG.freeze_steps)])
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"FINAL_SHA256 {param_sha(model)}", flush=True)


if __name__ == "__main__":
    main()
