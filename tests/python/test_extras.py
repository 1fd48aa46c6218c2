"""Extras are data, never code (issue 37, item 1): what newt restores into an extra comes from
a checkpoint, which whoever can write the checkpoint volume can change. Each case fills an
extra's buffer as a restore would and reads it back through the package (newt/_state.py):

    round_trip   the state a program keeps in extras -- an optimizer's hyperparameters and
                 non-tensor state, an LR scheduler's state_dict, torch's and NumPy's RNG
                 states, bytes, tuples, int keys, non-finite floats -- comes back equal
    no_code      a planted pickle that would run a command (os.system through __reduce__)
                 is refused naming the extra, and the command never runs; so are a JSON
                 object of no known tag and a pickle that names any class
    old_pickle   the previous release's plain pickles (hyperparameters, a scheduler's state)
                 still read back
    not_plain    an extra whose value is no plain data (an object) is refused at the write,
                 naming it

Prints "ok CASE" per case and "N passed, N failed"; exits non-zero on any failure."""

import ctypes
import os
import pickle
import struct
import sys
import tempfile

import numpy as np
import torch

import newt
from newt import _state

failures = []


def check(case, cond, msg=""):
    if not cond:
        failures.append(case)
        print(f"FAIL {case}: {msg}", flush=True)


def extra(value_box, capacity=1 << 16):
    return _state._ExtraItem("x", lambda: value_box[0], lambda v: value_box.__setitem__(0, v), False, capacity)


def plant(item, data):
    """What a restore puts in the extra's buffer: its length, then the bytes."""
    ctypes.memmove(item.buf, struct.pack("<Q", len(data)) + data, len(data) + 8)


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def round_trip():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    opt.step()
    sched.step()
    values = {
        "optimizer groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
        "scheduler": sched.state_dict(),
        "torch rng": torch.get_rng_state(),
        "numpy rng": np.random.RandomState(3).get_state(),
        "mixed": {1: (b"\x00\xff", float("inf"), float("-inf"), float("nan"), -(2 ** 70)), "k": [True, None, 0.1],
                  (2, "t"): torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "e": torch.zeros(0, 3)},
    }
    for what, v in values.items():
        box = [v]
        it = extra(box)
        it.write()
        box[0] = None
        it.read()
        check("round_trip", same(v, box[0]), f"{what}: {v!r} came back as {box[0]!r}")


class Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def no_code():
    magic = getattr(_state, "_MAGIC", b"NEWTX1\n")
    with tempfile.TemporaryDirectory() as d:
        mark = os.path.join(d, "ran")
        planted = {
            "a pickle that runs a command": pickle.dumps({"lr": Evil(mark)}, protocol=4),
            "a pickle of an old protocol": pickle.dumps(Evil(mark), protocol=2),
            "a pickle that names a class": pickle.dumps(torch.zeros(2), protocol=4),
            "a JSON object of no tag": magic + b'{"lr": 1}',
            "a JSON tag newt does not know": magic + b'{"$newt": "object", "module": "os", "name": "system"}',
            "an array of objects": magic + b'{"$newt": "ndarray", "dtype": "|O", "shape": [1], "v": "AAAAAAAAAAA="}',
            "a tensor larger than its bytes": magic + b'{"$newt": "tensor", "dtype": "float32", "shape": [1000000], "v": ""}',
        }
        for what, data in planted.items():
            box = ["kept"]
            it = extra(box)
            plant(it, data)
            try:
                it.read()
                check("no_code", False, f"{what}: read back as {box[0]!r}")
            except newt.Error as e:
                check("no_code", "'x'" in str(e) and "refused" in str(e) and box[0] == "kept",
                      f"{what}: {e} (the value is now {box[0]!r})")
            check("no_code", not os.path.exists(mark), f"{what}: the planted command ran")


def old_pickle():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    old = {"groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups], "state": [{}],
           "sched": sched.state_dict()}
    box = [None]
    it = extra(box)
    plant(it, pickle.dumps(old, protocol=4))  # as the previous release wrote it
    it.read()
    check("old_pickle", same(old, box[0]), f"{old!r} came back as {box[0]!r}")


def not_plain():
    box = [Evil("/nonexistent")]
    it = extra(box)
    try:
        it.write()
        check("not_plain", False, "an object was written")
    except newt.UsageError as e:
        check("not_plain", "'x'" in str(e) and "not plain data" in str(e), str(e))


if __name__ == "__main__":
    cases = {"round_trip": round_trip, "no_code": no_code, "old_pickle": old_pickle, "not_plain": not_plain}
    for name in sys.argv[1:] or cases:
        try:
            cases[name]()
        except Exception as e:  # noqa: BLE001 (a case that raises is a failure, said)
            failures.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        if name not in failures:
            print(f"ok {name}", flush=True)
    ran = len(sys.argv[1:] or cases)
    failed = len(set(failures))
    print(f"{ran - failed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)
