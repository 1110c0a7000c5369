"""LoRA+ style SFT (B matrices at a higher LR) with a Trainer subclass; the job is preempted
after step 4 and resumed from the checkpoint by a brand-new Trainer."""
import hashlib
import os

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import (LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments, set_seed)
from peft import LoraConfig, get_peft_model

SEQ, VOCAB = 20, 80
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tmp_scratch",
                   os.path.splitext(os.path.basename(__file__))[0])
LORA_PLUS_RATIO = 4.0


class MaskedSFT(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            ids = torch.randint(4, VOCAB, (SEQ,), generator=g)
            plen = int(torch.randint(2, 15, (1,), generator=g))
            lab = ids.clone()
            lab[:plen] = -100
            self.items.append(dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=lab))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class LoraPlusTrainer(Trainer):
    def create_optimizer(self, model=None):
        if self.optimizer is None:
            a_params, b_params = [], []
            for n, p in self.model.named_parameters():
                if p.requires_grad:
                    (b_params if "lora_B" in n else a_params).append(p)
            lr = self.args.learning_rate
            self.optimizer = torch.optim.AdamW(
                [{"params": a_params, "lr": lr}, {"params": b_params, "lr": lr * LORA_PLUS_RATIO}],
                betas=(0.9, 0.99), weight_decay=0.01)
        return self.optimizer


class Preempt(TrainerCallback):
    def __init__(self, at):
        self.at = at

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.at:
            control.should_save = True
            control.should_training_stop = True
        return control


def fresh_model(seed):
    set_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    base = LlamaForCausalLM(cfg)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights="gaussian",
                                           target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"]))


def make_args(save):
    # 32 rows, 2 ranks x 2 rows -> 8 micro-batches per rank per epoch -> windows of 3, 3, 2
    return TrainingArguments(
        output_dir=OUT, per_device_train_batch_size=2, gradient_accumulation_steps=3,
        num_train_epochs=3, learning_rate=2e-3, lr_scheduler_type="cosine", warmup_steps=2,
        max_grad_norm=0.3, logging_strategy="no", save_strategy="steps" if save else "no",
        save_steps=1000, report_to=[], seed=5, data_seed=5, ddp_backend="gloo", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0)


def main():
    data = MaskedSFT(32, seed=3)

    # first attempt: preempted after optimizer step 4 (the first window of epoch 2)
    model = fresh_model(5)
    t1 = LoraPlusTrainer(model=model, args=make_args(save=True), train_dataset=data, callbacks=[Preempt(4)])
    t1.train()
    dist.barrier()
    ckpt = os.path.join(OUT, "checkpoint-4")

    # second attempt: new model object (same pretrained base, adapters from the checkpoint), new Trainer
    model = fresh_model(5)
    t2 = LoraPlusTrainer(model=model, args=make_args(save=False), train_dataset=data)
    t2.train(resume_from_checkpoint=ckpt)

    if t2.is_world_process_zero():
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
