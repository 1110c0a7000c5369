# corpus: style=plain class=OK
# the backbone accumulates 4 micro-batches per step; a linear probe on detached features has
# its own optimizer and steps (and clears) on every micro-batch: a second optimizer at its
# own rate, not a step inside the backbone's window
import torch
import torch.nn.functional as F

accum_steps = 4
backbone_opt = torch.optim.AdamW(backbone.parameters(), lr=1e-4)
probe_opt = torch.optim.SGD(probe.parameters(), lr=0.1)

for i, (x, y) in enumerate(loader):
    feats = backbone(x)
    (F.cross_entropy(head(feats), y) / accum_steps).backward()
    probe_loss = F.cross_entropy(probe(feats.detach()), y)
    probe_opt.zero_grad()
    probe_loss.backward()
    probe_opt.step()
    if (i + 1) % accum_steps == 0:
        backbone_opt.step()
        backbone_opt.zero_grad()
