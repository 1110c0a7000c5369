"""LoRA fine-tuning of a tiny Mistral with Accelerate (2 processes, GA 4)."""
import argparse
import hashlib
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import MistralConfig, MistralForCausalLM


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--rows", type=int, default=96)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-grad-norm", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def build_data(n, seq=12, vocab=80, seed=7):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, seq), generator=g)
    return TensorDataset(ids)


class LoraRunner:
    def __init__(self, args):
        self.args = args
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum)
        assert self.accelerator.num_processes == 2
        set_seed(args.seed)
        cfg = MistralConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
        base = MistralForCausalLM(cfg)
        lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"], lora_dropout=0.0)
        self.model = get_peft_model(base, lcfg)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
        loader = DataLoader(build_data(args.rows, seed=args.seed), batch_size=args.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(args.seed))
        self.model, self.optimizer, self.loader = self.accelerator.prepare(self.model, self.optimizer, loader)

    def _backward(self, loss):
        self.accelerator.backward(loss)
        # keep LoRA updates small: clip the adapter gradients
        if self.accelerator.sync_gradients:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)

    def train_epoch(self):
        self.model.train()
        for (ids,) in self.loader:
            with self.accelerator.accumulate(self.model):
                out = self.model(input_ids=ids, labels=ids)
                self._backward(out.loss)
                self.optimizer.step()
                self.optimizer.zero_grad()

    def fit(self):
        for _ in range(self.args.epochs):
            self.train_epoch()

    def digest(self):
        h = hashlib.sha256()
        model = self.accelerator.unwrap_model(self.model)
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        if self.accelerator.is_main_process:
            if os.environ.get("B_DUMP"):
                torch.save({n: p.detach().float().cpu() for n, p in model.named_parameters()}, os.environ["B_DUMP"])
            print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    runner = LoraRunner(parse())
    runner.fit()
    runner.digest()
