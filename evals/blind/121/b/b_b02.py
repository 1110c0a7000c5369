"""LoRA continued-pretraining of a small GPT-2 with Accelerate (run_clm_no_trainer style).

Launch with torchrun; Accelerator(cpu=True) picks up the two gloo ranks.
"""
import hashlib
import math
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel, get_scheduler


@dataclass
class Cfg:
    seed: int = 17
    vocab: int = 128
    seq_len: int = 32
    n_train: int = 128
    n_eval: int = 32
    per_device_bs: int = 4
    grad_accum: int = 4
    epochs: int = 2
    lr: float = 3e-3
    warmup: int = 2
    max_grad_norm: float = 1.0
    eval_every: int = 4


class PerplexityMeter:
    """Small helper shared with our eval scripts: gathers losses over ranks."""

    def __init__(self, cpu=True):
        self.accelerator = Accelerator(cpu=cpu)

    @torch.no_grad()
    def __call__(self, model, loader):
        model.eval()
        losses = []
        for (ids,) in loader:
            out = model(input_ids=ids, labels=ids)
            losses.append(self.accelerator.gather_for_metrics(out.loss.detach().reshape(1)))
        model.train()
        return math.exp(torch.cat(losses).mean().item())


def make_data(cfg, n, seed):
    g = torch.Generator().manual_seed(seed)
    # a toy "language": next token = (prev * 5 + noise) mod vocab
    start = torch.randint(0, cfg.vocab, (n, 1), generator=g)
    noise = torch.randint(0, 3, (n, cfg.seq_len), generator=g)
    toks = [start[:, 0]]
    for t in range(1, cfg.seq_len):
        toks.append((toks[-1] * 5 + noise[:, t]) % cfg.vocab)
    return TensorDataset(torch.stack(toks, 1))


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    cfg = Cfg()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
    assert accelerator.num_processes == 2, accelerator.num_processes
    set_seed(cfg.seed)

    base = GPT2LMHeadModel(GPT2Config(vocab_size=cfg.vocab, n_positions=64, n_embd=64, n_layer=2, n_head=4))
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn", "c_fc"],
                                            lora_dropout=0.0, fan_in_fan_out=True))

    train_dl = DataLoader(make_data(cfg, cfg.n_train, 1), batch_size=cfg.per_device_bs, shuffle=True,
                          generator=torch.Generator().manual_seed(cfg.seed))
    eval_dl = DataLoader(make_data(cfg, cfg.n_eval, 2), batch_size=8)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)

    steps_per_epoch = math.ceil(len(train_dl) / accelerator.num_processes / cfg.grad_accum)
    max_train_steps = cfg.epochs * steps_per_epoch
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer,
                                 num_warmup_steps=cfg.warmup * accelerator.num_processes,
                                 num_training_steps=max_train_steps * accelerator.num_processes)

    model, optimizer, train_dl, eval_dl, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, lr_scheduler)

    ppl = PerplexityMeter(cpu=True)
    accelerator.print(f"baseline ppl {ppl(model, eval_dl):.2f}")

    completed = 0
    for epoch in range(cfg.epochs):
        model.train()
        for (ids,) in train_dl:
            with accelerator.accumulate(model):
                loss = model(input_ids=ids, labels=ids).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                completed += 1
                if completed % cfg.eval_every == 0:
                    accelerator.print(f"step {completed} ppl {ppl(model, eval_dl):.2f}")

    accelerator.wait_for_everyone()
    accelerator.print(f"optimizer steps: {completed}")
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {param_sha(accelerator.unwrap_model(model))}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
