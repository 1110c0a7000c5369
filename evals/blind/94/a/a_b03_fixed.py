"""SFT of a LoRA adapter on a tiny Llama with the HF Trainer.

Hyper-parameters come from a YAML-style dict (as they would from a recipe file) and are
turned into TrainingArguments with HfArgumentParser, tolerating recipe-only keys.
"""
import hashlib
import os

import torch
from peft import LoraConfig, get_peft_model
from transformers import (HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer,
                          TrainingArguments, set_seed)

RECIPE = {
    # --- trainer ---
    "output_dir": "tmp_scratch/a_b03_out",
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "learning_rate": 3e-3,
    "num_train_epochs": 2,
    "lr_scheduler_type": "linear",
    "warmup_steps": 1,
    "max_grad_norm": 0.0,
    "weight_decay": 0.0,
    "seed": 1234,
    "data_seed": 1234,
    "logging_steps": 1,
    "save_strategy": "no",
    "report_to": [],
    "use_cpu": True,
    "ddp_backend": "gloo",
    "dataloader_num_workers": 0,
    "disable_tqdm": True,
    # --- recipe-only keys ---
    "lora_r": 4,
    "lora_alpha": 8,
    "n_examples": 48,
    "seq_len": 12,
}


class PromptCompletionData(torch.utils.data.Dataset):
    def __init__(self, n, seq_len, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (n, seq_len), generator=g)
        self.prompt_len = torch.randint(2, seq_len - 2, (n,), generator=g)
        self.pad_from = torch.randint(seq_len - 3, seq_len + 1, (n,), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i].clone()
        att = torch.ones_like(ids)
        att[self.pad_from[i]:] = 0
        ids[self.pad_from[i]:] = 0
        labels = ids.clone()
        labels[: self.prompt_len[i]] = -100
        labels[att == 0] = -100
        return {"input_ids": ids, "attention_mask": att, "labels": labels}


def main():
    (args,) = HfArgumentParser(TrainingArguments).parse_dict(RECIPE, allow_extra_keys=True)
    set_seed(args.seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    base = LlamaForCausalLM(cfg)
    lora = LoraConfig(r=RECIPE["lora_r"], lora_alpha=RECIPE["lora_alpha"], lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    data = PromptCompletionData(RECIPE["n_examples"], RECIPE["seq_len"], cfg.vocab_size, 7)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in trainer.model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print("FINAL_SHA256", h.hexdigest(), flush=True)
        torch.save({n: p.detach().float().clone() for n, p in trainer.model.named_parameters()},
                   os.path.join("tmp_scratch", os.path.basename(__file__) + ".params.pt"))


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
