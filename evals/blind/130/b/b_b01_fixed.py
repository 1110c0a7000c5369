"""LoRA SFT with the HF Trainer, plus a callback that tracks per-micro-batch gradient norms
(a cheap gradient-noise-scale monitor)."""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)
from peft import LoraConfig, get_peft_model

SEQ = 16
VOCAB = 64
ACCUM = 4
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                   os.path.splitext(os.path.basename(__file__))[0])


class PromptCompletionSet(Dataset):
    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            ids = torch.randint(3, VOCAB, (SEQ,), generator=g)
            plen = int(torch.randint(3, 12, (1,), generator=g))
            labels = ids.clone()
            labels[:plen] = -100
            self.rows.append({"input_ids": ids, "attention_mask": torch.ones(SEQ, dtype=torch.long),
                              "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class GradNoiseMonitor(TrainerCallback):
    """Records the norm of each micro-batch's gradient so we can estimate the gradient
    noise scale B_simple = tr(Sigma) / |G|^2 offline."""

    def __init__(self):
        self.micro_norms = []

    def _micro_grad_norm(self, model):
        sq = 0.0
        for p in model.parameters():
            if p.grad is not None:
                sq += float(p.grad.detach().float().pow(2).sum())
        return sq ** 0.5

    def on_substep_end(self, args, state, control, model=None, **kwargs):
        self.micro_norms.append(self._micro_grad_norm(model))


def main():
    set_seed(1234)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ)
    base = LlamaForCausalLM(cfg)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                                            lora_dropout=0.0, init_lora_weights="gaussian"))

    args = TrainingArguments(
        output_dir=OUT, per_device_train_batch_size=2, gradient_accumulation_steps=ACCUM,
        num_train_epochs=2, learning_rate=3e-3, weight_decay=0.0, max_grad_norm=0.0,
        lr_scheduler_type="constant", logging_strategy="no", save_strategy="no", report_to=[],
        seed=1234, data_seed=1234, ddp_backend="gloo", use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=PromptCompletionSet(96),
                      callbacks=[GradNoiseMonitor()])
    trainer.train()

    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
