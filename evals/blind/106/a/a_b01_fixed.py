"""LoRA fine-tuning of a small causal LM with Accelerate (runner class + argparse)."""
import argparse
import hashlib
import math

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=24)
    p.add_argument("--rows", type=int, default=192)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--mixed-precision", default="no")
    return p.parse_args()


def build_model(args):
    base = GPT2LMHeadModel(GPT2Config(vocab_size=args.vocab, n_positions=args.seq_len, n_embd=48,
                                      n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["c_attn", "c_proj"],
                      fan_in_fan_out=True, bias="none", init_lora_weights="gaussian")
    return get_peft_model(base, lora)


def build_data(args):
    g = torch.Generator().manual_seed(args.seed)
    # a learnable toy language: next token = (3 * token + 1) mod vocab with noise
    start = torch.randint(0, args.vocab, (args.rows, 1), generator=g)
    seq = [start]
    for _ in range(args.seq_len - 1):
        nxt = (3 * seq[-1] + 1) % args.vocab
        noise = torch.randint(0, args.vocab, nxt.shape, generator=g)
        keep = torch.rand(nxt.shape, generator=g) < 0.8
        seq.append(torch.where(keep, nxt, noise))
    return TensorDataset(torch.cat(seq, dim=1))


class LoraRunner:
    def __init__(self, args):
        self.args = args
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum,
                                       mixed_precision=args.mixed_precision)
        set_seed(args.seed)
        model = build_model(args)
        loader = DataLoader(build_data(args), batch_size=args.micro_batch, shuffle=True,
                            generator=torch.Generator().manual_seed(args.seed))
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                      lr=args.lr, weight_decay=0.0)
        updates = args.epochs * math.ceil(len(loader) / self.accelerator.num_processes / args.grad_accum)
        # a prepared scheduler is stepped once per process per optimizer step
        scheduler = get_cosine_schedule_with_warmup(
            optimizer, num_warmup_steps=2 * self.accelerator.num_processes,
            num_training_steps=updates * self.accelerator.num_processes)
        (self.model, self.optimizer, self.loader,
         self.scheduler) = self.accelerator.prepare(model, optimizer, loader, scheduler)

    def _forward_backward(self, batch):
        (ids,) = batch
        with self.accelerator.autocast():
            loss = self.model(input_ids=ids, labels=ids).loss
        self.accelerator.backward(loss)
        return loss.detach()

    def _optimizer_step(self):
        if self.args.max_grad_norm > 0:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()

    def fit(self):
        self.model.train()
        for _ in range(self.args.epochs):
            for batch in self.loader:
                with self.accelerator.accumulate(self.model):
                    self._forward_backward(batch)
                    if self.accelerator.sync_gradients:
                        self._optimizer_step()

    def final_sha(self):
        self.accelerator.wait_for_everyone()
        model = self.accelerator.unwrap_model(self.model)
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
        if self.accelerator.is_main_process:
            print(f"FINAL_SHA256 {hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


def main():
    torch.use_deterministic_algorithms(True)
    runner = LoraRunner(parse_args())
    runner.fit()
    runner.final_sha()


if __name__ == "__main__":
    main()
