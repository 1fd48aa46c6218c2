"""newt.torch.DistributedDataParallel's gradients, checked inside a real job (test_python.py's
ddp_no_sync): at every step each rank accumulates its micro-batches with no_sync(), the last
backward reduces over newt, and the gradients must be those of the whole global batch's mean
loss -- which every rank can compute itself on a copy of the model, the data being a pure
function of the sample index. Prints "ok step N" per step, "FAIL ..." on a mismatch.

usage: newt run --nproc 2 --global-batch 8 --micro-batch 2 -- python3 ddp_units.py"""
import contextlib
import copy
import sys

import torch
import torch.nn.functional as F

import newt
import newt.torch


def data(samples):
    xs, ys = [], []
    for i in samples:
        g = torch.Generator().manual_seed(77 + i)
        xs.append(torch.randn(6, generator=g))
        ys.append(int(torch.randint(3, (1,), generator=g)))
    return torch.stack(xs), torch.tensor(ys)


def main():
    torch.manual_seed(5)
    with newt.join() as job:
        net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        model = newt.torch.DistributedDataParallel(net, job, bucket_cap_mb=0.0005)  # several buckets
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        newt.init_optimizer_state(opt)
        job.state.add("model", model)
        job.state.add("opt", opt)
        for step in job.steps():
            with step:
                opt.zero_grad(set_to_none=False)
                mbs = step.micro_batches()
                total = 0.0
                for k, mb in enumerate(mbs):
                    x, y = data(mb)
                    with model.no_sync() if k < len(mbs) - 1 else contextlib.nullcontext():
                        loss = F.cross_entropy(model(x), y, reduction="sum")
                        (loss / step.count).backward()
                    total += loss.item()
                # the whole global batch on a copy: the gradients the reduction must give
                ref = copy.deepcopy(net)
                ref.zero_grad()
                gx, gy = data(range((step.number - 1) * job.global_batch, step.number * job.global_batch))
                (F.cross_entropy(ref(gx), gy, reduction="sum") / job.global_batch).backward()
                worst = max(float((p.grad - q.grad).abs().max() / (q.grad.abs().max() + 1e-12))
                            for p, q in zip(net.parameters(), ref.parameters()))
                s = step.commit(total)
                if worst > 1e-5:
                    print(f"FAIL step {step.number}: the reduced gradients differ from the global batch's by "
                          f"{worst:.3g} (relative)", file=sys.stderr, flush=True)
                else:
                    print(f"ok step {step.number} ({len(mbs)} micro-batches, worst {worst:.2g})", file=sys.stderr,
                          flush=True)
                opt.step()
                step.end(loss=s / job.global_batch)


if __name__ == "__main__":
    main()
