"""The training of examples/torch/train.py without newt: torch.distributed (gloo) and
DistributedDataParallel under torchrun, the baseline bench/torch/compare.py puts newt beside.

    python3 -m torch.distributed.run --standalone --redirects 2 --tee 2 --nproc_per_node 2 \
        bench/torch/ddp_train.py --steps 120 --global-batch 16 --micro-batch 2 --step-log S.jsonl \
        [--ckpt-dir D --ckpt-every 10]

The same model, data, optimizer and batch split as the example (LM, tokens_of and VOCAB are
imported from its lm.py): AdamW (lr 1e-3, weight decay 0.01) with the same LambdaLR warm-up; step s
covers samples [(s-1) G, s G) and rank r takes the contiguous G/world of them from
(s-1) G + r G/world, as newt hands them out, in micro-batches of M with DDP's no_sync on all
but the last. The loss is the mean over every token of the global batch: each rank backpropagates
its summed loss times world / (G seq), since DDP averages the gradients over the ranks where newt
sums them (the same gradient either way). The mean loss is all-reduced once per step, as newt's
step.commit does, for the step log.

Every flag has an environment default (STEPS, GLOBAL_BATCH, MICRO_BATCH, STEP_LOG, CKPT_DIR,
CKPT_EVERY). The step log gets JSON lines: rank 0's {"event":"step","step","t","loss"} after
each step (t: wall time, s) and every rank's {"event":"ready","rank","world","pid","start",
"init_s","t"} once it is about to train from step start + 1. With --ckpt-dir, rank 0 writes
step-NNNNNN.pt (model, optimizer, scheduler, step) every --ckpt-every steps with torch.save,
fsync and rename, keeping the newest two; a start (or torchrun's restart after a lost worker)
resumes from the newest one.
"""

import argparse
import contextlib
import glob
import json
import os
import sys
import time

t_start = time.time()

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# the example's model and data (no newt in them: the baseline runs no newt code)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "torch"))
import lm  # noqa: E402
from lm import VOCAB, tokens_of  # noqa: E402


def env_int(name, default):
    return int(os.environ.get(name, default))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=env_int("STEPS", 120))
    ap.add_argument("--global-batch", type=int, default=env_int("GLOBAL_BATCH", 16), help="G: samples per step")
    ap.add_argument("--micro-batch", type=int, default=env_int("MICRO_BATCH", 2), help="M: samples per forward")
    ap.add_argument("--step-log", default=os.environ.get("STEP_LOG"), help="JSON lines (required)")
    ap.add_argument("--ckpt-dir", default=os.environ.get("CKPT_DIR"))
    ap.add_argument("--ckpt-every", type=int, default=env_int("CKPT_EVERY", 0), help="0: never")
    lm.add_args(ap)  # the example's own flags, with its defaults
    args = ap.parse_args()
    if not args.step_log:
        ap.error("--step-log (or STEP_LOG) is required")
    if args.ckpt_every and not args.ckpt_dir:
        ap.error("--ckpt-every needs --ckpt-dir (or CKPT_DIR)")
    return args


def ckpt_newest(ckdir):
    """The path of the newest checkpoint in ckdir (step-NNNNNN.pt), or None."""
    paths = sorted(glob.glob(os.path.join(ckdir, "step-*.pt")))
    return paths[-1] if paths else None


def ckpt_save(ckdir, step, model, opt, sched):
    """Writes step-NNNNNN.pt whole or not at all (a temporary file, fsync, rename), then keeps
    the newest two."""
    path = os.path.join(ckdir, f"step-{step:06d}.pt")
    tmp = path + f".tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "step": step}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in sorted(glob.glob(os.path.join(ckdir, "step-*.pt")))[:-2]:
        os.unlink(old)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    G, M, seq = args.global_batch, args.micro_batch, args.seq
    if G % (M * world):
        sys.exit(f"ddp_train.py: a global batch of {G} does not split in micro-batches of {M} over {world} ranks")
    per_rank = G // world
    log = open(args.step_log, "a", buffering=1)

    model, opt, sched = lm.build(args, torch.device("cpu"))  # seeded: the same start (DDP also broadcasts rank 0's)
    start = 0
    if args.ckpt_dir:
        os.makedirs(args.ckpt_dir, exist_ok=True)
        path = ckpt_newest(args.ckpt_dir)
        if path:
            s = torch.load(path)
            model.load_state_dict(s["model"])
            opt.load_state_dict(s["opt"])
            sched.load_state_dict(s["sched"])
            start = s["step"]
    # the causal mask is the model's one buffer, a constant: newt does not sync it either
    ddp = DDP(model, broadcast_buffers=False)
    print(json.dumps({"event": "ready", "rank": rank, "world": world, "pid": os.getpid(), "start": start,
                      "init_s": round(time.time() - t_start, 3), "t": time.time()}), file=log)

    scale = world / (G * seq)  # DDP averages over the ranks: the gradient of the global mean
    for step in range(start + 1, args.steps + 1):
        first = (step - 1) * G + rank * per_rank
        mbs = [range(a, min(a + M, first + per_rank)) for a in range(first, first + per_rank, M)]
        opt.zero_grad(set_to_none=False)
        loss_sum = 0.0
        tokens = tokens_of(range(first, first + per_rank), seq, args.seed)  # this rank's samples, as the example
        for i, mb in enumerate(mbs):
            with ddp.no_sync() if i < len(mbs) - 1 else contextlib.nullcontext():
                t = tokens[mb.start - first:mb.stop - first]
                logits = ddp(t[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), t[:, 1:].reshape(-1), reduction="sum")
                (loss * scale).backward()
            loss_sum += loss.item()
        total = torch.tensor([loss_sum], dtype=torch.float64)
        dist.all_reduce(total)
        opt.step()
        sched.step()
        if rank == 0:
            print(json.dumps({"event": "step", "step": step, "t": time.time(), "loss": total.item() / (G * seq)}),
                  file=log)
            if args.ckpt_every and step % args.ckpt_every == 0:
                ckpt_save(args.ckpt_dir, step, model, opt, sched)
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
