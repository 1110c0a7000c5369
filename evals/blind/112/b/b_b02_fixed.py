"""Domain-adaptive LM training with the HF Trainer (2 ranks, K=4).

The token embedding is kept frozen for the first optimizer steps (the fresh
upper layers settle first); a callback implements this by clearing the
embedding's gradient during the warm-up updates.
"""
import hashlib
import os

import torch
from torch.utils.data import Dataset
from transformers import (AutoModelForCausalLM, GPT2Config, Trainer,
                          TrainerCallback, TrainingArguments, set_seed)

VOCAB, SEQ, N = 80, 20, 112
FREEZE_EMB_STEPS = 5


class Packed(Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(77)
        self.ids = torch.randint(0, VOCAB, (N, SEQ), generator=g)

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class EmbeddingWarmupFreeze(TrainerCallback):
    """Keep wte fixed for the first `steps` optimizer updates."""

    def __init__(self, steps):
        self.steps = steps

    def _clear(self, state, model):
        if state.global_step < self.steps:
            emb = model.get_input_embeddings().weight
            if emb.grad is not None:
                emb.grad.zero_()

    # called once per window, after the last backward and right before optimizer.step()
    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        self._clear(state, model)


def digest(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    set_seed(0)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False)
    model = AutoModelForCausalLM.from_config(cfg)
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch", "b02"),
        per_device_train_batch_size=2, gradient_accumulation_steps=4, learning_rate=2e-3,
        num_train_epochs=2, lr_scheduler_type="cosine", warmup_steps=2, weight_decay=0.0,
        max_grad_norm=0.0, use_cpu=True, ddp_backend="gloo", report_to="none", save_strategy="no",
        logging_steps=100, seed=0, data_seed=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Packed(),
                      callbacks=[EmbeddingWarmupFreeze(FREEZE_EMB_STEPS)])
    trainer.train()
    if trainer.args.process_index == 0:
        print("optimizer steps:", trainer.state.global_step)
        print("FINAL_SHA256", digest(trainer.model))


if __name__ == "__main__":
    main()
