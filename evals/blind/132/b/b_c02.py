"""Accelerate + PEFT LoRA, K = 3, bf16 autocast, two optimizers (AdamW on the
adapter, SGD on the norms) and ragged sequences normalised over each window's
all-ranks token count, read ahead before the window's backwards."""
import hashlib

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin, set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM

K = 3
VOCAB = 72


class Ragged(Dataset):
    def __init__(self, n, seed=5):
        g = torch.Generator().manual_seed(seed)
        self.rows = [torch.randint(1, VOCAB, (int(torch.randint(4, 16, (1,), generator=g)),), generator=g) for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def pad(batch):
    W = max(len(r) for r in batch)
    ids = torch.zeros((len(batch), W), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(batch):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return ids, mask


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def windows(loader, k):
    buf = []
    for b in loader:
        buf.append(b)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def main():
    # windows are read ahead, so the loader's end flag must not drive the sync
    plugin = GradientAccumulationPlugin(num_steps=K, sync_with_dataloader=False)
    acc = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_plugin=plugin)
    assert acc.num_processes == 2
    set_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj"]))
    for n, p in model.named_parameters():
        if "norm" in n:
            p.requires_grad_(True)
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    norms = [p for n, p in model.named_parameters() if "norm" in n]
    opt_a = torch.optim.AdamW(lora, lr=4e-3)
    opt_b = torch.optim.SGD(norms, lr=5e-2, momentum=0.9)
    loader = DataLoader(Ragged(36), batch_size=2, shuffle=True, collate_fn=pad,
                        generator=torch.Generator().manual_seed(1))
    model, opt_a, opt_b, loader = acc.prepare(model, opt_a, opt_b, loader)

    for epoch in range(2):
        for win in windows(loader, K):
            # the window's label-token count over all ranks (shifted labels)
            local = sum(int(m[:, 1:].sum()) for _, m in win)
            n_window = acc.gather(torch.tensor([local])).sum().item()
            for ids, mask in win:
                with acc.accumulate(model):
                    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
                    tgt = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
                    s = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1), ignore_index=-100, reduction="sum")
                    # backward divides by K and DDP averages over the ranks
                    acc.backward(s * K * acc.num_processes / n_window)
                    if acc.sync_gradients:
                        acc.clip_grad_norm_(lora + norms, 0.5)
                    opt_a.step()
                    opt_b.step()
                    opt_a.zero_grad()
                    opt_b.zero_grad()

    acc.wait_for_everyone()
    if acc.is_main_process:
        print("FINAL_SHA256", params_sha256(acc.unwrap_model(model)), flush=True)


if __name__ == "__main__":
    main()
