# An unmodified torch.distributed script: gloo process group from torchrun's environment, one
# all-reduce, rank 0 prints the result (and whether torch was imported before the script ran: a
# --warm-start standby's, and whether the standby holds its exit notice). ALLREDUCE_FAIL_FIRST=1:
# rank 1 exits 3 in attempt 0.
import sys

_PRELOADED = "torch" in sys.modules

import os

import torch
import torch.distributed as dist

if os.environ.get("ALLREDUCE_FAIL_FIRST") == "1" and os.environ["RANK"] == "1" and \
        os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(3)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
# A warm worker's standby holds its exit notice for launch (LAUNCH_EXIT_NOTICE).
notice = getattr(sys.modules.get("_launch_standby"), "_NOTICE", None) is not None
print(f"rank {rank}/{world} allreduce={t.item():g}{' torch preloaded' if _PRELOADED else ''}"
      f"{', exit notice held' if notice else ''}", flush=True)
dist.destroy_process_group()
