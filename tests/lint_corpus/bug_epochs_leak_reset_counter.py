# corpus: style=epochs class=F7
import torch

opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
epoch = 0
while epoch < cfg.epochs:
    micro_step = 0
    for batch in train_dl:
        loss = model(**batch).loss / cfg.grad_accum
        loss.backward()
        micro_step += 1
        if micro_step % cfg.grad_accum == 0:  # expect: AG117
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
    evaluate(model, val_dl)
    epoch += 1
