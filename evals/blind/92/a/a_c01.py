"""Stock HF Trainer on a tiny Llama: frozen embeddings, two parameter groups, clipping in a callback."""
import hashlib

import torch
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)

SEED = 99
VOCAB = 80
N_SAMPLES = 56       # 28 per rank -> 7 micro-batches of 4 -> windows of 3, 3, 1
MICRO_BS = 4
ACCUM = 3
CLIP = 0.3


class MaskedSFTData(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(SEED)
        self.items = []
        for _ in range(N_SAMPLES):
            ids = torch.randint(2, VOCAB, (20,), generator=g)
            labels = ids.clone()
            labels[: int(torch.randint(3, 15, (1,), generator=g))] = -100
            self.items.append(dict(input_ids=ids, labels=labels))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class ClipOnStep(TrainerCallback):
    """Global-norm clip right before the optimizer consumes the (synced) gradients."""

    def __init__(self, max_norm):
        self.max_norm = max_norm
        self.norms = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        n = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], self.max_norm)
        self.norms.append(float(n))


class GroupedTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            decay, no_decay = [], []
            for n, p in self.model.named_parameters():
                if not p.requires_grad:
                    continue
                (no_decay if p.ndim < 2 else decay).append(p)
            self.optimizer = torch.optim.AdamW(
                [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                lr=self.args.learning_rate, betas=(0.9, 0.95))
        return self.optimizer


def main():
    set_seed(SEED)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    model.get_input_embeddings().weight.requires_grad_(False)
    args = TrainingArguments(
        output_dir="tmp_scratch/c01_out", per_device_train_batch_size=MICRO_BS,
        gradient_accumulation_steps=ACCUM, learning_rate=2e-3, num_train_epochs=2,
        lr_scheduler_type="cosine", warmup_steps=1, max_grad_norm=0.0, save_strategy="no",
        report_to=[], use_cpu=True, ddp_backend="gloo", seed=SEED, data_seed=SEED,
        logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
    )
    clip_cb = ClipOnStep(CLIP)
    trainer = GroupedTrainer(model=model, args=args, train_dataset=MaskedSFTData(),
                             data_collator=lambda rows: {k: torch.stack([r[k] for r in rows]) for k in rows[0]},
                             callbacks=[clip_cb])
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())


if __name__ == "__main__":
    main()
