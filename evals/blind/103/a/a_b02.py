"""SFT of a tiny Llama with the HF Trainer. Warm-up is budgeted in tokens
(GPT-3 style) by a callback that reads `state.num_input_tokens_seen`."""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

SEQ_LEN = 16
PROMPT_LEN = 6
PER_DEVICE_BS = 4
GRAD_ACCUM = 2
MAX_STEPS = 16
PEAK_LR = 2e-3
WARMUP_STEPS = 8


class SyntheticSFT(Dataset):
    def __init__(self, n, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (n, SEQ_LEN), generator=g)
        self.ids[:, PROMPT_LEN:] = (self.ids[:, :SEQ_LEN - PROMPT_LEN] * 7 + 3) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[:PROMPT_LEN] = -100
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


class TokenBudgetWarmup(TrainerCallback):
    """Linear warm-up over a token budget, then constant."""

    def __init__(self, warmup_tokens, peak_lr):
        self.warmup_tokens = warmup_tokens
        self.peak_lr = peak_lr

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        frac = min(1.0, (state.num_input_tokens_seen + 1) / self.warmup_tokens)
        for group in optimizer.param_groups:
            group["lr"] = self.peak_lr * frac


def sha_of(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(0)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    train_ds = SyntheticSFT(PER_DEVICE_BS * GRAD_ACCUM * world * MAX_STEPS, cfg.vocab_size, seed=1)

    args = TrainingArguments(
        output_dir="tmp_scratch/out_a_b02",
        per_device_train_batch_size=PER_DEVICE_BS,
        gradient_accumulation_steps=GRAD_ACCUM,
        max_steps=MAX_STEPS,
        learning_rate=PEAK_LR,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        include_num_input_tokens_seen="all",
        use_cpu=True,
        ddp_backend="gloo",
        seed=0,
        data_seed=0,
        report_to=[],
        save_strategy="no",
        logging_steps=100,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    # tokens per step = per-device batch x sequence length
    warmup_tokens = WARMUP_STEPS * args.per_device_train_batch_size * SEQ_LEN
    trainer = Trainer(model=model, args=args, train_dataset=train_ds,
                      callbacks=[TokenBudgetWarmup(warmup_tokens, PEAK_LR)])
    trainer.train()
    if trainer.is_world_process_zero():
        print("FINAL_SHA256", sha_of(trainer.model))

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
