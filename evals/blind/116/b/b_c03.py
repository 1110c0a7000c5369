"""DPO on a LoRA adapter with Accelerate, accumulation written by hand.

The reference policy is the same network with the adapter switched off.  The
collator drops pairs whose chosen/rejected lengths differ too much, so each
micro-batch holds 1-4 pairs.  Each window's K micro-batches are read ahead so
the loss can be normalised by the window's pair count over all ranks:
    loss_mb = W * sum(pair losses) / window_pairs_all_ranks
and DDP's mean over ranks turns the window's summed gradients into the
gradient of the mean DPO loss of the whole window.  Epoch: 8 micro-batches per
rank at K = 3 -> windows 3-3-2, each normalised by its own pair count.
"""
import hashlib
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

K = 3
BETA = 0.2
LEN = 12


class PairSource:
    """Per-rank stream of raw (prompt, chosen, rejected, chosen_len, rejected_len) micro-batches."""

    def __init__(self, rank, n_micro=8, seed=17):
        g = torch.Generator().manual_seed(seed + 1000 * rank)
        self.batches = []
        for _ in range(n_micro):
            rows = []
            for _ in range(4):
                chosen = torch.randint(0, 64, (LEN,), generator=g)
                rejected = torch.randint(0, 64, (LEN,), generator=g)
                cl, rl = (int(v) for v in torch.randint(3, LEN, (2,), generator=g))
                rows.append((chosen, rejected, cl, rl))
            self.batches.append(rows)

    def __iter__(self):
        return iter(self.batches)


def collate(rows, max_gap=5):
    keep = [r for r in rows if abs(r[2] - r[3]) <= max_gap] or rows[:1]
    ids = torch.stack([torch.stack([c, r]) for c, r, _, _ in keep])        # [P, 2, L]
    mask = torch.zeros(len(keep), 2, LEN)
    for i, (_, _, cl, rl) in enumerate(keep):
        mask[i, 0, LEN - cl:] = 1
        mask[i, 1, LEN - rl:] = 1
    return ids, mask


def seq_logp(model, ids, mask):
    P = ids.shape[0]
    flat, m = ids.view(2 * P, LEN), mask.view(2 * P, LEN)
    logits = model(input_ids=flat).logits[:, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, flat[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (lp * m[:, 1:]).sum(-1).view(P, 2)


def main():
    accelerator = Accelerator(cpu=True)
    set_seed(9)
    W = accelerator.num_processes
    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    policy = get_peft_model(GPT2LMHeadModel(cfg),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"],
                                       lora_dropout=0.0, fan_in_fan_out=True))
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    policy, opt = accelerator.prepare(policy, opt)
    inner = accelerator.unwrap_model(policy)

    for epoch in range(3):
        micro = [collate(rows) for rows in PairSource(accelerator.process_index, seed=17 + epoch)]
        for w0 in range(0, len(micro), K):
            window = micro[w0:w0 + K]
            n_pairs = torch.tensor(float(sum(b[0].shape[0] for b in window)))
            dist.all_reduce(n_pairs)
            for j, (ids, mask) in enumerate(window):
                last = j == len(window) - 1
                with torch.no_grad(), inner.disable_adapter():
                    ref = seq_logp(inner, ids, mask)
                with (nullcontext() if last else accelerator.no_sync(policy)):
                    pol = seq_logp(policy, ids, mask)
                    margin = BETA * ((pol[:, 0] - ref[:, 0]) - (pol[:, 1] - ref[:, 1]))
                    loss = -F.logsigmoid(margin).sum() * W / n_pairs
                    accelerator.backward(loss)
            accelerator.clip_grad_norm_(policy.parameters(), 1.0)
            opt.step()
            opt.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in inner.named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}")


if __name__ == "__main__":
    main()
