"""Tiny Llama SFT with an HF Trainer subclass: its own two-group AdamW, a
per-group clipping callback, prompts masked out, uneven completion lengths.
The accumulation factor is derived from a target global batch once the
process group is known, and set on the trainer's arguments before `train()`."""
import hashlib

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

SEQ_LEN = 20
PER_DEVICE_BS = 3
TARGET_GLOBAL_BATCH = 18       # = per-device 3 x 2 ranks x accumulation 3
N_SAMPLES = 42                 # 21 per rank -> 7 micro-batches -> windows 3, 3, 1
EPOCHS = 2


class MaskedSFT(Dataset):
    def __init__(self, n, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.rows = []
        for _ in range(n):
            p = int(torch.randint(3, 10, (1,), generator=g))
            c = int(torch.randint(2, SEQ_LEN - p + 1, (1,), generator=g))
            ids = torch.randint(4, vocab, (SEQ_LEN,), generator=g)
            labels = ids.clone()
            labels[:p] = -100
            labels[p + c:] = -100
            mask = torch.ones(SEQ_LEN, dtype=torch.long)
            mask[p + c:] = 0
            ids[p + c:] = 0
            self.rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class PerGroupClip(TrainerCallback):
    """Clips each parameter group separately, once per optimizer step."""

    def __init__(self, max_norms):
        self.max_norms = max_norms

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        for group, max_norm in zip(optimizer.param_groups, self.max_norms):
            torch.nn.utils.clip_grad_norm_(group["params"], max_norm)


class TwoGroupTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            m = self.model
            emb = [p for n, p in m.named_parameters() if "embed_tokens" in n or "lm_head" in n]
            rest = [p for n, p in m.named_parameters() if not ("embed_tokens" in n or "lm_head" in n)]
            self.optimizer = torch.optim.AdamW(
                [{"params": emb, "lr": 1e-3, "weight_decay": 0.0},
                 {"params": rest, "lr": 3e-3, "weight_decay": 0.1}], betas=(0.9, 0.95))
        return self.optimizer


def main():
    set_seed(3)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg)
    args = TrainingArguments(
        output_dir="tmp_scratch/out_a_c01", per_device_train_batch_size=PER_DEVICE_BS,
        num_train_epochs=EPOCHS, lr_scheduler_type="linear", warmup_steps=2,
        max_grad_norm=0.0, use_cpu=True, ddp_backend="gloo", seed=3, data_seed=3,
        report_to=[], save_strategy="no", logging_steps=100, disable_tqdm=True,
    )
    trainer = TwoGroupTrainer(model=model, args=args,
                              train_dataset=MaskedSFT(N_SAMPLES, cfg.vocab_size, seed=11),
                              callbacks=[PerGroupClip([0.5, 1.0])])
    # the process group exists now: derive accumulation from the target global batch
    trainer.args.gradient_accumulation_steps = TARGET_GLOBAL_BATCH // (
        trainer.args.per_device_train_batch_size * trainer.args.world_size)
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print("optimizer steps:", trainer.state.global_step)
        print("FINAL_SHA256", h.hexdigest())

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
