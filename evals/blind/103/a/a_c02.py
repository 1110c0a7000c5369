"""PEFT LoRA on a tiny Llama with Accelerate. The loss is a token sum over the
window's token count; the count is averaged (not summed) over processes, which
already carries the x num_processes that DDP's gradient mean removes.
Accumulation through a GradientAccumulationPlugin, windows prefetched."""
import hashlib

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup

K = 2
BS = 4
SEQ = 18
EPOCHS = 2
N = 96                 # 48 per rank -> 12 micro-batches -> 6 windows per epoch


class Completions(Dataset):
    def __init__(self, n, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            p = int(torch.randint(2, 8, (1,), generator=g))
            c = int(torch.randint(1, SEQ - p, (1,), generator=g))
            ids = torch.randint(3, vocab, (SEQ,), generator=g)
            lab = torch.full((SEQ,), -100)
            lab[p:p + c] = ids[p:p + c]
            att = torch.zeros(SEQ, dtype=torch.long)
            att[:p + c] = 1
            self.items.append((ids * att, att, lab))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def token_loss_sum(model, ids, att, lab):
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
    tgt = lab[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1),
                           ignore_index=-100, reduction="sum"), (tgt != -100).sum()


def main():
    plugin = GradientAccumulationPlugin(num_steps=K, sync_with_dataloader=False)
    accelerator = Accelerator(cpu=True, gradient_accumulation_plugin=plugin)
    set_seed(21)
    torch.use_deterministic_algorithms(True)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                           target_modules=["q_proj", "v_proj", "up_proj"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=4e-3)
    loader = DataLoader(Completions(N, cfg.vocab_size, 5), batch_size=BS, shuffle=True,
                        generator=torch.Generator().manual_seed(21))
    steps_per_epoch = len(loader) // accelerator.num_processes // K
    sched = get_linear_schedule_with_warmup(opt, 2 * accelerator.num_processes,
                                            EPOCHS * steps_per_epoch * accelerator.num_processes)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)

    for epoch in range(EPOCHS):
        model.train()
        it = iter(loader)
        for _ in range(len(loader) // K):
            window = [next(it) for _ in range(K)]
            n_local = sum((b[2][:, 1:] != -100).sum() for b in window)
            n_mean = accelerator.reduce(n_local.float(), reduction="mean")
            for ids, att, lab in window:
                with accelerator.accumulate(model):
                    s, _ = token_loss_sum(model, ids, att, lab)
                    # backward() divides by K again; DDP averages ranks
                    accelerator.backward(s * K / n_mean)
                    if accelerator.sync_gradients:
                        accelerator.clip_grad_norm_(model.parameters(), 0.5)
                    opt.step()
                    sched.step()
                    opt.zero_grad()

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        h = hashlib.sha256()
        for _, p in accelerator.unwrap_model(model).named_parameters():
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest())
    accelerator.end_training()


if __name__ == "__main__":
    main()
