"""LoRA SFT of a tiny Llama with the HF Trainer, driven by a YAML recipe.

The recipe mixes model/LoRA keys and Trainer keys; HfArgumentParser splits it into the dataclasses.
"""
import hashlib
import os
from dataclasses import dataclass, field

import numpy as np
import torch
import yaml
from peft import LoraConfig, get_peft_model
from torch.utils.data import Dataset
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

HERE = os.path.dirname(os.path.abspath(__file__))

RECIPE = """
# model
hidden_size: 32
num_layers: 2
vocab_size: 80
lora_r: 8
lora_alpha: 16
lora_targets: [q_proj, k_proj, v_proj, o_proj]
# data
n_examples: 32
seq_len: 16
# trainer
output_dir: {out}
seed: 11
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
num_train_epochs: 3
learning_rate: 0.004
lr_scheduler_type: linear
warmup_steps: 1
weight_decay: 0.0
max_grad_norm: 0.0
use_cpu: true
ddp_backend: gloo
save_strategy: "no"
logging_steps: 1
report_to: []
disable_tqdm: true
"""


@dataclass
class ModelArgs:
    hidden_size: int = 32
    num_layers: int = 2
    vocab_size: int = 80
    lora_r: int = 8
    lora_alpha: int = 16
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])


@dataclass
class DataArgs:
    n_examples: int = 32
    seq_len: int = 16


class PromptCompletionSet(Dataset):
    """Prompt tokens are masked out of the labels; completion lengths vary."""

    def __init__(self, n, seq_len, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            p_len = int(torch.randint(3, 7, (1,), generator=g))
            c_len = int(torch.randint(2, seq_len - p_len + 1, (1,), generator=g))
            prompt = torch.randint(2, vocab, (p_len,), generator=g)
            completion = (prompt[:1].repeat(c_len) + torch.arange(c_len)) % (vocab - 2) + 2
            ids = torch.full((seq_len,), 0, dtype=torch.long)
            labels = torch.full((seq_len,), -100, dtype=torch.long)
            mask = torch.zeros(seq_len, dtype=torch.long)
            ids[: p_len + c_len] = torch.cat([prompt, completion])
            labels[p_len: p_len + c_len] = completion
            mask[: p_len + c_len] = 1
            self.items.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def params_sha(model):
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for _, p in model.named_parameters()])
    return hashlib.sha256(flat.numpy().astype(np.float32).tobytes()).hexdigest()


def main():
    recipe = yaml.safe_load(RECIPE.format(out=os.path.join(HERE, "tmp_scratch", "b_b03_out")))
    parser = HfArgumentParser((ModelArgs, DataArgs, TrainingArguments))
    margs, dargs, targs = parser.parse_dict(recipe, allow_extra_keys=True)

    world = int(os.environ.get("WORLD_SIZE", 1))
    if targs.process_index == 0:
        eff = recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"] * world
        print(f"effective batch size: {eff}", flush=True)

    set_seed(targs.seed)
    base = LlamaForCausalLM(LlamaConfig(
        vocab_size=margs.vocab_size, hidden_size=margs.hidden_size, intermediate_size=2 * margs.hidden_size,
        num_hidden_layers=margs.num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, pad_token_id=0,
    ))
    model = get_peft_model(base, LoraConfig(r=margs.lora_r, lora_alpha=margs.lora_alpha, lora_dropout=0.0,
                                            target_modules=margs.lora_targets, task_type="CAUSAL_LM"))

    train_ds = PromptCompletionSet(dargs.n_examples, dargs.seq_len, margs.vocab_size, seed=targs.seed)
    trainer = Trainer(model=model, args=targs, train_dataset=train_ds)
    trainer.train()

    if trainer.is_world_process_zero():
        print(f"optimizer steps: {trainer.state.global_step}", flush=True)
        print(f"FINAL_SHA256 {params_sha(trainer.model)}", flush=True)


if __name__ == "__main__":
    main()
