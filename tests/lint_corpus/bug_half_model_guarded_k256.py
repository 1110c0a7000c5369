# corpus: style=plain class=F12
import torch
import torch.nn.functional as F

ACCUMULATE = 256


def run(net, stream, lr=1e-3):
    net.half()  # expect: AG120
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for i, (feat, label) in enumerate(stream):
        logits = net(feat.half())
        (F.cross_entropy(logits.float(), label) / ACCUMULATE).backward()
        if (i + 1) % ACCUMULATE == 0:
            opt.step()
            opt.zero_grad()
