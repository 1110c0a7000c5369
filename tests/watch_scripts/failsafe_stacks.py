"""One small correct accumulation loop per stack, for the fail-safe tests.

``python failsafe_stacks.py STACK OUT`` (``torchrun --nproc-per-node 2 ...`` for ``ddp``,
``fsdp2``, ``deepspeed``, ``deepspeed0``) trains a few optimizer steps with K = 4 and writes, on rank 0,
the SHA-256 of every parameter's bytes (in name order) to OUT: a run under ``accumguard
watch`` with an injected internal fault must write the same digest as the unobserved run.
"""

import hashlib
import os
import sys

import torch
import torch.nn.functional as F  # noqa: N812

STACK, OUT = sys.argv[1], sys.argv[2]
K, STEPS = 4, 3


def batches(seed: int, n: int):  # noqa: ANN201
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g))
            for _ in range(n)]


def model_fn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def digest(named) -> None:  # noqa: ANN001
    rank = int(os.environ.get("RANK", "0"))
    h = hashlib.sha256()
    for name, p in sorted(named, key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(p.detach().to(torch.float64).cpu().numpy().tobytes())
    if rank == 0:
        with open(OUT, "w") as f:
            f.write(h.hexdigest())


def plain() -> None:
    model = model_fn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s))
    for i, (x, y) in enumerate(batches(1, K * STEPS)):
        (F.cross_entropy(model(x), y) / K).backward()
        if (i + 1) % K == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
    digest(model.named_parameters())


def ddp() -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(model_fn())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for i, (x, y) in enumerate(batches(10 + dist.get_rank(), K * STEPS)):
        last = (i + 1) % K == 0
        model.require_backward_grad_sync = last
        (F.cross_entropy(model(x), y) / K).backward()
        if last:
            opt.step()
            opt.zero_grad(set_to_none=True)
    digest(model.module.named_parameters())
    dist.barrier()
    dist.destroy_process_group()


def fsdp2() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    model = model_fn()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for i, (x, y) in enumerate(batches(20 + dist.get_rank(), K * STEPS)):
        last = (i + 1) % K == 0
        model.set_requires_gradient_sync(last)
        (F.cross_entropy(model(x), y) / K).backward()
        if last:
            opt.step()
            opt.zero_grad()
    full = [(n, p.full_tensor()) for n, p in model.named_parameters()]
    digest(full)
    dist.barrier()
    dist.destroy_process_group()


def deepspeed_run(stage: int = 2) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": 6, "gradient_accumulation_steps": K,
              "gradient_clipping": 0.0, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
    if stage == 0:
        # ZeRO-0 fp32 with the engine's default clip (1.0, not in the config): it clips in
        # DeepSpeedEngine.clip_fp32_gradients, where watch reads the norm
        del config["gradient_clipping"]
    model = model_fn()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    for x, y in batches(30 + torch.distributed.get_rank(), K * STEPS):
        engine.backward(F.cross_entropy(engine(x), y))
        engine.step()
    digest(engine.module.named_parameters())
    torch.distributed.barrier()


def accelerate_run() -> None:
    from accelerate import Accelerator

    acc = Accelerator(gradient_accumulation_steps=K, cpu=True)
    model = model_fn()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    for x, y in batches(40, K * STEPS):
        with acc.accumulate(model):
            acc.backward(F.cross_entropy(model(x), y))
            opt.step()
            opt.zero_grad()
    digest(acc.unwrap_model(model).named_parameters())


def hf_trainer() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50,
                                       n_positions=16))
    g = torch.Generator().manual_seed(50)
    data = [{"input_ids": ids, "labels": ids}
            for ids in torch.randint(0, 50, (2 * K * STEPS, 8), generator=g)]
    out = os.path.join(os.path.dirname(OUT), "hf-out")
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=2,
                             gradient_accumulation_steps=K, max_steps=STEPS, learning_rate=1e-2,
                             report_to=[], save_strategy="no", use_cpu=True, seed=0,
                             dataloader_num_workers=0, logging_strategy="no")
    Trainer(model=model, args=args, train_dataset=data).train()
    digest(model.named_parameters())


def lightning_run() -> None:
    import pytorch_lightning as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model_fn()

        def training_step(self, batch, i):  # noqa: ANN001, ANN201
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Module()
    data = batches(60, K * STEPS)
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    trainer = pl.Trainer(max_epochs=1, accumulate_grad_batches=K, accelerator="cpu",
                         devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader)
    digest(module.net.named_parameters())


{"plain": plain, "ddp": ddp, "fsdp2": fsdp2, "deepspeed": deepspeed_run,
 "deepspeed0": lambda: deepspeed_run(stage=0),
 "accelerate": accelerate_run, "hf": hf_trainer, "lightning": lightning_run}[STACK]()
