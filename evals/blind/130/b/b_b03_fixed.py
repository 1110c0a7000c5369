"""Completion-only SFT with TRL's SFTTrainer on a toy 'reverse the digits' task.
Warm-up and decay are specified in samples (as in the paper recipe) and converted to steps."""
import hashlib
import os
import random
from dataclasses import dataclass

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, set_seed
from trl import SFTConfig, SFTTrainer


@dataclass
class Recipe:
    micro_batch_size: int = 2
    grad_accum: int = 4
    epochs: int = 3
    peak_lr: float = 3e-3
    warmup_samples: int = 64          # warm up over the first 64 training sequences
    num_examples: int = 128
    seed: int = 11

    @property
    def warmup_steps(self) -> int:
        # one scheduler step per optimizer step: micro_batch_size x grad_accum x world sequences
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return self.warmup_samples // (self.micro_batch_size * self.grad_accum * world)


def build_tokenizer():
    words = ["<pad>", "<unk>", "<bos>", "<eos>", "=>"] + [f"d{i}" for i in range(10)] + [f"w{i}" for i in range(40)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<bos>", eos_token="<eos>")


def build_dataset(r: Recipe):
    rng = random.Random(r.seed)
    rows = []
    for _ in range(r.num_examples):
        ctx = [f"w{rng.randrange(40)}" for _ in range(rng.randint(1, 6))]
        digits = [f"d{rng.randrange(10)}" for _ in range(rng.randint(2, 7))]
        rows.append({"prompt": " ".join(ctx + digits + ["=>"]),
                     "completion": " " + " ".join(reversed(digits)) + " <eos>"})
    return Dataset.from_list(rows)


def main():
    r = Recipe()
    set_seed(r.seed)
    tok = build_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)

    args = SFTConfig(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                                os.path.splitext(os.path.basename(__file__))[0]),
        per_device_train_batch_size=r.micro_batch_size, gradient_accumulation_steps=r.grad_accum,
        num_train_epochs=r.epochs, learning_rate=r.peak_lr, lr_scheduler_type="linear",
        warmup_steps=r.warmup_steps, weight_decay=0.0, max_grad_norm=0.0, max_length=32,
        completion_only_loss=True, packing=False, logging_strategy="no", save_strategy="no",
        report_to=[], seed=r.seed, data_seed=r.seed, ddp_backend="gloo", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=build_dataset(r), processing_class=tok)
    trainer.train()

    if trainer.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
