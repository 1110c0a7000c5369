# corpus: style=plain class=OK
import torch
import torch.nn.functional as F

torch.manual_seed(0)
net = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
X, Y = torch.randn(64, 8), torch.randn(64, 1)
K, bs = 4, 4
for it in range(4):
    for k in range(K):
        i = (it * K + k) * bs
        loss = F.mse_loss(net(X[i:i + bs]), Y[i:i + bs])
        (loss / K).backward()
    opt.step()
    opt.zero_grad()
