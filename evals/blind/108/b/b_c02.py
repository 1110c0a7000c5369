"""Tiny Llama SFT with an HF Trainer subclass (own two-group AdamW, frozen input
embedding), interrupted by a callback right after checkpoint-6 and resumed by a
fresh model + fresh Trainer from that checkpoint (mid-epoch: 4 steps per epoch).

Run: torchrun --nproc-per-node 2 ... b_c02.py
"""
import hashlib
import os
import shutil

import torch
import torch.distributed as dist
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "tmp_scratch", os.path.basename(__file__)[:-3] + "_out")
K, BS, N, SEQ, MAX_STEPS, STOP_AT = 4, 2, 64, 20, 10, 6


class StopAfter(TrainerCallback):
    """Simulated pre-emption: stop at an optimizer-step boundary once `at` is saved."""

    def __init__(self, at):
        self.at = at

    def on_save(self, args, state, control, **kwargs):
        if state.global_step >= self.at:
            control.should_training_stop = True


class TwoGroupTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            m = self.model
            head = [p for n, p in m.named_parameters() if p.requires_grad and n.startswith("lm_head")]
            body = [p for n, p in m.named_parameters() if p.requires_grad and not n.startswith("lm_head")]
            self.optimizer = torch.optim.AdamW(
                [
                    {"params": body, "lr": self.args.learning_rate, "weight_decay": 0.05},
                    {"params": head, "lr": self.args.learning_rate * 0.3, "weight_decay": 0.0},
                ],
                betas=(0.9, 0.98),
            )
        return self.optimizer


class Data(torch.utils.data.Dataset):
    def __init__(self, n, vocab, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (n, SEQ), generator=g)
        self.labels = self.ids.clone()
        plen = torch.randint(2, SEQ - 5, (n,), generator=g)
        for i in range(n):
            self.labels[i, : plen[i]] = -100

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def build_model():
    set_seed(5)
    cfg = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    model.model.embed_tokens.weight.requires_grad_(False)
    return model


def make_args():
    return TrainingArguments(
        output_dir=OUT,
        per_device_train_batch_size=BS,
        gradient_accumulation_steps=K,
        max_steps=MAX_STEPS,
        learning_rate=3e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        max_grad_norm=0.5,
        logging_strategy="no",
        save_strategy="steps",
        save_steps=STOP_AT,
        save_only_model=False,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
        seed=5,
        data_seed=5,
    )


def param_sha(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    torch.use_deterministic_algorithms(True)
    args = make_args()
    if args.process_index == 0 and os.path.isdir(OUT):
        shutil.rmtree(OUT)
    if dist.is_initialized():
        dist.barrier()
    ds = Data(N, 96)

    # first leg: runs until checkpoint-6 is written, then stops
    t1 = TwoGroupTrainer(model=build_model(), args=args, train_dataset=ds, callbacks=[StopAfter(STOP_AT)])
    t1.train()
    ckpt = os.path.join(OUT, f"checkpoint-{STOP_AT}")
    del t1

    # second leg: everything rebuilt, resumed from the checkpoint
    model = build_model()
    t2 = TwoGroupTrainer(model=model, args=make_args(), train_dataset=ds)
    t2.train(resume_from_checkpoint=ckpt)
    assert t2.state.global_step == MAX_STEPS
    if t2.args.process_index == 0:
        print(f"FINAL_SHA256 {param_sha(model)}", flush=True)


if __name__ == "__main__":
    main()
