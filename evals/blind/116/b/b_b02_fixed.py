"""Continued pre-training of a tiny Qwen2 with the stock HF Trainer.

Run settings live in one dataclass; only the fields that are set are forwarded
to TrainingArguments, everything else keeps the library default.
"""
import hashlib
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
from torch.utils.data import Dataset
from transformers import (Qwen2Config, Qwen2ForCausalLM, Trainer,
                          TrainingArguments, set_seed)


@dataclass
class RunConfig:
    output_dir: str = "tmp_scratch/b_b02_out"
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 3
    num_train_epochs: float = 4
    learning_rate: float = 2e-3
    lr_scheduler_type: str = "cosine"
    warmup_steps: Optional[int] = None
    weight_decay: Optional[float] = 0.0
    max_grad_norm: Optional[float] = None      # None -> no gradient clipping
    seed: int = 7
    report_to: list = field(default_factory=list)
    save_strategy: str = "no"
    logging_steps: int = 50
    disable_tqdm: bool = True
    use_cpu: bool = True
    ddp_backend: str = "gloo"


def to_training_args(cfg: RunConfig) -> TrainingArguments:
    kwargs = {k: v for k, v in asdict(cfg).items() if v is not None}
    if cfg.max_grad_norm is None:
        kwargs["max_grad_norm"] = 0.0   # the Trainer's default is 1.0; 0 turns clipping off
    return TrainingArguments(**kwargs)


class PackedChunks(Dataset):
    def __init__(self, n, seq_len=24, vocab=128, seed=0):
        g = torch.Generator().manual_seed(seed)
        # a little structure so the loss actually moves: token t+1 depends on t
        self.rows = []
        for _ in range(n):
            x = [int(torch.randint(0, vocab, (1,), generator=g))]
            for _ in range(seq_len - 1):
                step = int(torch.randint(1, 4, (1,), generator=g))
                x.append((x[-1] * 3 + step) % vocab)
            self.rows.append(torch.tensor(x))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i].clone()}


def collate(rows):
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def main():
    cfg = RunConfig()
    set_seed(cfg.seed)
    mcfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=True,
                       initializer_range=0.2)
    model = Qwen2ForCausalLM(mcfg)

    trainer = Trainer(model=model, args=to_training_args(cfg),
                      train_dataset=PackedChunks(48), data_collator=collate)
    trainer.train()

    if trainer.is_world_process_zero():
        digest = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            digest.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {digest.hexdigest()}")


if __name__ == "__main__":
    main()
