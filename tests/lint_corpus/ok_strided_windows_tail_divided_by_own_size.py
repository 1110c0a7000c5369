# corpus: style=hand_loop class=OK
# Windows cut with range(start, min(start + K, n)), each loss divided by its own window size.
import torch.nn.functional as F

K = 4
N_MICRO = 10


def train(model, opt, micro_batch):
    for start in range(0, N_MICRO, K):
        window = list(range(start, min(start + K, N_MICRO)))
        for i in window:
            x, y = micro_batch(i)
            loss = F.mse_loss(model(x), y)
            (loss / len(window)).backward()
        opt.step()
        opt.zero_grad()
