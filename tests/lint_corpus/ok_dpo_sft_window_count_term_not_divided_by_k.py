# corpus: style=rl class=OK
"""DPO with an SFT term on the chosen responses; the SFT term is normalised over the
window's chosen tokens, the DPO mean of each micro-batch divided by K."""
import torch.nn.functional as F


def train(policy, ref_logps, windows, opt, beta=0.1, alpha=0.5, accum=4):
    for micro in windows:
        n_chosen = sum(mask.sum() for _, _, mask in micro)
        for chosen, rejected, mask in micro:
            lp_c = policy.logps(chosen) * mask
            lp_r = policy.logps(rejected)
            dpo = -F.logsigmoid(beta * (lp_c.sum(-1) - lp_r.sum(-1) - ref_logps)).mean()
            sft = -lp_c.sum() / n_chosen
            loss = dpo / accum + alpha * sft
            loss.backward()
        opt.step()
        opt.zero_grad()
