"""Two-stage LoRA fine-tuning with Accelerate.

Stage 1 (epoch 0): only the LoRA adapters train.
Stage 2 (epoch 1+): the final norm and the LM head are unfrozen and join the adapters.
2 ranks, gradient accumulation 3.
"""
import hashlib
import os
from dataclasses import dataclass, field

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass
class Cfg:
    seed: int = 11
    vocab: int = 72
    seq: int = 14
    n_rows: int = 96
    batch_size: int = 2
    grad_accum: int = 3
    epochs: int = 2
    lr_lora: float = 1e-2
    lr_head: float = 3e-3
    unfreeze_at_epoch: int = 1
    head_modules: list = field(default_factory=lambda: ["model.norm", "lm_head"])


class CopyTask(Dataset):
    def __init__(self, cfg):
        g = torch.Generator().manual_seed(cfg.seed)
        self.x = torch.randint(1, cfg.vocab, (cfg.n_rows, cfg.seq), generator=g)
        half = cfg.seq // 2
        self.x[:, half:] = (self.x[:, :half] * 3) % cfg.vocab

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


class TwoStageTrainer:
    def __init__(self, cfg: Cfg):
        self.cfg = cfg
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
        assert self.accelerator.num_processes == 2
        set_seed(cfg.seed)
        base = LlamaForCausalLM(LlamaConfig(vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=4, max_position_embeddings=32,
                                            tie_word_embeddings=False))
        model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        inner = model.get_base_model()
        self.head_params = [p for name in cfg.head_modules for p in inner.get_submodule(name).parameters()]
        lora_params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW([
            {"params": lora_params, "lr": cfg.lr_lora},
            {"params": self.head_params, "lr": cfg.lr_head, "weight_decay": 0.0},
        ])
        loader = DataLoader(CopyTask(cfg), batch_size=cfg.batch_size, shuffle=False)
        self.model, self.optimizer, self.loader = self.accelerator.prepare(model, optimizer, loader)

    def maybe_unfreeze(self, epoch):
        if epoch == self.cfg.unfreeze_at_epoch:
            for p in self.head_params:
                p.requires_grad_(True)
            self.accelerator.print(f"epoch {epoch}: unfroze {len(self.head_params)} head tensors")

    def micro_step(self, batch):
        with self.accelerator.accumulate(self.model):
            loss = self.model(input_ids=batch, labels=batch).loss
            self.accelerator.backward(loss)
            self.after_backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
        return loss.detach()

    def after_backward(self):
        # the head was frozen when DDP was built, so DDP does not average it: do it here
        if self.accelerator.sync_gradients and self.head_params[0].grad is not None:
            for p in self.head_params:
                p.grad = self.accelerator.reduce(p.grad, reduction="mean")

    def fit(self):
        for epoch in range(self.cfg.epochs):
            self.maybe_unfreeze(epoch)
            self.model.train()
            for batch in self.loader:
                self.micro_step(batch)
        return self.accelerator.unwrap_model(self.model)


def main():
    trainer = TwoStageTrainer(Cfg())
    model = trainer.fit()
    if trainer.accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()},
                   f"tmp_scratch/{os.path.splitext(os.path.basename(__file__))[0]}.pt")


if __name__ == "__main__":
    main()
