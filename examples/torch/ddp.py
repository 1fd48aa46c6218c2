"""A stock DistributedDataParallel script, run elastically under newt: a small CNN with
BatchNorm, AdamW, a warm-up schedule and gradient accumulation with no_sync(), written as a
torch DDP script is (docs/python.md, "A DDP script": the lines that differ from one under
torchrun).

    newt run --nproc 4 --steps 100 --global-batch 24 --micro-batch 2 -- \\
        python3 examples/torch/ddp.py [--lr 2e-3] [--seed 1] [--no-broadcast-buffers] [--autocast bf16] [--zero1]

The data: 8x8 single-channel images whose class is a pure function of (seed, i), so the sample
indices newt hands a rank are its whole data loader. Each micro-batch's loss is summed over
its samples and divided by the rank's samples of the step (step.count): newt's DDP scales
each bucket by the rank's share of the global batch, so the update is the global batch's mean
at any world size. BatchNorm's running statistics are made equal on every rank
(broadcast_buffers, as torch's DDP does); at the end each rank prints a fingerprint of them.
With --zero1 the optimizer is newt.torch.ZeroRedundancyOptimizer: AdamW's state sharded over
the data-parallel ranks (ZeRO stage 1), resharded by newt at every resize; at the end each rank
prints its optimizer state's bytes.
"""

import argparse
import contextlib
import hashlib
import sys

import torch
import torch.nn.functional as F

import newt
import newt.torch

CLASSES = 4


def images_of(samples, seed):
    """The images and labels of sample indices: a pure function of (seed, i)."""
    xs, ys = [], []
    for i in samples:
        g = torch.Generator().manual_seed(seed * 1000003 + i)
        y = int(torch.randint(CLASSES, (1,), generator=g))
        x = torch.randn(1, 8, 8, generator=g) * 0.5
        x[0, 2 * y:2 * y + 2, :] += 1.0  # the class is a band of the image
        xs.append(x)
        ys.append(y)
    return torch.stack(xs), torch.tensor(ys)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.head = torch.nn.Linear(16 * 2 * 2, CLASSES)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.head(x.flatten(1))


def buffers_digest(model):
    h = hashlib.sha256()
    for name, b in model.named_buffers():
        h.update(name.encode())
        h.update(b.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-broadcast-buffers", action="store_true", help="leave BatchNorm's buffers to each rank")
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none", help="mixed precision in the forward")
    ap.add_argument("--zero1", action="store_true", help="AdamW's state sharded over the ranks (ZeRO stage 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    with newt.join() as job:
        dev = job.torch_device
        torch.manual_seed(args.seed)
        net = Net().to(dev)
        model = newt.torch.DistributedDataParallel(net, job, broadcast_buffers=not args.no_broadcast_buffers)
        if args.zero1:
            opt = newt.torch.ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, job, lr=args.lr,
                                                     weight_decay=0.01)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
            newt.init_optimizer_state(opt)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
        job.state.add("model", model)
        job.state.add("opt", opt)
        job.state.add("sched", sched)
        amp = torch.autocast(dev.type, dtype=torch.bfloat16) if args.autocast == "bf16" else contextlib.nullcontext()
        loss_mean = float("nan")
        for step in job.steps():
            with step:
                opt.zero_grad(set_to_none=False)
                mbs = step.micro_batches()
                loss_sum = 0.0
                for k, mb in enumerate(mbs):
                    x, y = images_of(mb, args.seed)
                    # every micro-batch but the last accumulates locally: the last one's backward
                    # reduces the sum (DDP's no_sync)
                    with model.no_sync() if k < len(mbs) - 1 else contextlib.nullcontext():
                        with amp:
                            out = model(x.to(dev))
                        loss = F.cross_entropy(out.float(), y.to(dev), reduction="sum")
                        (loss / step.count).backward()
                    loss_sum += loss.item()
                total = step.commit(loss_sum)
                lr = sched.get_last_lr()[0]
                opt.step()
                sched.step()
                loss_mean = total / job.global_batch
                step.end(loss=loss_mean, lr=lr)
        if job.outcome == "done" and job.layout:
            opt_bytes = opt.state_bytes() if args.zero1 else sum(
                v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
            print(f"ddp.py: rank {job.layout.rank} done, loss {loss_mean:.6f}, buffers {buffers_digest(net)}, "
                  f"optimizer state {opt_bytes} bytes of {job.layout.dp_size} ranks (state from {job.restored_from})",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
