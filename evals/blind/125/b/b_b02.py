"""REINFORCE-style fine-tuning of a LoRA adapter with Accelerate.

Each micro-batch: sample completions for a few prompts with the current policy, score them with a
toy reward (share of even token ids), and push up the log-probability of above-average samples.
"""
import hashlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass
class RLConfig:
    seed: int = 7
    vocab: int = 64
    prompt_len: int = 5
    gen_len: int = 6
    n_prompts: int = 64
    micro_batch: int = 4
    grad_accum: int = 4
    epochs: int = 2
    lr: float = 3e-3
    lora_r: int = 4


def tiny_llama(cfg):
    mc = LlamaConfig(
        vocab_size=cfg.vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=None,
    )
    return LlamaForCausalLM(mc)


def toy_reward(completions):
    return (completions % 2 == 0).float().mean(dim=1)


def sequence_logprobs(net, seqs, prompt_len):
    """Sum of log-probabilities of the completion tokens under `net`."""
    logits = net(input_ids=seqs).logits[:, :-1].float()
    targets = seqs[:, 1:]
    logp = torch.gather(F.log_softmax(logits, dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)
    return logp[:, prompt_len - 1:].sum(dim=1)


def params_sha(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    cfg = RLConfig()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg.grad_accum)
    assert accelerator.num_processes == 2, accelerator.num_processes
    set_seed(cfg.seed)

    base = tiny_llama(cfg)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(base, lora)

    g = torch.Generator().manual_seed(cfg.seed)
    prompts = torch.randint(2, cfg.vocab, (cfg.n_prompts, cfg.prompt_len), generator=g)
    loader = DataLoader(TensorDataset(prompts), batch_size=cfg.micro_batch, shuffle=True,
                        generator=torch.Generator().manual_seed(cfg.seed))

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    # generation needs the bare PEFT model (DDP has no .generate)
    policy = accelerator.unwrap_model(model)
    torch.manual_seed(cfg.seed + 1000 * accelerator.process_index)

    n_updates = 0
    for epoch in range(cfg.epochs):
        model.train()
        for (prompt,) in loader:
            with torch.no_grad():
                seqs = policy.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt),
                                       max_new_tokens=cfg.gen_len, do_sample=True, top_k=0,
                                       pad_token_id=0)
            reward = toy_reward(seqs[:, cfg.prompt_len:])
            advantage = reward - reward.mean()

            with accelerator.accumulate(model):
                logp = sequence_logprobs(policy, seqs, cfg.prompt_len)
                loss = -(advantage * logp).mean()
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                n_updates += 1

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(f"updates={n_updates}", flush=True)
        print(f"FINAL_SHA256 {params_sha(accelerator.unwrap_model(model))}", flush=True)


if __name__ == "__main__":
    main()
