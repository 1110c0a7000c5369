"""GRPO written by hand on top of the HF Trainer (TRL-style), tiny random Llama policy.

Each Trainer batch is a batch of prompts. `training_step` samples a group of
completions per prompt with the current policy, turns group-normalised rewards into
advantages and backpropagates the clipped-ratio loss in a few micro-chunks so the
rollout batch never has to sit in one forward.
"""
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


@dataclass
class GRPOArgs:
    n_prompts: int = 64
    prompt_len: int = 4
    prompts_per_device: int = 4
    group_size: int = 4
    max_new_tokens: int = 6
    micro_chunks: int = 4          # backward passes per rollout batch
    clip_eps: float = 0.2
    lr: float = 5e-3
    seed: int = 2024


class PromptSet(Dataset):
    def __init__(self, n, p_len, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.prompts = torch.randint(2, vocab, (n, p_len), generator=g)

    def __len__(self):
        return len(self.prompts)

    def __getitem__(self, i):
        return {"prompt_ids": self.prompts[i]}


def reward_fn(prompts, completions):
    # reward completions that copy the prompt's first token and stay in the lower half of the vocabulary
    copy = (completions == prompts[:, :1]).float().mean(1)
    low = (completions < 16).float().mean(1)
    return copy + 0.5 * low


def token_logps(model, seqs, p_len):
    logits = model(input_ids=seqs).logits[:, p_len - 1:-1]
    return torch.gather(F.log_softmax(logits.float(), -1), 2, seqs[:, p_len:, None]).squeeze(-1)


class HandGRPOTrainer(Trainer):
    def __init__(self, *a, grpo: GRPOArgs, **kw):
        super().__init__(*a, **kw)
        self.grpo = grpo
        self._rollouts = 0

    @torch.no_grad()
    def _rollout(self, model, prompts):
        g = self.grpo
        policy = self.accelerator.unwrap_model(model)
        gen = torch.Generator().manual_seed(g.seed + 1000 * self.args.process_index + self._rollouts)
        self._rollouts += 1
        seqs = prompts.repeat_interleave(g.group_size, 0)
        for _ in range(g.max_new_tokens):
            probs = F.softmax(policy(input_ids=seqs).logits[:, -1].float(), -1)
            seqs = torch.cat([seqs, torch.multinomial(probs, 1, generator=gen)], 1)
        r = reward_fn(seqs[:, : g.prompt_len], seqs[:, g.prompt_len:]).view(-1, g.group_size)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
        old = token_logps(policy, seqs, g.prompt_len)
        return seqs, adv, old

    def training_step(self, model, inputs, num_items_in_batch=None):
        g = self.grpo
        model.train()
        seqs, adv, old = self._rollout(model, inputs["prompt_ids"])
        total = torch.zeros(())
        for idx in torch.arange(seqs.size(0)).chunk(g.micro_chunks):
            logp = token_logps(model, seqs[idx], g.prompt_len)
            ratio = torch.exp(logp - old[idx])
            a = adv[idx, None]
            per_tok = -torch.min(ratio * a, ratio.clamp(1 - g.clip_eps, 1 + g.clip_eps) * a)
            loss = per_tok.mean() / g.micro_chunks
            self.accelerator.backward(loss)
            total += loss.detach()
        return total


def main():
    g = GRPOArgs()
    torch.manual_seed(g.seed)
    cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    policy = LlamaForCausalLM(cfg)
    args = TrainingArguments(
        output_dir=os.path.join("tmp_scratch", os.path.basename(__file__)[:-3] + "_out"),
        per_device_train_batch_size=g.prompts_per_device,
        gradient_accumulation_steps=1,  # the micro-chunks in training_step are the accumulation
        num_train_epochs=1,
        learning_rate=g.lr,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        seed=g.seed,
        use_cpu=True,
        ddp_backend="gloo",
        remove_unused_columns=False,
        save_strategy="no",
        report_to="none",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = HandGRPOTrainer(model=policy, args=args, grpo=g,
                              train_dataset=PromptSet(g.n_prompts, g.prompt_len, cfg.vocab_size, seed=11))
    trainer.train()

    if trainer.args.process_index == 0:
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
