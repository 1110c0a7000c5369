# LoRA SFT of a small causal LM with the stock HF Trainer.
# The base is kept in bf16 to halve its memory; only the adapter trains.
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--per-device-batch", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--base-dtype", default="bfloat16")
    return p.parse_args()


class PromptAnswerSet(Dataset):
    """Synthetic prompt/answer pairs; the prompt part is masked out of the loss."""

    def __init__(self, n, seq_len=24, vocab=160, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (n, seq_len), generator=g)
        self.prompt_len = torch.randint(4, 14, (n,), generator=g)

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[: int(self.prompt_len[i])] = -100
        return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def build_model(args):
    cfg = LlamaConfig(
        vocab_size=160, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(args.seed)
    base = LlamaForCausalLM(cfg).to(getattr(torch, args.base_dtype))
    lora = LoraConfig(r=args.lora_r, lora_alpha=16, lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj", "up_proj", "down_proj"], task_type="CAUSAL_LM")
    # adapter weights follow the base dtype, so the whole model stays bf16
    return get_peft_model(base, lora, autocast_adapter_dtype=False)


def params_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = parse_args()
    set_seed(args.seed)
    model = build_model(args)
    n = args.per_device_batch * args.grad_accum * 2 * args.max_steps
    train = PromptAnswerSet(n, seed=args.seed)
    targs = TrainingArguments(
        output_dir=os.path.join(HERE, "tmp_scratch", "a_b02_out"),
        per_device_train_batch_size=args.per_device_batch,
        gradient_accumulation_steps=args.grad_accum,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.0,
        max_grad_norm=0.0,
        optim="adamw_torch",
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        ddp_backend="gloo",
        report_to="none",
        save_strategy="no",
        logging_steps=5,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=train)
    trainer.train()
    final = params_sha(trainer.model)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"FINAL_SHA256 {final}", flush=True)
    if dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    main()
