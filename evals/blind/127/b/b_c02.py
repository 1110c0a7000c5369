"""Accelerate + PEFT LoRA on a tiny Llama, with a trained copy of the LM head.

Uses a GradientAccumulationPlugin with ``sync_each_batch=True`` (all-reduce on every
micro-batch, e.g. to keep memory flat), two parameter groups, a clip that acts, and a
prepared scheduler whose horizon counts the per-process scheduler calls.
"""
import hashlib
import os
from types import SimpleNamespace

import torch
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup

RUN_NAME = os.path.splitext(os.path.basename(__file__))[0]
HP = SimpleNamespace(vocab=192, seq=16, rows=96, bs=4, accum=3, lr_lora=4e-3, lr_head=1e-3,
                     clip=0.5, seed=99)


class Packed(Dataset):
    """Fixed-length packed chunks: every micro-batch holds the same number of tokens."""

    def __init__(self):
        g = torch.Generator().manual_seed(HP.seed)
        self.ids = torch.randint(0, HP.vocab, (HP.rows, HP.seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Runner:
    def __init__(self):
        plugin = GradientAccumulationPlugin(num_steps=HP.accum, sync_each_batch=True)
        self.acc = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
        assert self.acc.num_processes == 2
        set_seed(HP.seed)
        base = LlamaForCausalLM(LlamaConfig(
            vocab_size=HP.vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
            tie_word_embeddings=False))
        self.model = get_peft_model(base, LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "up_proj"],
            modules_to_save=["lm_head"], init_lora_weights="gaussian"))
        lora = [p for n, p in self.model.named_parameters() if p.requires_grad and "lora_" in n]
        head = [p for n, p in self.model.named_parameters() if p.requires_grad and "lora_" not in n]
        assert head, "modules_to_save copy should be trainable"
        self.opt = torch.optim.AdamW([{"params": lora, "lr": HP.lr_lora},
                                      {"params": head, "lr": HP.lr_head}], weight_decay=0.0)
        self.loader = DataLoader(Packed(), batch_size=HP.bs, shuffle=True,
                                 generator=torch.Generator().manual_seed(HP.seed))
        updates = len(self.loader) // self.acc.num_processes // HP.accum
        self.sched = get_linear_schedule_with_warmup(
            self.opt, self.acc.num_processes, updates * self.acc.num_processes)
        self.model, self.opt, self.loader, self.sched = self.acc.prepare(
            self.model, self.opt, self.loader, self.sched)
        self.updates = 0

    def micro_step(self, batch):
        with self.acc.accumulate(self.model):
            loss = self.model(**batch).loss
            self.acc.backward(loss)
            if self.acc.sync_gradients:
                self.acc.clip_grad_norm_(self.model.parameters(), HP.clip)
                self.updates += 1
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad()

    def fit(self):
        self.model.train()
        for batch in self.loader:
            self.micro_step(batch)

    def report(self):
        self.acc.wait_for_everyone()
        if self.acc.is_main_process:
            net = self.acc.unwrap_model(self.model)
            h = hashlib.sha256()
            for _, p in net.named_parameters():
                h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
            print(f"updates={self.updates}", flush=True)
            print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    r = Runner()
    r.fit()
    r.report()
