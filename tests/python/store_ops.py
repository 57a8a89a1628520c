# torch's own TCPStore client against the store launch's agent serves (MASTER_ADDR:MASTER_PORT,
# TORCHELASTIC_USE_AGENT_STORE=True): every operation this torch's Python API has, across ranks,
# then a Gloo process group and an all-reduce through it. With --max-restarts=1 and
# STORE_OPS_FAIL=1, attempt 0 leaves a key and rank 1 fails; attempt 1 must not see that key.
import datetime
import os
import sys

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True", os.environ["TORCHELASTIC_USE_AGENT_STORE"]
kwargs = dict(world_size=world, is_master=False, timeout=datetime.timedelta(seconds=30))
try:
    # torch 2.x: as its env:// client would, except that USE_LIBUV=0 is heeded (a torch built
    # without libuv, Debian's, refuses the default; the server is launch's either way).
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          use_libuv=os.environ.get("USE_LIBUV", "1") == "1", **kwargs)
except TypeError:  # torch 1.x has no use_libuv
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), **kwargs)
done = []


def check(name, got, want):
    if got != want:
        print(f"rank {rank}: {name}: got {got!r}, expected {want!r}", flush=True)
        sys.exit(1)
    done.append(name)


if attempt == 0 and os.environ.get("STORE_OPS_FAIL") == "1":
    store.set("leak", "from attempt 0")
    store.add("left", 1)
    store.wait(["leak"])
    if rank == 1:
        while store.add("left", 0) < world:
            pass
        sys.exit(3)
    store.wait(["never"], datetime.timedelta(seconds=60))  # stopped by the restart
if attempt > 0:
    # Nothing of an earlier attempt is left (torch 2.x workers do not prefix keys per attempt).
    try:
        store.wait(["leak"], datetime.timedelta(milliseconds=300))
        check("the last attempt's key is gone", "present", "gone")
    except RuntimeError:
        done.append("the last attempt's key is gone")

me, other = f"r{rank}", f"r{(rank + 1) % world}"
store.set(f"{me}/set", b"\x00binary\xff")
check("get", store.get(f"{me}/set"), b"\x00binary\xff")
check("add", store.add(f"{me}/n", 5), 5)
check("add again", store.add(f"{me}/n", -7), -2)
check("get of a counter", store.get(f"{me}/n"), b"-2")
check("compare_set missing, expected empty", store.compare_set(f"{me}/cas", "", "one"), b"one")
check("compare_set match", store.compare_set(f"{me}/cas", "one", "two"), b"two")
check("compare_set mismatch", store.compare_set(f"{me}/cas", "zzz", "three"), b"two")
check("compare_set missing, expected given", store.compare_set(f"{me}/nokey", "e", "d"), b"e")
check("delete_key", store.delete_key(f"{me}/cas"), True)
check("delete_key again", store.delete_key(f"{me}/cas"), False)
store.set(f"{me}/big", b"x" * (4 << 20))
check("a 4 MiB value", store.get(f"{me}/big"), b"x" * (4 << 20))
try:
    store.wait([f"{me}/never"], datetime.timedelta(milliseconds=200))
    check("wait times out", "returned", "timed out")
except RuntimeError:
    done.append("wait times out")
if hasattr(store, "append"):  # torch 2.x
    store.append(f"{me}/log", "a")
    store.append(f"{me}/log", "b")
    check("append", store.get(f"{me}/log"), b"ab")
    store.multi_set([f"{me}/m1", f"{me}/m2"], ["1", "2"])
    check("multi_get", store.multi_get([f"{me}/m1", f"{me}/m2"]), [b"1", b"2"])
    check("check present", store.check([f"{me}/m1"]), True)
    check("check absent", store.check([f"{me}/absent"]), False)
# Across ranks: each waits for the other's key, set after both arrived.
store.add("arrived", 1)
while store.add("arrived", 0) < world:
    pass
store.set(f"{me}/hello", f"from {rank}")
store.wait([f"{other}/hello"])
check("another rank's key", store.get(f"{other}/hello"), f"from {(rank + 1) % world}".encode())
check("num_keys", store.num_keys() > 0, True)

# The process group through this client of the agent's store (env:// would make its own).
dist.init_process_group("gloo", store=dist.PrefixStore(f"pg{attempt}", store), rank=rank, world_size=world)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
check("all_reduce", t.item(), world * (world + 1) / 2)
dist.destroy_process_group()
print(f"rank {rank} attempt {attempt}: {len(done)} store checks passed (torch {torch.__version__})", flush=True)
