"""LoRA SFT with Accelerate, preemption-safe: periodic checkpoints, resume into fresh objects.

The run is "preempted" right after its first checkpoint (we simulate it in-process), and a
brand new runner (new Accelerator, new model, new optimizer) resumes from the checkpoint,
skipping the micro-batches already consumed.
"""
import argparse
import hashlib
import os

import torch
from torch.utils.data import DataLoader, TensorDataset
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = os.path.splitext(os.path.basename(__file__))[0]


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--vocab", type=int, default=72)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--n-examples", type=int, default=96)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--save-every", type=int, default=8, help="checkpoint every N batches (a whole number of windows)")
    p.add_argument("--ckpt-dir", default=os.path.join(HERE, "tmp_scratch", NAME))
    return p.parse_args()


def make_dataset(args):
    g = torch.Generator().manual_seed(args.seed + 3)
    ids = torch.randint(2, args.vocab, (args.n_examples, args.seq_len), generator=g)
    return TensorDataset(ids)


class LoraRunner:
    def __init__(self, args):
        self.args = args
        self.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum)
        assert self.accelerator.num_processes == 2, self.accelerator.num_processes
        torch.manual_seed(args.seed)
        base = LlamaForCausalLM(LlamaConfig(
            vocab_size=args.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))
        torch.manual_seed(args.seed + 1)
        lcfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                          init_lora_weights="gaussian")
        model = get_peft_model(base, lcfg)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
        loader = DataLoader(make_dataset(args), batch_size=args.micro_batch, shuffle=False)
        self.model, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)
        self.batches_done = 0

    # ---- checkpointing ---------------------------------------------------------------
    def save(self):
        acc = self.accelerator
        if acc.is_main_process:
            os.makedirs(self.args.ckpt_dir, exist_ok=True)
            torch.save({"adapter": get_peft_model_state_dict(acc.unwrap_model(self.model)),
                        "optim": self.opt.state_dict(),
                        "batches_done": self.batches_done},
                       os.path.join(self.args.ckpt_dir, "ckpt.pt"))
        acc.wait_for_everyone()

    def load(self):
        state = torch.load(os.path.join(self.args.ckpt_dir, "ckpt.pt"), weights_only=False)
        set_peft_model_state_dict(self.accelerator.unwrap_model(self.model), state["adapter"])
        self.opt.load_state_dict(state["optim"])
        self.batches_done = state["batches_done"]

    # ---- training --------------------------------------------------------------------
    def train_batch(self, batch):
        (ids,) = batch
        with self.accelerator.accumulate(self.model):
            loss = self.model(input_ids=ids, labels=ids).loss
            self.accelerator.backward(loss)
            if self.accelerator.sync_gradients:
                self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
            self.opt.step()
            self.opt.zero_grad()

    def fit(self, preempt_after_checkpoint=False):
        per_epoch = len(self.loader)
        start_epoch, skip = divmod(self.batches_done, per_epoch)
        for epoch in range(start_epoch, self.args.epochs):
            loader = self.loader
            if epoch == start_epoch and skip:
                loader = self.accelerator.skip_first_batches(self.loader, skip)
            for batch in loader:
                self.train_batch(batch)
                self.batches_done += 1
                if self.batches_done % self.args.save_every == 0:
                    self.save()
                    if preempt_after_checkpoint:
                        return False
        return True


def main():
    args = get_args()
    torch.use_deterministic_algorithms(True)
    first = LoraRunner(args)
    first.fit(preempt_after_checkpoint=True)      # the job is killed after its first checkpoint
    del first
    second = LoraRunner(args)                     # ... and restarted from it
    second.load()
    second.fit()
    acc = second.accelerator
    if acc.is_main_process:
        model = acc.unwrap_model(second.model)
        h = hashlib.sha256()
        for _, p in model.named_parameters():
            h.update(p.detach().float().contiguous().numpy().tobytes())
        torch.save({n: p.detach().float().clone() for n, p in model.named_parameters()},
                   os.path.join(args.ckpt_dir, "final_params.pt"))
        print(f"batches_done={second.batches_done}", flush=True)
        print(f"FINAL_SHA256 {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
