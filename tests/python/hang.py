# A torch.distributed script that reports its steps with launch_progress. In the first attempt
# rank 1 stops at step 3 (outside any collective) while rank 0 waits for it in all_reduce; the
# restarted attempt runs through.
import os
import time

import launch_progress
import torch
import torch.distributed as dist


def stop_here():
    while True:
        time.sleep(3600)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    progress = launch_progress.Reporter()
    for step in range(1, 8):
        if step == 3 and rank == 1 and first_attempt:
            stop_here()
        t = torch.ones(1)
        dist.all_reduce(t)
        progress.step(step, t.item())
        time.sleep(0.05)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


main()
