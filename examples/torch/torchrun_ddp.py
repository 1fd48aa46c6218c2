"""A torch.distributed script as PyTorch's DDP examples write it, for torchrun -- and, unmodified,
for newt's restart mode (docs/elastic.md, "Scripts that do not link newt"):

    torchrun --nproc_per_node 2 examples/torch/torchrun_ddp.py --ckpt-dir /tmp/ck
    newt run --restart --nproc 2 -- python3 examples/torch/torchrun_ddp.py --ckpt-dir /tmp/ck

It reads RANK, WORLD_SIZE and LOCAL_RANK from the environment, calls
init_process_group("gloo") (MASTER_ADDR and MASTER_PORT from the environment), wraps a small
float64 MLP in DistributedDataParallel, reads its data through a DistributedSampler, and saves
its own checkpoint (model, optimizer, step) every --ckpt-every steps, from which it resumes.
Each step it prints `NEWT_STEP <n> loss <x>` (the global batch's mean loss): newt counts the
script's steps from that line; under torchrun it is just output.

The global batch is --global-batch samples whatever the world size (each rank takes its
1/WORLD_SIZE of it, DistributedSampler's interleaving): the union of one step's batches is the
same block of the epoch's permutation at any world size dividing it, and DDP's averaged
gradient is the global batch's mean, so a run that changes its world size and resumes from its
checkpoints ends at the uninterrupted run's loss (to float64's rounding of the sums).

With STEP_LOG in the environment rank 0 also appends {"step", "world", "restart", "t"} to that
file per step (a script's own log, as torch_tiny_gpt.py's: bench/torch/restart.py times
recoveries from it under newt and under torchrun alike).

Options for tests, none needed otherwise: --dump-env DIR (write this rank's torchrun variables
to DIR/env-RANK.json once the process group is up, and exit), --gate FILE (a line `S R` in FILE
holds every rank before step S + 1 while TORCHELASTIC_RESTART_COUNT is R: a test injects a
fault at a known step; the wait writes the heartbeat file NEWT_HEARTBEAT_FILE when there is
one, as a script that waits on something long should), --sleep-at S R (rank 0 sleeps, with no
I/O, before step S + 1 while TORCHELASTIC_RESTART_COUNT is R: a hang for the no-progress
detector).
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

TORCHRUN_VARS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_USE_AGENT_STORE", "NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"]


def dataset(n, features, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g, dtype=torch.float64)
    w = torch.randn(features, 1, generator=g, dtype=torch.float64)
    y = torch.tanh(x @ w) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return TensorDataset(x, y)


def heartbeat():
    path = os.environ.get("NEWT_HEARTBEAT_FILE")
    if path:
        with open(path, "w") as f:
            f.write(f"{time.time()}\n")


def hold(gate, step, restart):
    """Waits before step + 1 while the gate file names (step, restart)."""
    while gate and os.path.exists(gate):
        with open(gate) as f:
            held = any(line.split() == [str(step), str(restart)] for line in f)
        if not held:
            return
        heartbeat()
        time.sleep(0.01)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--global-batch", type=int, default=12)
    p.add_argument("--samples", type=int, default=480)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dump-env")
    p.add_argument("--gate")
    p.add_argument("--sleep-at", type=int, nargs=2, default=None)
    a = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    if a.dump_env:
        os.makedirs(a.dump_env, exist_ok=True)
        with open(os.path.join(a.dump_env, f"env-{rank}.json"), "w") as f:
            json.dump({k: os.environ.get(k) for k in TORCHRUN_VARS}, f)
        dist.barrier()
        dist.destroy_process_group()
        return
    if a.global_batch % world:
        sys.exit(f"--global-batch {a.global_batch} does not divide over {world} ranks")

    torch.manual_seed(a.seed)
    model = nn.Sequential(nn.Linear(a.features, 32), nn.Tanh(), nn.Linear(32, 1)).double()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    step = 0
    ckpt = os.path.join(a.ckpt_dir, "checkpoint.pt")
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
    ddp = DDP(model)

    data = dataset(a.samples, a.features, a.seed)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    loader = DataLoader(data, batch_size=a.global_batch // world, sampler=sampler)
    per_epoch = len(loader)
    loss_fn = nn.MSELoss(reduction="sum")
    log = open(os.environ["STEP_LOG"], "a") if os.environ.get("STEP_LOG") and rank == 0 else None
    while step < a.steps:
        epoch, skip = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < skip:
                continue
            hold(a.gate, step, restart)
            if a.sleep_at and [step, restart] == a.sleep_at and rank == 0:
                time.sleep(3600)  # hung: no I/O, no heartbeat
            opt.zero_grad()
            loss = loss_fn(ddp(x), y) / x.shape[0]  # this rank's mean; DDP averages over the ranks
            loss.backward()
            opt.step()
            step += 1
            total = loss.detach() * x.shape[0]
            dist.all_reduce(total)
            if rank == 0:
                print(f"NEWT_STEP {step} loss {total.item() / a.global_batch:.17g}", flush=True)
                if log:
                    log.write(json.dumps({"step": step, "world": world, "restart": restart, "t": time.time()}) + "\n")
                    log.flush()
            if step % a.ckpt_every == 0 and rank == 0:
                os.makedirs(a.ckpt_dir, exist_ok=True)
                tmp = ckpt + ".tmp"
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
                os.replace(tmp, ckpt)
            heartbeat()
            if step == a.steps:
                break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
