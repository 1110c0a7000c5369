"""Intent classifier trained with the HF Trainer plus a masked-view consistency regulariser.

The consistency pass needs a second forward of the encoder; to keep peak memory at one forward,
the subclass backpropagates it on its own, right after the Trainer's own backward of the CE.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments, set_seed

SEED = 99
VOCAB, MASK_ID, N_CLASSES, SEQ = 80, 1, 5, 12
CONS_WEIGHT = 1.0


class IntentEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.pos = nn.Parameter(torch.randn(SEQ, 32) * 0.02)
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, N_CLASSES)

    def forward(self, input_ids, labels=None):
        h = self.enc(self.emb(input_ids) + self.pos)
        logits = self.head(h.mean(1))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


class IntentData(Dataset):
    def __init__(self, n=192):
        g = torch.Generator().manual_seed(SEED)
        self.x = torch.randint(2, VOCAB, (n, SEQ), generator=g)
        self.y = (self.x[:, :3].sum(1) % N_CLASSES)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.y[i]}


class ConsistencyTrainer(Trainer):
    """CE from the stock Trainer + KL(masked view || clean view)."""

    def masked_view(self, input_ids):
        keep = (torch.arange(input_ids.shape[1], device=input_ids.device) % 3) != 1
        return torch.where(keep, input_ids, torch.full_like(input_ids, MASK_ID))

    def training_step(self, model, inputs, num_items_in_batch=None):
        ce = super().training_step(model, inputs, num_items_in_batch)   # forward + scaled backward
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad():
            target = F.softmax(model(input_ids=inputs["input_ids"])["logits"], dim=-1)
        logits = model(input_ids=self.masked_view(inputs["input_ids"]))["logits"]
        cons = CONS_WEIGHT * F.kl_div(F.log_softmax(logits, dim=-1), target, reduction="batchmean")
        self.accelerator.backward(cons)
        return ce + cons.detach() / self.current_gradient_accumulation_steps


def main():
    set_seed(SEED)
    model = IntentEncoder()
    args = TrainingArguments(
        output_dir="tmp_scratch/b03_out", per_device_train_batch_size=4, gradient_accumulation_steps=4,
        num_train_epochs=2, learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2,
        max_grad_norm=0.0, logging_steps=100, save_strategy="no", report_to="none", seed=SEED,
        use_cpu=True, ddp_backend="gloo", disable_tqdm=True,
    )
    trainer = ConsistencyTrainer(model=model, args=args, train_dataset=IntentData())
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        if os.environ.get("B128_DUMP"):
            torch.save({n: p.detach().float().clone() for n, p in trainer.model.named_parameters()},
                       os.environ["B128_DUMP"])


if __name__ == "__main__":
    main()
