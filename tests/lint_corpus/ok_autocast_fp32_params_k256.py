# corpus: style=plain class=OK
import torch
import torch.nn.functional as F

ACCUMULATE = 256


def run(net, stream, lr=1e-3):
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for i, (feat, label) in enumerate(stream):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = net(feat)
        (F.cross_entropy(logits.float(), label) / ACCUMULATE).backward()
        if (i + 1) % ACCUMULATE == 0:
            opt.step()
            opt.zero_grad()
