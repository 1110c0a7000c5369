"""Causal-LM pretraining with the stock HF Trainer on a tiny Llama.

A small callback probes a held-out batch after every optimizer step and logs
how well the training update generalises (probe loss and probe gradient norm).
"""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

SEQ = 24
VOCAB = 96


class RandomLM(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        # a little structure so the model has something to learn
        base = torch.randint(4, VOCAB, (n, SEQ), generator=g)
        base[:, 1::2] = (base[:, 0::2] * 3 + 1) % VOCAB
        self.ids = base

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i]}


def collate(rows):
    ids = torch.stack([r["input_ids"] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


class ProbeCallback(TrainerCallback):
    """Measure the loss/gradient on a fixed held-out batch after each update."""

    def __init__(self, probe_batch, every=1):
        self.probe = probe_batch
        self.every = every
        self.history = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every:
            return
        batch = {k: v.to(args.device) for k, v in self.probe.items()}
        with torch.enable_grad():
            out = model(**batch)
            out.loss.backward()
        gnorm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None))
        self.history.append((state.global_step, out.loss.item(), gnorm.item()))
        model.zero_grad(set_to_none=True)  # the probe must not leak into the next window


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(1234)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)

    train = RandomLM(96, seed=7)
    probe = collate([RandomLM(4, seed=99)[i] for i in range(4)])

    args = TrainingArguments(
        output_dir="tmp_scratch/b01_out",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        num_train_epochs=2,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        weight_decay=0.0,
        max_grad_norm=0.0,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=1234,
        data_seed=1234,
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_backend="gloo",
    )
    cb = ProbeCallback(probe)
    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=collate, callbacks=[cb])
    trainer.train()
    if trainer.is_world_process_zero():
        print("probe history:", [(s, round(l, 3)) for s, l, _ in cb.history[-3:]])
        print("FINAL_SHA256", final_sha(trainer.model), flush=True)


if __name__ == "__main__":
    main()
