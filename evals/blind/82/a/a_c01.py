"""DPO on a LoRA adapter with TRL's DPOTrainer, 2 CPU ranks under torchrun.

No reference model is passed: with a PEFT adapter the trainer scores the reference by
switching the adapter off. Each rank sees 5 micro-batches of 2 pairs per epoch, so with
gradient_accumulation_steps=2 every epoch ends on a one-micro-batch window; the Trainer
divides that window's loss by its real length.
"""
import hashlib
import os
import random
import tempfile

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, set_seed
from trl import DPOConfig, DPOTrainer

SEED = 7
WORDS = ("red green blue cat dog bird one two three up down left right yes no "
         "good bad fast slow big small hot cold the a is are what which color animal").split()


def build_tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for w in WORDS + ["?", ":"]:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def preference_pairs(n):
    rng = random.Random(SEED)
    colors, animals = ["red", "green", "blue"], ["cat", "dog", "bird"]
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for _ in range(n):
        if rng.random() < 0.5:
            c = rng.choice(colors)
            rows["prompt"].append(f"what color is the {c} {rng.choice(animals)} ?")
            rows["chosen"].append(f" {c} is good")
            rows["rejected"].append(f" {rng.choice([x for x in colors if x != c])} is bad yes no")
        else:
            a = rng.choice(animals)
            rows["prompt"].append(f"which animal is big : the {a} ?")
            rows["chosen"].append(f" the {a} is big")
            rows["rejected"].append(f" {rng.choice(WORDS)} {rng.choice(WORDS)}")
    return Dataset.from_dict(rows)


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(SEED)
    tokenizer = build_tokenizer()
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    ))

    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_device_bs, grad_accum, micro_per_rank = 2, 2, 5
    train_ds = preference_pairs(world * micro_per_rank * per_device_bs)

    args = DPOConfig(
        output_dir=tempfile.mkdtemp(prefix="a_c01_"),
        per_device_train_batch_size=per_device_bs,
        gradient_accumulation_steps=grad_accum,
        num_train_epochs=3,
        learning_rate=5e-3,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=1.0,
        beta=0.1,
        max_length=32,
        logging_steps=3,
        save_strategy="no",
        report_to=[],
        seed=SEED,
        data_seed=SEED,
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        bf16=False,
    )
    peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                             target_modules=["q_proj", "v_proj", "up_proj", "down_proj"],
                             task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=model, args=args, train_dataset=train_ds,
                         processing_class=tokenizer, peft_config=peft_config)
    trainer.train()

    final = trainer.accelerator.unwrap_model(trainer.model)
    if trainer.is_world_process_zero():
        print(f"optimizer steps {trainer.state.global_step}", flush=True)
        print(f"FINAL_SHA256 {param_sha(final)}", flush=True)


if __name__ == "__main__":
    main()
