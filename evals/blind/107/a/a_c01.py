"""GRPO-style RL on a LoRA adapter with Accelerate (no accumulate(): the loop defers the
gradient sync itself with `accelerator.no_sync`).

Each generation round samples G completions per prompt for K micro-batches at once, like
TRL's `steps_per_generation`; the policy loss is a token sum over the whole round's
completion tokens on all ranks (DAPO-style normalisation). The last round is short.
A KL penalty to the base model (adapter switched off) uses the same normaliser.
"""
import hashlib

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

PAD, EOS = 0, 1


class GRPOArgs:
    lr = 2e-3
    beta = 0.05
    num_generations = 4
    prompts_per_micro = 2
    steps_per_generation = 3      # K
    rounds = 5
    last_round_micro = 2          # the final round only has 2 micro-batches
    max_new = 6
    max_grad_norm = 0.2
    seed = 31


def reward_fn(completions):
    # prefer even token ids, penalise length a little
    return torch.tensor([sum(1.0 for t in c if t % 2 == 0) - 0.2 * len(c) for c in completions])


@torch.no_grad()
def sample(peft_model, prompts, G, max_new, gen):
    outs = []
    for p in prompts:
        for _ in range(G):
            seq = list(p)
            comp = []
            for _ in range(max_new):
                logits = peft_model(input_ids=torch.tensor([seq])).logits[0, -1]
                t = int(torch.multinomial(logits.softmax(-1), 1, generator=gen))
                comp.append(t)
                seq.append(t)
                if t == EOS:
                    break
            outs.append((list(p), comp))
    return outs


def collate(rows):
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    cmask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        cmask[i, len(p): len(p) + len(c)] = 1
    return ids, cmask


def token_logps(model, ids):
    logits = model(input_ids=ids).logits[:, :-1].float()
    return torch.gather(logits.log_softmax(-1), 2, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def fingerprint(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    a = GRPOArgs()
    acc = Accelerator(cpu=True)   # accumulation is handled below
    set_seed(a.seed)
    torch.use_deterministic_algorithms(True)
    W = acc.num_processes
    base = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=PAD, eos_token_id=EOS))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "down_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr)
    model, opt = acc.prepare(model, opt)
    peft_model = acc.unwrap_model(model)

    pg = torch.Generator().manual_seed(1000)
    all_prompts = [[int(x) for x in torch.randint(2, 32, (int(torch.randint(2, 5, (1,), generator=pg)),), generator=pg)]
                   for _ in range(a.rounds * a.steps_per_generation * a.prompts_per_micro * W)]
    gen = torch.Generator().manual_seed(5000 + acc.process_index)

    cursor = 0
    for rnd in range(a.rounds):
        K = a.last_round_micro if rnd == a.rounds - 1 else a.steps_per_generation
        n_prompts = K * a.prompts_per_micro
        # prompts for this round, rank-strided
        round_prompts = all_prompts[cursor: cursor + n_prompts * W]
        cursor += n_prompts * W
        mine = round_prompts[acc.process_index::W]
        model.eval()
        rollouts = sample(peft_model, mine, a.num_generations, a.max_new, gen)
        model.train()
        r = reward_fn([c for _, c in rollouts]).view(-1, a.num_generations)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)

        per_micro = a.prompts_per_micro * a.num_generations
        micro = [rollouts[i: i + per_micro] for i in range(0, len(rollouts), per_micro)]
        n_tok = torch.tensor(float(sum(len(c) for _, c in rollouts)))
        n_tok = acc.reduce(n_tok, reduction="sum")          # all ranks, whole round

        for j, rows in enumerate(micro):
            ids, cmask = collate(rows)
            cm = cmask[:, 1:].float()
            a_j = adv[j * per_micro: (j + 1) * per_micro].unsqueeze(1)
            last = j == len(micro) - 1
            ctx = acc.no_sync(model) if not last else torch.enable_grad()
            with ctx:
                lp = token_logps(model, ids)
                with torch.no_grad(), peft_model.disable_adapter():
                    ref = token_logps(model, ids)
                ratio = torch.exp(lp - lp.detach())
                kl = torch.exp(ref - lp) - (ref - lp) - 1
                per_tok = -(ratio * a_j) + a.beta * kl
                # DDP averages over W ranks: scale back up to a sum over the round
                loss = (per_tok * cm).sum() * W / n_tok
                acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), a.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)

    if acc.is_main_process:
        print(f"FINAL_SHA256 {fingerprint(peft_model)}")
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
