"""LoRA fine-tune of a tiny Llama with Accelerate on 2 CPU ranks.

Token-level loss: every window (K micro-batches on each of the W ranks) is one
large batch whose loss is the sum of token NLLs over the number of label
tokens in that whole window (all ranks), following Accelerate's guide for
variable-size batches.
"""
import argparse
import hashlib

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=7)
    return ap.parse_args()


def make_data(seed, n=96, seq=20, vocab=80):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (n, seq), generator=g)
    ids[:, 1::2] = (ids[:, 0::2] + 1) % vocab
    lens = torch.randint(6, seq + 1, (n,), generator=g)
    keep = torch.arange(seq)[None, :] < lens[:, None]
    labels = ids.masked_fill(~keep, -100)
    return TensorDataset(ids, keep.long(), labels)


def build_model(vocab=80):
    base = LlamaForCausalLM(
        LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    )
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj"])
    return get_peft_model(base, cfg)


def token_nll_sum(logits, labels):
    shift_logits = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
    shift_labels = labels[:, 1:].reshape(-1)
    return F.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum")


def count_items(batch):
    return (batch[2][:, 1:] != -100).sum()


def train_window(accelerator, model, optimizer, window):
    # all-ranks label-token count of the whole window
    n_local = sum(count_items(b) for b in window)
    n_global = accelerator.gather(n_local.reshape(1)).sum().item()
    for ids, mask, labels in window:
        with accelerator.accumulate(model):
            out = model(input_ids=ids, attention_mask=mask)
            # DDP averages over the ranks and accelerator.backward divides by K,
            # so multiply back by the number of processes and by K
            loss = (token_nll_sum(out.logits, labels)
                    * accelerator.num_processes * accelerator.gradient_accumulation_steps / n_global)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


def main():
    args = parse()
    set_seed(args.seed)
    plugin = GradientAccumulationPlugin(num_steps=args.grad_accum, sync_with_dataloader=False)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    model = build_model()
    loader = DataLoader(make_data(args.seed), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    model.train()
    for epoch in range(args.epochs):
        window = []
        for batch in loader:
            window.append(batch)
            if len(window) == args.grad_accum:
                train_window(accelerator, model, optimizer, window)
                window = []

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(model).named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
