# corpus: style=hf class=OK
import copy

import torch


def reference_run(init_model, micro_batches, collate, args):
    """Single process, one optimizer step per window on the concatenated window."""
    model = copy.deepcopy(init_model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    K = args.grad_accum
    for step in range(args.max_steps):
        window = micro_batches[step * K:(step + 1) * K]
        feats = []
        for mb in window:
            for r in range(mb["input_ids"].size(0)):
                n = int(mb["attention_mask"][r].sum())
                feats.append({"input_ids": mb["input_ids"][r, :n]})
        big = collate(feats)
        loss = model(**big).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model
