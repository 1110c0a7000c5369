"""Stock HF Trainer, preempted and resumed: masked-prompt SFT on a tiny Llama, 2 ranks.

- 5 micro-batches per rank per epoch at K = 2: windows 2-2-1, the Trainer normalises
  each window by its own all-ranks label count (num_items_in_batch).
- a frozen token embedding, a clip of 0.3 that acts, cosine with warm-up.
- the first Trainer is "preempted" right after the checkpoint of step 4 (first window of
  epoch 1); a new Trainer on a new model object resumes from that checkpoint.
"""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)

OUT = "tmp_scratch/c_c02_out"
PREEMPT_AT = 4


class Preempt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == PREEMPT_AT:
            control.should_save = True
            control.should_training_stop = True
        return control


class SFTRows(Dataset):
    def __init__(self, n=40, vocab=96, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            p = torch.randint(3, vocab, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g)
            c_len = int(torch.randint(1, 14, (1,), generator=g))
            c = (p[:1] * 7 + torch.arange(c_len)) % (vocab - 3) + 3
            self.rows.append((p, c))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        p, c = self.rows[i]
        return {"input_ids": torch.cat([p, c]), "labels": torch.cat([torch.full_like(p, -100), c])}


def pad_collate(rows):
    n = max(len(r["input_ids"]) for r in rows)
    out = {"input_ids": torch.zeros(len(rows), n, dtype=torch.long),
           "labels": torch.full((len(rows), n), -100, dtype=torch.long),
           "attention_mask": torch.zeros(len(rows), n, dtype=torch.long)}
    for i, r in enumerate(rows):
        L = len(r["input_ids"])
        out["input_ids"][i, :L] = r["input_ids"]
        out["labels"][i, :L] = r["labels"]
        out["attention_mask"][i, :L] = 1
    return out


def build_model(seed):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, initializer_range=0.2, tie_word_embeddings=False)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg)
    model.get_input_embeddings().weight.requires_grad_(False)
    return model


def make_args():
    return TrainingArguments(
        output_dir=OUT, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        num_train_epochs=4, learning_rate=2e-3, lr_scheduler_type="cosine", warmup_steps=2,
        weight_decay=0.01, max_grad_norm=0.3, seed=5, use_cpu=True, ddp_backend="gloo",
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        dataloader_num_workers=0, save_only_model=False,
    )


def main():
    data = SFTRows()
    first = Trainer(model=build_model(seed=5), args=make_args(), train_dataset=data,
                    data_collator=pad_collate, callbacks=[Preempt()])
    first.train()
    ckpt = os.path.join(OUT, f"checkpoint-{PREEMPT_AT}")

    resumed = Trainer(model=build_model(seed=99), args=make_args(), train_dataset=data,
                      data_collator=pad_collate)
    resumed.train(resume_from_checkpoint=ckpt)

    if resumed.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in resumed.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
