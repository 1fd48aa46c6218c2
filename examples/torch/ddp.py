"""A stock DistributedDataParallel script, run elastically under newt: a small CNN with
BatchNorm, AdamW, a warm-up schedule and gradient accumulation with no_sync(), written as a
torch DDP script is (docs/python.md, "A DDP script": the lines that differ from one under
torchrun).

    newt run --nproc 4 --steps 100 --global-batch 24 --micro-batch 2 -- \\
        python3 examples/torch/ddp.py [--lr 2e-3] [--seed 1] [--no-broadcast-buffers] [--autocast bf16|fp16]
                                      [--overflow-sample I] [--zero1]

The data: 8x8 single-channel images whose class is a pure function of (seed, i), so the sample
indices newt hands a rank are its whole data loader. Each micro-batch's loss is summed over
its samples and divided by the rank's samples of the step (step.count): newt's DDP scales
each bucket by the rank's share of the global batch, so the update is the global batch's mean
at any world size. BatchNorm's running statistics are made equal on every rank
(broadcast_buffers, as torch's DDP does); at the end each rank prints a fingerprint of them.
With --zero1 the optimizer is newt.torch.ZeroRedundancyOptimizer: AdamW's state sharded over
the data-parallel ranks (ZeRO stage 1), resharded by newt at every resize; at the end each rank
prints its optimizer state's bytes.

With --autocast fp16 (CUDA, or a torch whose torch.amp.GradScaler takes the CPU) a GradScaler
scales the loss; its state is declared (job.state.add("scaler", scaler): its state_dict, an
extra). --overflow-sample I makes the gradient of the micro-batch holding sample I infinite (a
real overflow in the backward): the reduced gradients then hold it on every rank, so every rank's
scaler skips that step and halves its scale alike, and the run ends as the same script on one
worker does. At the end each rank prints the steps its scaler skipped and its scale.
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


def grad_scaler(dev):
    """torch's GradScaler for the device, or None where this torch has none for it."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):  # torch 2.3 and later: any device
        try:
            return amp.GradScaler(dev.type)
        except (RuntimeError, TypeError, ValueError):
            pass
    if dev.type == "cuda":
        return torch.cuda.amp.GradScaler()
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-broadcast-buffers", action="store_true", help="leave BatchNorm's buffers to each rank")
    ap.add_argument("--autocast", choices=["none", "bf16", "fp16"], default="none",
                    help="mixed precision in the forward (fp16: with a GradScaler)")
    ap.add_argument("--overflow-sample", type=int, default=-1,
                    help="with fp16: the sample whose micro-batch's gradient overflows (its step is skipped)")
    ap.add_argument("--zero1", action="store_true", help="AdamW's state sharded over the ranks (ZeRO stage 1)")
    args = ap.parse_args()
    if args.overflow_sample >= 0 and args.autocast != "fp16":
        ap.error("--overflow-sample needs --autocast fp16 (a GradScaler to find the overflow)")
    if args.autocast == "fp16" and args.zero1:
        ap.error("--autocast fp16 is not combined with --zero1 here (GradScaler unscales the optimizer's own "
                 "parameters' gradients)")
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
        scaler = None
        if args.autocast == "fp16":
            scaler = grad_scaler(dev)
            if scaler is None:
                print(f"ddp.py: --autocast fp16 needs CUDA or a torch with torch.amp.GradScaler (2.3 and later) for "
                      f"the {dev.type}; this is torch {torch.__version__}", file=sys.stderr)
                sys.exit(2)
            job.state.add("scaler", scaler)  # its scale and growth tracker: an extra
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.autocast)
        amp = torch.autocast(dev.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        skipped = 0
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
                        scaled = loss / step.count
                        if args.overflow_sample in mb:
                            scaled = scaled * float("inf")  # an overflow: inf and nan in this backward
                        (scaler.scale(scaled) if scaler else scaled).backward()
                    loss_sum += loss.item()
                total = step.commit(loss_sum)
                lr = sched.get_last_lr()[0]
                if scaler:  # the reduced gradients are the same on every rank: so is the skip
                    before = scaler.get_scale()
                    scaler.step(opt)
                    scaler.update()
                    skipped += scaler.get_scale() < before
                else:
                    opt.step()
                sched.step()
                loss_mean = total / job.global_batch
                step.end(loss=loss_mean, lr=lr)
        if job.outcome == "done" and job.layout:
            opt_bytes = opt.state_bytes() if args.zero1 else sum(
                v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
            print(f"ddp.py: rank {job.layout.rank} done, loss {loss_mean:.6f}, buffers {buffers_digest(net)}, "
                  f"optimizer state {opt_bytes} bytes of {job.layout.dp_size} ranks (state from {job.restored_from})"
                  + (f", scaler skipped {skipped} steps, scale {scaler.get_scale():g}" if scaler else ""),
                  file=sys.stderr)


if __name__ == "__main__":
    main()
