"""A PyTorch program whose own code makes its replicas drift (test_truth's drift scenario):
a classifier with BatchNorm, its module declared as newt state (parameters and buffers).
BatchNorm updates its running statistics in the forward pass, on each rank from that rank's
own samples, so the ranks' running_mean and running_var part ways after the first step
although every parameter stays the same. newt's check of the replicas must name them.

usage: newt run --nproc 3 ... -- python3 drift.py"""
import torch
import torch.nn.functional as F

import newt

DIM, CLASSES = 16, 4


def samples(first, count):
    g = torch.Generator().manual_seed(1000 + first)  # a pure function of the sample index
    x = torch.randn(count, DIM, generator=g)
    return x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()


with newt.join() as job:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                torch.nn.Linear(32, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.state.add("model", model)
    for step in job.steps():
        with step:
            opt.zero_grad(set_to_none=False)
            loss_sum = 0.0
            for mb in step.micro_batches():
                x, y = samples(mb.start, len(mb))
                loss = F.cross_entropy(model(x), y, reduction="sum")
                (loss / job.global_batch).backward()
                loss_sum += loss.item()
            job.reduce_gradients(model)
            total = step.commit(loss_sum)
            opt.step()
            step.end(loss=total / job.global_batch)
