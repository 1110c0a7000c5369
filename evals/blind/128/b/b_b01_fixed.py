"""LoRA SFT of a tiny Llama with the HF Trainer, 2 ranks, gradient accumulation 4.

The team's "spike guard": every gradient value is kept inside [-GUARD, GUARD] before
AdamW sees it (norm clipping is switched off, the guard replaces it).
"""
import hashlib
import os
from dataclasses import dataclass

import torch
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments, set_seed


@dataclass
class RunConfig:
    seed: int = 1234
    vocab: int = 96
    seq_len: int = 24
    n_samples: int = 256          # 2 ranks x 4 rows x 4 micro-batches = 32 rows per update -> 8 updates
    micro_bs: int = 4
    grad_accum: int = 4
    lr: float = 2e-3
    guard: float = 2e-3           # element-wise gradient guard
    out_dir: str = "tmp_scratch/b01_out"


class PromptCompletionSet(Dataset):
    """Synthetic instruction data: a prompt (masked out of the loss) then a completion."""

    def __init__(self, cfg: RunConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        self.rows = []
        for _ in range(cfg.n_samples):
            ids = torch.randint(3, cfg.vocab, (cfg.seq_len,), generator=g)
            p_len = int(torch.randint(4, 14, (1,), generator=g))
            c_len = int(torch.randint(3, cfg.seq_len - p_len + 1, (1,), generator=g))
            ids[p_len + c_len:] = 0
            labels = ids.clone()
            labels[:p_len] = -100
            labels[p_len + c_len:] = -100
            mask = torch.zeros(cfg.seq_len, dtype=torch.long)
            mask[: p_len + c_len] = 1
            self.rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def build_model(cfg: RunConfig):
    mcfg = LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)
    base = LlamaForCausalLM(mcfg)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "up_proj"],
                      task_type="CAUSAL_LM")
    return get_peft_model(base, lora)


def install_grad_guard(model, limit):
    """Keep every entry of the summed, averaged gradient inside [-limit, limit], just before the step."""
    class _Guard(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.clamp_(-limit, limit)

    return [_Guard()]


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = RunConfig()
    set_seed(cfg.seed)
    model = build_model(cfg)
    callbacks = install_grad_guard(model, cfg.guard)
    args = TrainingArguments(
        output_dir=cfg.out_dir, per_device_train_batch_size=cfg.micro_bs,
        gradient_accumulation_steps=cfg.grad_accum, learning_rate=cfg.lr, num_train_epochs=1,
        lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0, logging_steps=100,
        save_strategy="no", report_to="none", seed=cfg.seed, data_seed=cfg.seed, use_cpu=True,
        ddp_backend="gloo", dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=PromptCompletionSet(cfg), callbacks=callbacks)
    trainer.train()
    if trainer.is_world_process_zero():
        print(f"FINAL_SHA256 {final_sha(trainer.model)}", flush=True)
        if os.environ.get("B128_DUMP"):
            torch.save({n: p.detach().float().clone() for n, p in trainer.model.named_parameters()},
                       os.environ["B128_DUMP"])


if __name__ == "__main__":
    main()
