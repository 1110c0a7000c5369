"""Two-stage LoRA recipe with Accelerate + PEFT.

Stage 1 trains a general "warmup" adapter; stage 2 stacks a fresh "task"
adapter on the same base and trains only that one.
"""
import hashlib
from dataclasses import dataclass

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.utils import set_seed
from peft import LoraConfig, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import LlamaConfig, LlamaForCausalLM


@dataclass
class RunConfig:
    seed: int = 0
    vocab: int = 96
    seq_len: int = 12
    n_rows: int = 32
    micro_batch: int = 2
    grad_accum: int = 2
    lr_warmup_adapter: float = 5e-3
    lr_task_adapter: float = 1e-2
    lora_r: int = 4


def lora_cfg(r, targets):
    return LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=targets, init_lora_weights="gaussian")


def make_loader(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, cfg.vocab, (cfg.n_rows, cfg.seq_len), generator=g)
    return DataLoader(TensorDataset(ids), batch_size=cfg.micro_batch, shuffle=False)


def params_sha256(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().to(torch.float32).cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class TwoStageLoRA:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.accelerator = Accelerator(
            cpu=True,
            gradient_accumulation_steps=cfg.grad_accum,
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],
        )
        assert self.accelerator.num_processes == 2
        set_seed(cfg.seed)
        base = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=cfg.vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            )
        )
        peft_model = get_peft_model(base, lora_cfg(cfg.lora_r, ["q_proj", "v_proj"]), adapter_name="warmup")
        opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=cfg.lr_warmup_adapter)
        self.model, self.optimizer = self.accelerator.prepare(peft_model, opt)

    def add_task_adapter(self):
        peft_model = self.accelerator.unwrap_model(self.model)
        peft_model.add_adapter("task", lora_cfg(self.cfg.lora_r, ["q_proj", "v_proj", "o_proj"]))
        peft_model.set_adapter("task")
        opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=self.cfg.lr_task_adapter)
        self.optimizer = self.accelerator.prepare(opt)

    def run_stage(self, data_seed):
        loader = self.accelerator.prepare(make_loader(self.cfg, data_seed))
        self.model.train()
        for (ids,) in loader:
            with self.accelerator.accumulate(self.model):
                loss = self.model(input_ids=ids, labels=ids).loss
                self.accelerator.backward(loss)
                self.optimizer.step()
                self.optimizer.zero_grad()


def main():
    cfg = RunConfig()
    runner = TwoStageLoRA(cfg)
    runner.run_stage(data_seed=11)
    runner.add_task_adapter()
    runner.run_stage(data_seed=12)
    runner.accelerator.wait_for_everyone()
    if runner.accelerator.is_main_process:
        print("FINAL_SHA256", params_sha256(runner.accelerator.unwrap_model(runner.model)), flush=True)


if __name__ == "__main__":
    main()
