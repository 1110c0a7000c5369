"""Tiny LM trained with an HF Trainer subclass that packs each accumulation
window into a single forward pass (fewer kernel launches on small batches).

Run: torchrun --nproc-per-node 2 ... b_b01.py
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import Trainer, TrainingArguments, set_seed

VOCAB, DIM, SEQ = 97, 32, 16
ACCUM = 4
PER_DEVICE_BS = 2
N_SAMPLES = 96  # 48 per rank -> 24 micro-batches -> 6 optimizer steps per epoch


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, input_ids, labels=None, **kwargs):
        h = self.emb(input_ids)
        h = h + torch.tanh(self.mix(torch.cumsum(h, dim=1) / torch.arange(1, h.size(1) + 1).view(1, -1, 1)))
        logits = self.head(self.norm(h))
        out = {"logits": logits}
        if labels is not None:
            n = kwargs.get("num_items_in_batch")
            tok = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
            out["loss"] = tok / (n if n is not None else labels.ne(-100).sum())
        return out


class SyntheticSFT(torch.utils.data.Dataset):
    """Next-token targets (pre-shifted); a prompt prefix of random length is masked."""

    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.labels = torch.roll(self.ids, -1, dims=1)
        self.labels[:, -1] = -100
        plen = torch.randint(2, SEQ - 3, (n,), generator=g)
        for i in range(n):
            self.labels[i, : plen[i]] = -100

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class PackedWindowTrainer(Trainer):
    """Concatenate the micro-batches of a window so the model sees one wide batch."""

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        # Keep one entry per micro-batch: the Trainer counts its micro-steps (and its
        # sync/step boundary) from the entries of this list.
        return batch_samples, num_items_in_batch


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(1234)
    torch.use_deterministic_algorithms(True)
    model = TinyLM()
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", os.path.basename(__file__)[:-3] + "_out"),
        per_device_train_batch_size=PER_DEVICE_BS,
        gradient_accumulation_steps=ACCUM,
        num_train_epochs=2,
        learning_rate=3e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
        seed=1234,
        data_seed=1234,
        dataloader_num_workers=0,
    )
    trainer = PackedWindowTrainer(model=model, args=args, train_dataset=SyntheticSFT(N_SAMPLES))
    trainer.train()
    if trainer.args.process_index == 0:
        print(f"FINAL_SHA256 {param_sha(model)}", flush=True)


if __name__ == "__main__":
    main()
