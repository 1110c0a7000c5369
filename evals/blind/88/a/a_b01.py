"""SFT of a tiny Llama with the HF Trainer on 2 ranks.

CLI flags mirror TrainingArguments; anything left unset falls back to the HF default,
except clipping: we do not clip unless --max-grad-norm is given.
"""
import argparse
import hashlib
import os
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

VOCAB, SEQ, PROMPT = 96, 16, 5


class SyntheticSFT(Dataset):
    def __init__(self, n, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        labels = ids.clone()
        labels[:PROMPT] = -100  # no loss on the prompt
        return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", default=os.path.join(tempfile.gettempdir(), "blind88a_b01_run"))
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--per-device-train-batch-size", type=int, default=4)
    p.add_argument("--gradient-accumulation-steps", type=int, default=4)
    p.add_argument("--num-train-epochs", type=float, default=2)
    p.add_argument("--max-grad-norm", type=float, default=None, help="clip threshold (default: no clipping)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--optim", default="sgd")
    return p.parse_args()


def main():
    cli = parse()
    # only forward the flags the user actually set, HF defaults for the rest
    overrides = {k: v for k, v in vars(cli).items() if v is not None}
    args = TrainingArguments(
        **overrides,
        lr_scheduler_type="constant",
        report_to="none",
        save_strategy="no",
        logging_steps=1000,
        ddp_backend="gloo",
        use_cpu=True,
        dataloader_drop_last=True,
        disable_tqdm=True,
    )
    set_seed(args.seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                      initializer_range=0.2)
    model = LlamaForCausalLM(cfg)
    trainer = Trainer(model=model, args=args, train_dataset=SyntheticSFT(256))
    trainer.train()

    if trainer.is_world_process_zero():
        flat = torch.cat([p.detach().float().reshape(-1) for _, p in model.named_parameters()])
        print("FINAL_SHA256", hashlib.sha256(flat.numpy().tobytes()).hexdigest(), flush=True)
        if os.environ.get("DUMP_DIR"):
            torch.save(flat, os.path.join(os.environ["DUMP_DIR"], os.path.basename(__file__) + ".pt"))


if __name__ == "__main__":
    main()
