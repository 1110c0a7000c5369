"""Hidden-state + logit distillation with Accelerate.

A frozen teacher (never prepared, eval mode) and a student whose token embedding stays
frozen. A separate projection maps student hidden states to the teacher width; it is its
own prepared module with its own SGD optimizer. Both modules go into one
``accelerator.accumulate(student, proj)``.
"""
import hashlib
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM

RUN_NAME = os.path.splitext(os.path.basename(__file__))[0]


class DistillConfig:
    vocab = 160
    seq = 12
    n = 64                 # 32 per rank, micro-batch 4 -> 8 micro-batches
    bs = 4
    accum = 2
    epochs = 2             # 8 optimizer steps
    temp = 2.0
    alpha = 0.6
    beta = 0.5
    seed = 314


def tiny_llama(cfg, hidden, layers, seed):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=cfg.vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=32, tie_word_embeddings=False))


def distill_loss(cfg, s_out, t_out, proj, ids):
    # every micro-batch has bs * (seq - 1) next-token positions, so a per-micro-batch
    # mean divided by K (done by accelerator.backward) is the mean over the window
    s_logits = s_out.logits[:, :-1]
    t_logits = t_out.logits[:, :-1]
    ce = F.cross_entropy(s_logits.reshape(-1, cfg.vocab), ids[:, 1:].reshape(-1))
    kd = F.kl_div(F.log_softmax(s_logits / cfg.temp, -1).reshape(-1, cfg.vocab),
                  F.log_softmax(t_logits / cfg.temp, -1).reshape(-1, cfg.vocab),
                  log_target=True, reduction="batchmean") * cfg.temp ** 2
    hid = F.mse_loss(proj(s_out.hidden_states[-1]), t_out.hidden_states[-1])
    return (1 - cfg.alpha) * ce + cfg.alpha * kd + cfg.beta * hid


def main():
    cfg = DistillConfig()
    acc = Accelerator(cpu=True, gradient_accumulation_steps=cfg.accum)
    assert acc.num_processes == 2
    set_seed(cfg.seed)
    teacher = tiny_llama(cfg, 96, 3, cfg.seed + 1).eval().requires_grad_(False)
    student = tiny_llama(cfg, 48, 2, cfg.seed + 2)
    student.get_input_embeddings().weight.requires_grad_(False)
    proj = nn.Linear(48, 96)
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, cfg.vocab, (cfg.n, cfg.seq), generator=g)
    loader = DataLoader(TensorDataset(ids), batch_size=cfg.bs, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))
    opt_s = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=2e-3)
    opt_p = torch.optim.SGD(proj.parameters(), lr=0.05, momentum=0.9)
    student, proj, opt_s, opt_p, loader = acc.prepare(student, proj, opt_s, opt_p, loader)

    steps = 0
    for epoch in range(cfg.epochs):
        student.train()
        for (x,) in loader:
            with acc.accumulate(student, proj):
                with torch.no_grad():
                    t_out = teacher(input_ids=x, output_hidden_states=True)
                s_out = student(input_ids=x, output_hidden_states=True)
                loss = distill_loss(cfg, s_out, t_out, proj, x)
                acc.backward(loss)
                if acc.sync_gradients:
                    steps += 1
                opt_s.step()
                opt_p.step()
                opt_s.zero_grad()
                opt_p.zero_grad()

    acc.wait_for_everyone()
    if acc.is_main_process:
        h = hashlib.sha256()
        for _, p in acc.unwrap_model(student).named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        for _, p in acc.unwrap_model(proj).named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"optimizer_steps={steps}", flush=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
