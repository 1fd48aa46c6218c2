"""A linear model learned by data-parallel SGD with momentum under newt, in NumPy only (no
torch): the Python package's smallest complete program (docs/python.md).

    newt run --nproc 4 --steps 200 --global-batch 32 --micro-batch 4 -- python3 examples/numpy/train.py

Sample i is a pure function of its index (features from sin, the target a fixed linear
function of them plus a little structure), so newt's sample indices are the whole loader.
"""


import numpy as np

import newt

N = 16  # features
TRUE_W = np.array([np.cos(k) for k in range(N)], dtype=np.float32)


def batch(indices):
    i = np.arange(indices.start, indices.stop, dtype=np.float64)[:, None]
    x = np.sin(i * N + np.arange(N)[None, :]).astype(np.float32)
    return x, x @ TRUE_W + 0.1 * np.sin(i[:, 0] * 0.37).astype(np.float32)


def main():
    lr, momentum = 0.05, 0.9
    with newt.join() as job:
        w = np.zeros(N, dtype=np.float32)
        vel = np.zeros(N, dtype=np.float32)
        g = np.zeros(N, dtype=np.float32)
        job.state.add("w", w)  # updated in place: newt restores the same memory
        job.state.add("momentum", vel)
        for step in job.steps():
            with step:
                x, y = batch(step.samples)
                err = x @ w - y
                g[:] = (2.0 / step.global_batch) * (x.T @ err)  # this rank's share of the global mean
                job.layout.dp.allreduce(g)  # summed over the data-parallel group
                total = step.commit(float(err @ err))
                vel *= momentum
                vel += g
                w -= lr * vel
                step.end(loss=total / step.global_batch, lr=lr)


if __name__ == "__main__":
    main()
