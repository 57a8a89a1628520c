"""The worker of bench_recovery.py: a 2-rank Gloo DDP loop that stamps its times into STAMP_FILE.

Lines: "start <rank> <attempt> <t>" (first line of the script, before import torch),
"init <rank> <attempt> <t0> <t1>" (init_process_group), "step <rank> <attempt> <n> <t>", and
"death <rank> <t>" just before rank 1 SIGKILLs itself at step KILL_AT of attempt 0 (KILL_AT=0:
nobody dies; STEPS steps, then exit 0). Times are time.time().
"""
import os
import signal
import sys
import time

t_start = time.time()
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
stamps = open(os.environ["STAMP_FILE"], "a", buffering=1)
stamps.write(f"start {rank} {attempt} {t_start:.6f}\n")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

t0 = time.time()
dist.init_process_group("gloo")
stamps.write(f"init {rank} {attempt} {t0:.6f} {time.time():.6f}\n")
kill_at, steps = int(os.environ.get("KILL_AT", "10")), int(os.environ.get("STEPS", "20"))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 256)
for n in range(1, steps + 1):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    stamps.write(f"step {rank} {attempt} {n} {time.time():.6f}\n")
    if attempt == 0 and kill_at and n == kill_at and rank == 1:
        stamps.write(f"death {rank} {time.time():.6f}\n")
        stamps.flush()
        os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
sys.exit(0)
