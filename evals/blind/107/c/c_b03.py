"""Small GPT-2 (random init) LM training on a DeepSpeed ZeRO-2 engine, configured the HF way:
a DeepSpeed JSON with "auto" entries resolved from TrainingArguments through
HfTrainerDeepSpeedConfig (as the Trainer does), then driven by our own engine loop.

deepspeed --num_gpus 2 c_b03.py
"""
import hashlib
import math

import deepspeed
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

DS_CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_optimization": {"stage": 2, "overlap_comm": False, "reduce_bucket_size": "auto"},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10**9,
}


class RandomTokens(Dataset):
    def __init__(self, n, seq_len, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build_args():
    return TrainingArguments(
        output_dir="/tmp/c_b03_out",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_train_epochs=1,
        learning_rate=1e-3,
        warmup_steps=2,
        max_grad_norm=1.0,
        weight_decay=0.0,
        seed=21,
        use_cpu=True,
        report_to=[],
    )


def sha256_params(module):
    h = hashlib.sha256()
    for _, p in module.named_parameters():
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    args = build_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(args.seed)

    config = GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)

    dataset = RandomTokens(n=2 * 4 * 4 * 10, seq_len=16, vocab=config.vocab_size, seed=args.seed)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(dataset, batch_size=args.per_device_train_batch_size, sampler=sampler)

    num_training_steps = math.ceil(len(loader) * args.num_train_epochs)

    hf_ds = HfTrainerDeepSpeedConfig(DS_CONFIG)
    hf_ds.trainer_config_process(args)
    hf_ds.trainer_config_finalize(args, model, num_training_steps)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, config=hf_ds.config)

    engine.train()
    for epoch in range(int(args.num_train_epochs)):
        for batch in loader:
            out = engine(**batch)
            engine.backward(out.loss)
            engine.step()
        if rank == 0:
            print(f"epoch {epoch} steps {engine.global_steps} lr {scheduler.get_last_lr()[0]:.2e} "
                  f"loss {out.loss.item():.4f}", flush=True)

    digest = sha256_params(engine.module)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
