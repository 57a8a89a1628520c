"""The same workload as examples/train_mlp.cc in PyTorch DDP: an MLP on a synthetic, seeded
data set with teacher labels, DistributedSampler, cross-entropy, SGD with momentum 0.9; Gloo on
the CPU, or NCCL with --device cuda (one GPU per local rank, batches copied from pinned memory).

    launch --nproc-per-node=2 examples/python/train_ddp.py --steps 100

Prints a final line with steps_per_s measured after the warm-up (barrier before and after).
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dims", default="784,1024,1024,10")
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--dataset-size", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--print-every", type=int, default=10)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = p.parse_args()

    if a.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("train_ddp.py: --device cuda, but torch sees no GPU")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dims = [int(d) for d in a.dims.split(",")]

    torch.manual_seed(a.seed)
    layers = []
    for i in range(len(dims) - 1):
        layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(torch.nn.ReLU())
    module = torch.nn.Sequential(*layers).to(device)
    model = DDP(module, bucket_cap_mb=a.bucket_mb, device_ids=[device.index] if device.type == "cuda" else None)

    g = torch.Generator().manual_seed(a.seed + 1000003)
    inputs = torch.randn(a.dataset_size, dims[0], generator=g)
    teacher = torch.randn(dims[0], dims[-1], generator=g)
    labels = inputs.matmul(teacher).argmax(1)
    pin = device.type == "cuda"
    sampler = DistributedSampler(range(a.dataset_size), num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)

    epoch, pos = 0, 0
    sampler.set_epoch(epoch)
    order = list(sampler)
    start, measured_from = time.perf_counter(), None
    loss_v = 0.0
    for step in range(1, a.steps + 1):
        if step == 1 + a.warmup or (measured_from is None and step == a.steps):
            dist.barrier()
            start, measured_from = time.perf_counter(), step
        if pos + a.batch > len(order):
            epoch += 1
            sampler.set_epoch(epoch)
            order, pos = list(sampler), 0
        idx = torch.tensor(order[pos:pos + a.batch])
        x, y = inputs.index_select(0, idx), labels.index_select(0, idx)
        if pin:
            x = x.pin_memory().to(device, non_blocking=True)
            y = y.pin_memory().to(device, non_blocking=True)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        pos += a.batch
        loss_v = loss.item()
        if a.print_every > 0 and rank == 0 and (step % a.print_every == 0 or step == a.steps):
            print(f"step {step} loss {loss_v:.6f}", flush=True)
    dist.barrier()
    secs = time.perf_counter() - start
    if rank == 0:
        measured = a.steps - measured_from + 1 if measured_from else 0
        print(f"done: steps={a.steps} loss={loss_v:.6f} measured_steps={measured} "
              f"steps_per_s={measured / secs if secs > 0 else 0:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
