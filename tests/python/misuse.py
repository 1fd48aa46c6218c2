"""A worker that uses the Python package wrongly on purpose, run by test_python.py under
`newt run`: each misuse must raise newt.UsageError naming what is wrong. Prints "ok CASE"
for each case that did; "misuse MODE: done" when the mode ran to its end.

    misuse.py declare    misuses at declaration and within steps (the job then trains on)
    misuse.py freed      a state tensor's memory freed after a step
    misuse.py replaced   a parameter's memory replaced (p.data = ...) after a step
    misuse.py not_ended  a step neither committed nor ended, outside `with step:`
    misuse.py capacity   an extra whose pickle outgrows its capacity
    misuse.py sigint     Ctrl-C (SIGINT) in a step: the worker leaves gracefully
"""

import os
import signal
import sys

import numpy as np
import torch

import newt


def expect(case, fn, *words):
    """Runs fn, which must raise newt.UsageError with all of words in its message; returns it."""
    try:
        fn()
    except newt.UsageError as e:
        msg = str(e)
        missing = [w for w in words if w not in msg]
        if missing:
            print(f"FAIL {case}: the message lacks {missing}: {msg}", flush=True)
        else:
            print(f"ok {case}: {msg}", flush=True)
        return e
    except Exception as e:  # noqa: BLE001 (any other kind is the failure this reports)
        print(f"FAIL {case}: {type(e).__name__} instead of newt.UsageError: {e}", flush=True)
        return
    print(f"FAIL {case}: nothing was raised", flush=True)


def declare_misuses(job, model):
    st = job.state
    expect("not_contiguous", lambda: st.add("t", torch.zeros(4, 4).t()), "'t'", "not contiguous")
    expect("dtype_torch", lambda: st.add("d", torch.zeros(3, dtype=torch.float64)), "'d'", "torch.float64",
           "not one newt carries")
    expect("dtype_numpy", lambda: st.add("n", np.zeros(3, dtype=np.complex64)), "'n'", "complex64")
    ro = np.zeros(3, dtype=np.float32)
    ro.flags.writeable = False
    expect("read_only", lambda: st.add("ro", ro), "'ro'", "read-only")
    opt = torch.optim.Adam(model.parameters())
    expect("no_optimizer_state", lambda: st.add("opt", opt), "'opt'", "no state", "init_optimizer_state")
    expect("not_state", lambda: st.add("s", "text"), "'s'", "str", "is not a tensor")
    expect("long_name", lambda: st.add("x" * 80, torch.zeros(2)), "80 bytes", "at most 71")
    expect("newt_name", lambda: st.add("newt.mine", torch.zeros(2)), "newt.")
    expect("sparse", lambda: st.add("sp", torch.zeros(2, 2).to_sparse()), "'sp'", "sparse")
    st.add("w", torch.zeros(8))
    expect("twice", lambda: st.add("w", torch.zeros(8)), "'w'", "declared twice")


def train(job, model, opt, mode):
    w = model.weight
    for step in job.steps():
        with step:
            loss = (model(torch.ones(1, 4)) ** 2).sum() / step.global_batch * step.count
            loss.backward()
            job.reduce_gradients(model)
            if mode == "declare" and step.number == 1:
                expect("late", lambda: job.state.add("late", torch.zeros(2)), "'late'", "after the first step")
                expect("end_first", lambda: step.end(), "before it was committed")
                g = job.layout.dp
                expect("allgather_size", lambda: g.allgather(torch.zeros(2), torch.zeros(3)), "allgather", "elements")
                expect("op", lambda: g.allreduce(torch.zeros(2), op="median"), "median")
            total = step.commit(loss.item())
            if mode == "declare" and step.number == 1:
                expect("commit_twice", lambda: step.commit(1.0), "committed twice")
            opt.step()
            opt.zero_grad()
            step.end(loss=total)
        if mode == "sigint" and step.number == 2 and job.worker_id == "w1":
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: a leave at the next step boundary
        if mode == "freed" and step.number == 2:
            (w.untyped_storage() if hasattr(w, "untyped_storage") else w.storage()).resize_(0)
        if mode == "replaced" and step.number == 2:
            w.data = torch.zeros_like(w)
        if mode == "capacity" and step.number == 2:
            job.big = "x" * 1000


def main():
    mode = sys.argv[1]
    torch.manual_seed(0)
    with newt.join() as job:
        model = torch.nn.Linear(4, 1, bias=False)
        if mode == "declare":
            declare_misuses(job, model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        newt.init_optimizer_state(opt)
        job.state.add("model", model)
        job.state.add("opt", opt)
        job.big = ""
        if mode == "capacity":
            job.state.extra("big", lambda: job.big, lambda v: setattr(job, "big", v), capacity=256)
        err = None
        if mode == "not_ended":
            it = job.steps()
            for step in it:
                if step.number == 1:
                    with step:
                        step.commit(0.0)
                        opt.step()
                        step.end(loss=0.0)
                else:
                    break  # step 2 begun, never committed nor ended
            err = expect("not_ended", lambda: next(it), "step 2 was not ended", "step.commit()", "step.end()")
        elif mode in ("freed", "replaced"):
            words = ("'model.weight'", "replaced, moved or freed")
            err = expect(mode, lambda: train(job, model, opt, mode), *words)
        elif mode == "capacity":
            err = expect("capacity", lambda: train(job, model, opt, mode), "'big'", "capacity of 248")
        else:
            train(job, model, opt, mode)
            if mode == "sigint":
                print(f"ok sigint: outcome {job.outcome}" if job.outcome == "left"
                      else f"FAIL sigint: outcome {job.outcome}", flush=True)
        print(f"misuse {mode}: done", flush=True)
        if err is not None:
            raise err  # as a program that does not catch it: the worker ends with exit status 2


if __name__ == "__main__":
    main()
