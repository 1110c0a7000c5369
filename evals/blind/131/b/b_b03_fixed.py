"""Supervised fine-tuning with TRL's SFTTrainer, driven by a small recipe dataclass.

The recipe turns gradient clipping on or off; this run is a no-clip ablation.
"""
import hashlib
from dataclasses import dataclass

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, set_seed
from trl import SFTConfig, SFTTrainer


@dataclass
class Recipe:
    seed: int = 2024
    vocab: int = 72
    seq_len: int = 20
    n_train: int = 120
    micro_batch: int = 3
    grad_accum: int = 4
    epochs: int = 2
    lr: float = 2e-3
    scheduler: str = "linear"
    warmup_steps: int = 1
    clip_grad: bool = False      # ablation: no gradient clipping
    max_norm: float = 1.0
    out: str = "tmp_scratch/b03_out"


def build_tokenizer(vocab):
    words = {"<pad>": 0, "<s>": 1, "</s>": 2}
    words.update({f"w{i}": i for i in range(3, vocab)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def build_dataset(r: Recipe):
    g = torch.Generator().manual_seed(r.seed)
    rows = []
    for _ in range(r.n_train):
        start = int(torch.randint(3, r.vocab, (1,), generator=g))
        step = int(torch.randint(1, 5, (1,), generator=g))
        ids = [1] + [3 + (start + step * j - 3) % (r.vocab - 3) for j in range(r.seq_len - 2)] + [2]
        rows.append({"input_ids": ids})
    return Dataset.from_list(rows)


def make_args(r: Recipe) -> SFTConfig:
    clip = {"max_grad_norm": r.max_norm if r.clip_grad else 0.0}
    return SFTConfig(
        output_dir=r.out,
        per_device_train_batch_size=r.micro_batch,
        gradient_accumulation_steps=r.grad_accum,
        num_train_epochs=r.epochs,
        learning_rate=r.lr,
        lr_scheduler_type=r.scheduler,
        warmup_steps=r.warmup_steps,
        weight_decay=0.0,
        seed=r.seed,
        data_seed=r.seed,
        max_length=r.seq_len,
        packing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        **clip,
    )


def final_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    r = Recipe()
    set_seed(r.seed)
    tok = build_tokenizer(r.vocab)
    cfg = LlamaConfig(vocab_size=r.vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.1,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    trainer = SFTTrainer(model=model, args=make_args(r), train_dataset=build_dataset(r), processing_class=tok)
    trainer.train()
    if trainer.is_world_process_zero():
        norms = [round(h["grad_norm"], 3) for h in trainer.state.log_history if "grad_norm" in h]
        print("grad norms:", norms)
        print("FINAL_SHA256", final_sha(trainer.model), flush=True)


if __name__ == "__main__":
    main()
