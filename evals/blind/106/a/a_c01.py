"""Completion-only SFT of a LoRA adapter with an HF Trainer subclass.

Prompts are masked out of the labels, completions have uneven lengths, the loss is
a token sum over the window divided by the Trainer's all-ranks `num_items_in_batch`.
DDP syncs on every micro-batch (`sync_each_batch`, to save memory on big runs), the
epoch ends in a 2-batch window, and the clip at 0.15 acts (window norms 0.16-0.25).
"""
import hashlib
import os

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

SEED = 99
VOCAB = 64
SEQ = 28
ROWS = 88          # 2 ranks x 2 per micro-batch x 22 micro-batches: 5 windows of 4, then 2
GA = 4


def build_rows():
    g = torch.Generator().manual_seed(SEED)
    rows = []
    for _ in range(ROWS):
        p_len = int(torch.randint(4, 12, (1,), generator=g))
        c_len = int(torch.randint(2, SEQ - p_len + 1, (1,), generator=g))
        prompt = torch.randint(1, VOCAB, (p_len,), generator=g)
        completion = (prompt[:c_len % p_len + 1].sum() + torch.arange(c_len) * 7) % (VOCAB - 1) + 1
        pad = SEQ - p_len - c_len
        ids = torch.cat([prompt, completion, torch.zeros(pad, dtype=torch.long)])
        labels = torch.cat([torch.full((p_len,), -100), completion, torch.full((pad,), -100)])
        mask = torch.cat([torch.ones(p_len + c_len, dtype=torch.long), torch.zeros(pad, dtype=torch.long)])
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return rows


class CompletionOnlyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        logits = outputs.logits[:, :-1].float()
        tgt = labels[:, 1:]
        tok_sum = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                                  ignore_index=-100, reduction="sum")
        if num_items_in_batch is None:
            # not expected here; fall back to a per-micro-batch mean (Trainer divides by GA)
            return tok_sum / tgt.ne(-100).sum()
        # num_items_in_batch is the window's count over all ranks; DDP averages over ranks
        loss = tok_sum / num_items_in_batch * self.accelerator.num_processes
        return (loss, outputs) if return_outputs else loss


class GradNormProbe(TrainerCallback):
    def __init__(self):
        self.norms = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        sq = sum(p.grad.float().pow(2).sum() for p in model.parameters() if p.grad is not None)
        self.norms.append(float(sq) ** 0.5)


def main():
    set_seed(SEED)
    torch.use_deterministic_algorithms(True)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2,
                                      n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      bos_token_id=0, eos_token_id=0))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["c_attn", "c_fc"], fan_in_fan_out=True,
                                            init_lora_weights="gaussian"))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_c01_out")
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=2, gradient_accumulation_steps=GA,
        num_train_epochs=2, learning_rate=5e-3, lr_scheduler_type="cosine", warmup_steps=1,
        max_grad_norm=0.15, weight_decay=0.0, seed=SEED, data_seed=SEED, report_to="none",
        save_strategy="no", logging_steps=1000, disable_tqdm=True, remove_unused_columns=False,
        use_cpu=True, accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}},
    )
    probe = GradNormProbe()
    trainer = CompletionOnlyTrainer(model=model, args=args, train_dataset=build_rows(),
                                    callbacks=[probe])
    trainer.train()
    if trainer.accelerator.is_main_process:
        flat = torch.cat([p.detach().float().reshape(-1).cpu()
                          for _, p in trainer.model.named_parameters()])
        print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


if __name__ == "__main__":
    main()
