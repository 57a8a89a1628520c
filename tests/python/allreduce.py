# An unmodified torch.distributed script: gloo process group from torchrun's environment, one
# all-reduce, rank 0 prints the result.
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank}/{world} allreduce={t.item():g}", flush=True)
dist.destroy_process_group()
