"""A small transformer language model trained elastically under newt: a PyTorch program that
no part of newt knows, written against the Python package (docs/python.md).

    newt run --nproc 4 --steps 200 --global-batch 16 --micro-batch 2 -- \
        python3 examples/torch/train.py [--d-model 64] [--layers 2] [--lr 1e-3] [--seed 1]

The model: token and position embeddings, nn.TransformerEncoderLayer blocks under a causal
mask, a linear head; AdamW with a warm-up schedule (torch.optim.lr_scheduler.LambdaLR). The
data: sequences of a noisy recurrence over a small vocabulary, sample i a pure function of
(seed, i), so the sample indices newt hands a rank are its whole data loader and no sample is
lost or repeated however the job resizes. The loss is the mean over every token of the
global batch: each rank sums its samples' losses and divides by the global batch, and the
gradients are summed over the data-parallel group (job.reduce_gradients). With --ddp the model
is wrapped in torch's DistributedDataParallel over newt (newt.torch): each rank divides by its
own tokens, accumulates its micro-batches with no_sync, and the buckets are reduced as backward
fills them, each scaled by the rank's share of the global batch.
"""

import argparse
import contextlib
import sys

import torch
import torch.nn.functional as F

import newt
import newt.torch
import lm  # the model and data (lm.py beside this file)
from lm import VOCAB, tokens_of


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    lm.add_args(ap)
    ap.add_argument("--ddp", action="store_true",
                    help="torch's DistributedDataParallel over newt (newt.torch) instead of job.reduce_gradients")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    with newt.join() as job:  # etcd, job, worker id, device: from newt run's environment
        dev = job.torch_device
        model, opt, sched = lm.build(args, dev)  # seeded: the same start everywhere (newt also broadcasts rank 0's)
        net = model
        if args.ddp:  # each bucket reduced over newt as backward fills it, the next one's backward overlapping
            model = newt.torch.DistributedDataParallel(net, job)
        newt.init_optimizer_state(opt)  # newt declares the optimizer's memory before training
        job.state.add("model", net)  # the same names with --ddp or without
        job.state.add("opt", opt)
        job.state.add("sched", sched)
        seq_tokens = job.global_batch * args.seq
        loss_mean = float("nan")
        for step in job.steps():
            with step:  # a lost peer ends the step here; the next iteration recovers
                opt.zero_grad(set_to_none=False)
                loss_sum = 0.0
                tokens = tokens_of(step.samples, args.seq, args.seed).to(dev)  # this rank's samples
                mbs = step.micro_batches()
                for k, mb in enumerate(mbs):
                    t = tokens[mb.start - step.first:mb.stop - step.first]
                    # with --ddp the last micro-batch's backward reduces (no_sync before it), and
                    # the hook scales a rank's loss, a share of its own tokens, by its share
                    with model.no_sync() if args.ddp and k < len(mbs) - 1 else contextlib.nullcontext():
                        logits = model(t[:, :-1])
                        loss = F.cross_entropy(logits.reshape(-1, VOCAB), t[:, 1:].reshape(-1), reduction="sum")
                        (loss / (step.count * args.seq if args.ddp else seq_tokens)).backward()
                    loss_sum += loss.item()
                if not args.ddp:
                    job.reduce_gradients(model)
                # the global gradient norm (the step log and metrics show it); nothing is clipped
                gnorm = torch.linalg.vector_norm(
                    torch.stack([p.grad.detach().norm() for p in model.parameters() if p.grad is not None])).item()
                total = step.commit(loss_sum)  # every rank agrees; summed over the ranks
                lr = sched.get_last_lr()[0]
                opt.step()
                sched.step()
                loss_mean = total / seq_tokens
                step.end(loss=loss_mean, lr=lr, tokens=seq_tokens, grad_norm=gnorm)
        if job.outcome == "done" and job.layout and job.layout.rank == 0:
            print(f"train.py: done, loss {loss_mean:.6f} (state from {job.restored_from})", file=sys.stderr)


if __name__ == "__main__":
    main()
