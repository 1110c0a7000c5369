"""DPO with a LoRA adapter under Accelerate, LoRA+-style optimizer (B matrices at 8x the
LR of A), a checkpoint written after step 3 and a resume into rebuilt objects: a new
base model, a new adapter loaded from the checkpoint, a new optimizer and scheduler, and
the prepared loader skipping the micro-batches already used.
"""
import hashlib
import os
import random
import tempfile

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup

PAD = 0
HP = {"beta": 0.2, "lr": 2e-3, "loraplus_ratio": 8.0, "K": 2, "pairs": 3, "steps": 7,
      "save_after": 3, "seed": 8}


class Pairs(Dataset):
    def __init__(self, n, seed):
        g = random.Random(seed)
        self.rows = [([g.randrange(3, 48) for _ in range(g.randrange(2, 5))],
                      [g.randrange(3, 24) for _ in range(g.randrange(2, 7))],
                      [g.randrange(24, 48) for _ in range(g.randrange(2, 7))]) for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def collate(rows):
    seqs = [p + c for p, c, _ in rows] + [p + r for p, _, r in rows]
    plen = [len(p) for p, _, _ in rows] * 2
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
    am, lm = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, (s, pl) in enumerate(zip(seqs, plen)):
        ids[i, : len(s)] = torch.tensor(s)
        am[i, : len(s)] = 1
        lm[i, pl: len(s)] = 1
    return {"input_ids": ids, "attention_mask": am, "loss_mask": lm}


def logps(model, b):
    lg = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits[:, :-1].float()
    tok = torch.gather(lg.log_softmax(-1), 2, b["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    return (tok * b["loss_mask"][:, 1:]).sum(-1)


def build(acc, total_steps):
    set_seed(HP["seed"])
    base = LlamaForCausalLM(LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=PAD))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                            target_modules=["q_proj", "v_proj", "gate_proj"]))
    a_params = [p for n, p in model.named_parameters() if p.requires_grad and "lora_A" in n]
    b_params = [p for n, p in model.named_parameters() if p.requires_grad and "lora_B" in n]
    opt = torch.optim.AdamW([{"params": a_params, "lr": HP["lr"]},
                             {"params": b_params, "lr": HP["lr"] * HP["loraplus_ratio"]}])
    sched = get_linear_schedule_with_warmup(opt, 1, total_steps)   # stepped by hand, per update
    model, opt = acc.prepare(model, opt)
    return model, opt, sched


def run(acc, model, opt, sched, loader, step, stop_at):
    peft_model = acc.unwrap_model(model)
    model.train()
    for b in loader:
        with acc.accumulate(model):
            n = b["input_ids"].size(0) // 2
            pol = logps(model, b)
            with torch.no_grad(), peft_model.disable_adapter():
                ref = logps(model, b)
            m = (pol[:n] - ref[:n]) - (pol[n:] - ref[n:])
            acc.backward(-F.logsigmoid(HP["beta"] * m).mean())
            opt.step()
            opt.zero_grad()
        if acc.sync_gradients:
            sched.step()
            step += 1
            if step == stop_at:
                break
    return step


def fingerprint(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    acc = Accelerator(cpu=True, gradient_accumulation_steps=HP["K"])
    torch.use_deterministic_algorithms(True)
    K, W = HP["K"], acc.num_processes
    data = Pairs(HP["steps"] * K * W * HP["pairs"], 3)
    loader = acc.prepare(DataLoader(data, batch_size=HP["pairs"], shuffle=False, collate_fn=collate))

    ckdir = tempfile.mkdtemp(prefix="dpo_ck_") if acc.is_main_process else None
    ckdir = acc.gather_for_metrics([ckdir], use_gather_object=True)[0]

    # phase 1: train and checkpoint
    model, opt, sched = build(acc, HP["steps"])
    step = run(acc, model, opt, sched, loader, 0, HP["save_after"])
    if acc.is_main_process:
        torch.save({"adapter": get_peft_model_state_dict(acc.unwrap_model(model)),
                    "optim": opt.state_dict(), "sched": sched.state_dict(), "step": step},
                   os.path.join(ckdir, "ck.pt"))
    acc.wait_for_everyone()
    del model, opt, sched

    # phase 2: as after a preemption, everything rebuilt and restored
    ck = torch.load(os.path.join(ckdir, "ck.pt"), weights_only=False)
    model, opt, sched = build(acc, HP["steps"])
    set_peft_model_state_dict(acc.unwrap_model(model), ck["adapter"])
    opt.load_state_dict(ck["optim"])
    sched.load_state_dict(ck["sched"])
    resumed = acc.skip_first_batches(loader, ck["step"] * K)
    step = run(acc, model, opt, sched, resumed, ck["step"], HP["steps"])
    acc.print(f"finished at step {step}")

    if acc.is_main_process:
        print(f"FINAL_SHA256 {fingerprint(acc.unwrap_model(model))}")
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
