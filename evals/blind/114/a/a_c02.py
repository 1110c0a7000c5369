# DPO on a LoRA adapter with Accelerate. The reference policy is the same network with the
# adapter switched off. The adapter trains with AdamW, the fully trained lm_head copy with SGD.
# The run is preempted halfway: state is saved, everything is rebuilt from scratch and resumed.
import hashlib
import os
import shutil

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM, get_linear_schedule_with_warmup

SEED = 21
K = 2
PAIRS_PER_MICRO = 3
STEPS = 8
STOP_AFTER = 4  # optimizer steps before the simulated preemption
VOCAB, PROMPT, ANSWER = 80, 6, 8
BETA = 0.2
CKPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "a_c02_ckpt")


def make_pairs(world):
    n = PAIRS_PER_MICRO * K * world * STEPS
    g = torch.Generator().manual_seed(SEED)
    prompt = torch.randint(1, VOCAB, (n, PROMPT), generator=g)
    chosen = torch.randint(1, VOCAB // 2, (n, ANSWER), generator=g)
    rejected = torch.randint(VOCAB // 2, VOCAB, (n, ANSWER), generator=g)
    return TensorDataset(torch.cat([prompt, chosen], 1), torch.cat([prompt, rejected], 1))


def answer_logp(model, ids):
    logits = model(input_ids=ids).logits[:, PROMPT - 1:-1]
    tgt = ids[:, PROMPT:]
    return torch.gather(logits.log_softmax(-1), 2, tgt.unsqueeze(-1)).squeeze(-1).sum(-1)


def build():
    accelerator = Accelerator(gradient_accumulation_steps=K)
    set_seed(SEED)
    torch.manual_seed(SEED)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                        tie_word_embeddings=False))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "o_proj"],
                                            modules_to_save=["lm_head"]))
    lora = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" in n]
    head = [p for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
    opt_lora = torch.optim.AdamW(lora, lr=3e-3, weight_decay=0.0)
    opt_head = torch.optim.SGD(head, lr=0.05, momentum=0.9)
    world = accelerator.num_processes
    sched = get_linear_schedule_with_warmup(opt_lora, 2 * world, STEPS * world)
    loader = DataLoader(make_pairs(world), batch_size=PAIRS_PER_MICRO, shuffle=False)
    model, opt_lora, opt_head, sched, loader = accelerator.prepare(model, opt_lora, opt_head, sched, loader)
    return accelerator, model, opt_lora, opt_head, sched, loader


def run(accelerator, model, opt_lora, opt_head, sched, loader, start_step, stop_step):
    model.train()
    peft_model = accelerator.unwrap_model(model)
    if start_step:
        loader = accelerator.skip_first_batches(loader, start_step * K)
    done = start_step
    for chosen, rejected in loader:
        with accelerator.accumulate(model):
            ids = torch.cat([chosen, rejected], 0)
            with torch.no_grad(), peft_model.disable_adapter():
                ref = answer_logp(peft_model, ids)
            pol = answer_logp(model, ids)
            margin = (pol - ref).view(2, -1)
            loss = -F.logsigmoid(BETA * (margin[0] - margin[1])).mean()
            accelerator.backward(loss)
            opt_lora.step()
            opt_head.step()
            sched.step()
            opt_lora.zero_grad()
            opt_head.zero_grad()
        if accelerator.sync_gradients:
            done += 1
            accelerator.print(f"step {done} loss {loss.item():.4f}")
            if done == stop_step:
                break
    return done


def main():
    objs = build()
    done = run(*objs, start_step=0, stop_step=STOP_AFTER)
    accelerator = objs[0]
    if accelerator.is_main_process and os.path.isdir(CKPT):
        shutil.rmtree(CKPT)
    accelerator.wait_for_everyone()
    accelerator.save_state(CKPT)
    accelerator.wait_for_everyone()
    del objs, accelerator

    # fresh process state: rebuild everything and restore from disk
    objs = build()
    accelerator = objs[0]
    accelerator.load_state(CKPT)
    run(*objs, start_step=done, stop_step=STEPS)

    h = hashlib.sha256()
    for _, p in accelerator.unwrap_model(objs[1]).named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    if accelerator.is_main_process:
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
