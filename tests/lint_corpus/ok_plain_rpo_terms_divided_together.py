# corpus: style=plain class=OK
import torch
import torch.nn.functional as F

GRAD_ACCUM = 4
RPO_ALPHA = 1.0


def rpo_terms(policy_logps, ref_logps, counts, n):
    margin = 0.1 * ((policy_logps[:n] - ref_logps[:n]) - (policy_logps[n:] - ref_logps[n:]))
    dpo = -F.logsigmoid(margin).mean()
    nll = -(policy_logps[:n] / counts[:n]).mean()
    return dpo, nll


def train(model, ref_model, batches, opt):
    for step, (ids, counts, n) in enumerate(batches):
        pol = model(ids)
        with torch.no_grad():
            ref = ref_model(ids)
        dpo, nll = rpo_terms(pol, ref, counts, n)
        loss = (dpo + RPO_ALPHA * nll) / GRAD_ACCUM
        loss.backward()
        if (step + 1) % GRAD_ACCUM == 0:
            opt.step()
            opt.zero_grad()
