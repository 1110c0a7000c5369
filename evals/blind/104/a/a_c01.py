"""Completion-only SFT of a tiny Llama with the HF Trainer on 2 CPU ranks.

Gradient accumulation is configured through the Accelerator config
(`gradient_accumulation_kwargs.num_steps`), which the Trainer adopts as its own
accumulation length.  The input embedding stays frozen; the loss is the token
mean over every completion token of a window (the model receives
`num_items_in_batch`).  An epoch has 7 micro-batches per rank, so each epoch
ends with a 1-batch window.
"""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

SEED = 31
VOCAB, SEQ = 72, 18
N_TRAIN = 56          # 2 ranks x 7 micro-batches x 4
PER_DEVICE = 4
ACCUM = 3


class PromptCompletion(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(SEED)
        self.ids = torch.randint(3, VOCAB, (N_TRAIN, SEQ), generator=g)
        self.ids[:, 8:] = torch.flip(self.ids[:, :10], dims=[1])
        self.prompt_len = torch.randint(3, 9, (N_TRAIN,), generator=g)
        self.total_len = torch.randint(11, SEQ + 1, (N_TRAIN,), generator=g)

    def __len__(self):
        return N_TRAIN

    def __getitem__(self, i):
        pos = torch.arange(SEQ)
        attn = (pos < self.total_len[i]).long()
        labels = self.ids[i].clone()
        labels[(pos < self.prompt_len[i]) | (attn == 0)] = -100
        return {"input_ids": self.ids[i], "attention_mask": attn, "labels": labels}


class GradNormProbe(TrainerCallback):
    """Records the pre-clip gradient norm the Trainer logs."""

    def __init__(self):
        self.norms = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "grad_norm" in logs:
            self.norms.append(float(logs["grad_norm"]))


def main():
    set_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False))
    model.model.embed_tokens.weight.requires_grad_(False)

    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_c01_out")
    args = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=PER_DEVICE,
        accelerator_config={"gradient_accumulation_kwargs": {"num_steps": ACCUM}},
        num_train_epochs=3,
        learning_rate=4e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        max_grad_norm=0.3,
        weight_decay=0.0,
        use_cpu=True,
        seed=SEED,
        data_seed=SEED,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    probe = GradNormProbe()
    trainer = Trainer(model=model, args=args, train_dataset=PromptCompletion(), callbacks=[probe])
    assert trainer.args.gradient_accumulation_steps == ACCUM
    trainer.train()

    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
