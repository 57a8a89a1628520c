# A plain DDP training script, as it would run under torchrun: no launch_progress. launch counts
# its optimizer steps. --slow-rank R --slow-ms M: rank R loads each batch M ms slower (a
# straggler). --stop-rank R --stop-step S: rank R stops before step S for good, outside any
# collective (the other rank waits for it in its backward's all-reduce).
import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def stop_here():
    while True:
        time.sleep(3600)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0)
    p.add_argument("--stop-rank", type=int, default=-1)
    p.add_argument("--stop-step", type=int, default=-1)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, a.steps + 1):
        if rank == a.stop_rank and step == a.stop_step:
            stop_here()
        if rank == a.slow_rank:
            time.sleep(a.slow_ms / 1000)
        x, y = torch.randn(16, 32), torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"rank {rank} done after {a.steps} steps", flush=True)
    dist.destroy_process_group()


main()
