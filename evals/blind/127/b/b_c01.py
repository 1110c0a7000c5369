"""Stock HF Trainer on a tiny Qwen2 causal LM, ragged (right-padded) sequences.

Gradient accumulation is configured through the Accelerate side of TrainingArguments
(``accelerator_config.gradient_accumulation_kwargs.num_steps``); the Trainer adopts it as
its own ``gradient_accumulation_steps``. 8 micro-batches per rank per epoch -> windows
of 3, 3, 2. The clip at 0.25 acts on most steps.
"""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (Qwen2Config, Qwen2ForCausalLM, Trainer, TrainingArguments,
                          set_seed)

RUN_NAME = os.path.splitext(os.path.basename(__file__))[0]
SETTINGS = dict(vocab=300, max_len=20, min_len=5, rows=64, micro_batch=4, epochs=2,
                lr=2e-3, clip=0.25, accum=3, seed=2027)


class RaggedLM(Dataset):
    def __init__(self, s):
        g = torch.Generator().manual_seed(s["seed"])
        self.rows = []
        for _ in range(s["rows"]):
            n = int(torch.randint(s["min_len"], s["max_len"] + 1, (1,), generator=g))
            ids = torch.full((s["max_len"],), 0, dtype=torch.long)
            ids[:n] = torch.randint(1, s["vocab"], (n,), generator=g)
            mask = torch.zeros(s["max_len"], dtype=torch.long)
            mask[:n] = 1
            labels = ids.clone()
            labels[n:] = -100
            labels[:2] = -100          # the two "prompt" tokens are not trained on
            self.rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def main():
    s = SETTINGS
    set_seed(s["seed"])
    cfg = Qwen2Config(vocab_size=s["vocab"], hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    args = TrainingArguments(
        output_dir=os.path.join("tmp_scratch", "out_" + RUN_NAME),
        per_device_train_batch_size=s["micro_batch"],
        accelerator_config={"gradient_accumulation_kwargs": {"num_steps": s["accum"]}},
        num_train_epochs=s["epochs"],
        learning_rate=s["lr"],
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=s["clip"],
        weight_decay=0.01,
        logging_steps=1000,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        seed=s["seed"],
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=RaggedLM(s))
    trainer.train()
    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"world_size={trainer.args.world_size} ga={trainer.args.gradient_accumulation_steps} "
              f"global_step={trainer.state.global_step}", flush=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
