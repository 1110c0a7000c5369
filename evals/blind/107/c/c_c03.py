"""ZeRO-3 continued pre-training of a small GPT-2 whose vocabulary was grown by 8 new tokens
(resize_token_embeddings before the engine partitions it), tied input/output embeddings, and a
frozen learned position table. Parameters are gathered from their shards for the final hash.

deepspeed --num_gpus 2 c_c03.py
"""
import hashlib

import deepspeed
import torch
from transformers import GPT2Config, GPT2LMHeadModel

SEED = 3
BASE_VOCAB, ADDED_TOKENS = 80, 8
MICRO_BATCH, GRAD_ACCUM, OPT_STEPS, SEQ = 4, 2, 8, 16


def build_model():
    torch.manual_seed(SEED)
    cfg = GPT2Config(vocab_size=BASE_VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)
    model = GPT2LMHeadModel(cfg)
    model.resize_token_embeddings(BASE_VOCAB + ADDED_TOKENS)
    model.transformer.wpe.weight.requires_grad_(False)
    return model


def batch_for(rank, micro_index):
    g = torch.Generator().manual_seed(SEED * 100003 + rank * 7717 + micro_index)
    ids = torch.randint(0, BASE_VOCAB + ADDED_TOKENS, (MICRO_BATCH, SEQ), generator=g)
    return ids


def sha256_params(module):
    h = hashlib.sha256()
    params = list(module.parameters())
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        for _, p in module.named_parameters():
            h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    model = build_model()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-3, weight_decay=0.01)
    ds_config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": GRAD_ACCUM,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 3, "overlap_comm": False,
                              "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)

    engine.train()
    for micro in range(OPT_STEPS * GRAD_ACCUM):
        ids = batch_for(rank, micro)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    if rank == 0:
        print(f"optimizer steps {engine.global_steps} last loss {loss.item():.4f}", flush=True)

    digest = sha256_params(engine.module)
    if rank == 0:
        print(f"FINAL_SHA256 {digest}", flush=True)
    torch.distributed.barrier()


if __name__ == "__main__":
    main()
