# Continued pre-training of a small causal LM through a LoRA adapter, driven by Accelerate.
# The loop lives in a small trainer class: setup() builds everything, fit() runs the epochs.
import hashlib
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM, get_cosine_schedule_with_warmup


@dataclass
class RunConfig:
    seed: int = 7
    seq_len: int = 16
    vocab: int = 128
    micro_batch: int = 4
    gradient_accumulation_steps: int = 4
    optimizer_steps: int = 8
    lr: float = 3e-3
    warmup: int = 2
    lora_r: int = 8


class LoraPretrainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg

    def setup(self):
        cfg = self.cfg
        self.accelerator = Accelerator(gradient_accumulation_steps=cfg.gradient_accumulation_steps)
        set_seed(cfg.seed)
        world = self.accelerator.num_processes
        n = cfg.micro_batch * cfg.gradient_accumulation_steps * world * cfg.optimizer_steps
        g = torch.Generator().manual_seed(cfg.seed)
        ids = torch.randint(0, cfg.vocab, (n, cfg.seq_len), generator=g)
        loader = DataLoader(TensorDataset(ids), batch_size=cfg.micro_batch, shuffle=True,
                            generator=torch.Generator().manual_seed(cfg.seed + 1))

        torch.manual_seed(cfg.seed)
        base = LlamaForCausalLM(LlamaConfig(
            vocab_size=cfg.vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
        model = get_peft_model(base, LoraConfig(r=cfg.lora_r, lora_alpha=2 * cfg.lora_r, lora_dropout=0.0,
                                                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
        # a prepared scheduler advances num_processes times per optimizer step
        sched = get_cosine_schedule_with_warmup(opt, cfg.warmup * world, cfg.optimizer_steps * world)
        self.model, self.opt, self.loader, self.sched = self.accelerator.prepare(model, opt, loader, sched)

    def train_step(self, batch):
        (ids,) = batch
        with self.accelerator.accumulate(self.model):
            out = self.model(input_ids=ids, labels=ids)
            self.accelerator.backward(out.loss)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad()
        return out.loss.detach()

    def fit(self, epochs=1):
        self.model.train()
        for epoch in range(epochs):
            for i, batch in enumerate(self.loader):
                loss = self.train_step(batch)
                if i % 8 == 0:
                    self.accelerator.print(f"epoch {epoch} micro {i} loss {loss.item():.4f}")

    def final_hash(self):
        model = self.accelerator.unwrap_model(self.model)
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        return h.hexdigest()


def main():
    trainer = LoraPretrainer(RunConfig())
    trainer.setup()
    trainer.fit()
    digest = trainer.final_hash()
    if trainer.accelerator.is_main_process:
        print(f"FINAL_SHA256 {digest}", flush=True)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
