# corpus: style=rl class=F5
import torch


def update(model, opt, windows, vf_coef=0.5):
    for window in windows:
        n_tok = sum(mb["mask"].sum() for mb in window)
        for mb in window:
            logp, values = model(mb["obs"])
            m = mb["mask"]
            pg_loss = (-logp * mb["adv"] * m).sum() / n_tok
            vf_loss = ((values - mb["ret"]) ** 2 * m).sum() / m.sum() / len(window)  # expect: AG104
            (pg_loss + vf_coef * vf_loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
