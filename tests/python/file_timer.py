# torch's own file-timer client (FileTimerClient, configure, expires) against launch's server
# (TORCHELASTIC_ENABLE_FILE_TIMER=1). "expire": rank 1 takes a 1 s timer and then sleeps far
# longer, so the timer must kill it; "release": every rank leaves its timed scopes in time.
import os
import sys
import time

from torch.distributed.elastic.timer import FileTimerClient, configure, expires

configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
rank = int(os.environ["RANK"])
if sys.argv[1] == "expire":
    if rank == 1:
        with expires(after=1, scope="stuck step"):
            print("in the timed scope", flush=True)
            time.sleep(3600)
    time.sleep(3600)  # the others wait to be stopped with the group
else:
    for step in range(3):  # the same scope, taken and released again
        with expires(after=60):
            time.sleep(0.05)
    print(f"rank {rank} released in time", flush=True)
