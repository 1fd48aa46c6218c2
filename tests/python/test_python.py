"""The Python package's own tests (ctest python_*): misuse raises newt.UsageError naming what
is wrong (misuse.py, each mode a real `newt run` job), Ctrl-C leaves gracefully, the
optimizer's state allocated ahead is what a first step finds, the NumPy example trains
through a kill to the loss of one worker, an installed package finds its installed library,
and a Work dropped while its collective is in flight crashes nothing (dropped_work.py). Run: NEWT_BIN=build/newt PYTHONPATH=build/python python3 tests/python/test_python.py [CASE]

Environment: NEWT_BIN (the newt binary), NEWT_SOURCE_DIR (the repository), PYTHONPATH (the
package). Prints "ok CASE" per case; exits 1 when any failed."""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("NEWT_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
NEWT = os.environ.get("NEWT_BIN", os.path.join(SRC, "build", "newt"))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}", flush=True)
    return cond


def newt_run(tmp, tag, nproc, steps, script, args=(), extra=()):
    """A `newt run` of a Python script; (exit status, its output, its logs dir, its summary or None)."""
    logs, summary = os.path.join(tmp, tag), os.path.join(tmp, tag + ".json")
    cmd = [NEWT, "run", "--job", "py-" + tag.replace("_", "-"), "--nproc", str(nproc), "--steps", str(steps),
           "--global-batch", "8", "--micro-batch", "2", "--log-dir", logs, "--summary", summary,
           "--timeout-ms", "120000", *extra, "--", sys.executable, script, *args]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    s = None
    if os.path.exists(summary):
        with open(summary) as f:
            s = json.load(f)
    return p.returncode, p.stdout, logs, s


def log_of(logs, worker):
    with open(os.path.join(logs, worker + ".log"), errors="replace") as f:
        return f.read()


MISUSE_CASES = {
    "declare": ["not_contiguous", "dtype_torch", "dtype_numpy", "read_only", "no_optimizer_state", "not_state",
                "long_name", "newt_name", "sparse", "twice", "late", "end_first", "allgather_size", "op",
                "commit_twice"],
    "freed": ["freed"], "replaced": ["replaced"], "not_ended": ["not_ended"], "capacity": ["capacity"],
}


def test_misuse(tmp):
    script = os.path.join(HERE, "misuse.py")
    for mode, cases in MISUSE_CASES.items():
        rc, out, logs, s = newt_run(tmp, "misuse_" + mode, 1, 6, script, [mode])
        text = log_of(logs, "w0")
        for c in cases:
            check(f"ok {c}:" in text, f"misuse {mode}: case {c} (w0.log:\n{text[-3000:]})")
        check("FAIL " not in text, f"misuse {mode}: a case failed (w0.log:\n{text[-3000:]})")
        check(f"misuse {mode}: done" in text, f"misuse {mode}: the script did not reach its end")
        if mode == "declare":  # the misuses were refused and the job trained on to its end
            check(rc == 0 and s and s["done"], f"misuse declare: newt run exited {rc}:\n{out}")
        else:  # the program stopped at the misuse: an error another try will not mend
            check(rc != 0 and "w0 exited (exit 2)" in out, f"misuse {mode}: newt run exited {rc}:\n{out}")
    print("ok misuse", flush=True)


def test_sigint(tmp):
    rc, out, logs, s = newt_run(tmp, "sigint", 2, 12, os.path.join(HERE, "misuse.py"), ["sigint"])
    text = log_of(logs, "w1")
    check("ok sigint: outcome left" in text, f"sigint: w1 did not leave gracefully (w1.log:\n{text[-3000:]})")
    check("KeyboardInterrupt" not in text, "sigint: a KeyboardInterrupt reached the script")
    check(rc == 0 and s and s["done"] and s["steps"] == 12, f"sigint: the job did not end done: {rc}\n{out}")
    causes = [r["cause"] for r in (s or {}).get("recoveries", [])]
    check(causes == ["leave"], f"sigint: recoveries {causes}, expected one leave")
    print("ok sigint", flush=True)


def test_init_optimizer_state(_tmp):
    """A step after init_optimizer_state is bitwise the first step of a fresh optimizer."""
    import torch
    import newt
    for make in (lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1), lambda p: torch.optim.Adam(p, lr=1e-2),
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), lambda p: torch.optim.RMSprop(p, lr=1e-2)):
        torch.manual_seed(3)
        a = torch.nn.Linear(5, 3)
        b = torch.nn.Linear(5, 3)
        b.load_state_dict(a.state_dict())
        oa, ob = make(a.parameters()), make(b.parameters())
        newt.init_optimizer_state(ob)
        check(all(ob.state[p] for p in b.parameters()), f"init_optimizer_state {type(ob).__name__}: no state")
        check(all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters())),
              f"init_optimizer_state {type(ob).__name__}: the parameters changed")
        x = torch.randn(7, 5)
        for m, o in ((a, oa), (b, ob)):
            m(x).square().sum().backward()
            o.step()
        check(all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters())),
              f"init_optimizer_state {type(ob).__name__}: the first step differs from a fresh optimizer's")
    print("ok init_optimizer_state", flush=True)


def test_numpy(tmp):
    """The NumPy example through a kill: every step, every sample, the loss of one worker."""
    script = os.path.join(SRC, "examples", "numpy", "train.py")
    rc1, out1, _, ref = newt_run(tmp, "np_ref", 1, 120, script)
    rc, out, _, s = newt_run(tmp, "np_kill", 4, 120, script, extra=["--chaos", "kill:worker:1@step=10"])
    if not check(rc1 == 0 and rc == 0 and ref and s, f"numpy: newt run exited {rc1} / {rc}:\n{out1}\n{out}"):
        return
    check(s["steps"] == 120 and s["samples_consumed"] == 120 * 8, f"numpy: {s['steps']} steps, "
          f"{s['samples_consumed']} samples")
    causes = [r["cause"] for r in s["recoveries"]]
    check(causes == ["crash"] and s["recoveries"][0]["steps_lost"] == 0, f"numpy: recoveries {s['recoveries']}")
    a, b = s["final_loss"], ref["final_loss"]
    check(abs(a - b) <= 1e-5 * abs(b), f"numpy: final loss {a!r}, one worker's {b!r}")
    print(f"ok numpy (final loss {a:.9g}, one worker {b:.9g})", flush=True)


def test_dropped_work(tmp):
    """A Work dropped without wait() while its collective is in flight (dropped_work.py): no
    crash, no recovery, the job trains to its end."""
    rc, out, logs, s = newt_run(tmp, "dropped", 2, 4, os.path.join(HERE, "dropped_work.py"), [tmp])
    texts = [log_of(logs, w) for w in ("w0", "w1")]
    went_on = sum("dropped_work: rank" in t and "went on" in t for t in texts)
    check(rc == 0 and s and s["done"] and s["steps"] == 4, f"dropped work: newt run exited {rc}:\n{out}")
    check(s is not None and not s.get("recoveries"), f"dropped work: recoveries {(s or {}).get('recoveries')} "
          f"(a worker crashed?):\n{out}")
    check(went_on == 2, f"dropped work: {went_on} of 2 ranks went on past the dropped Work:\n{texts[0][-2000:]}\n"
          f"{texts[1][-2000:]}")
    print("ok dropped_work", flush=True)


def test_import_errors(tmp):
    """A package that cannot find libnewt says where it looked; one of another major refuses."""
    env = dict(os.environ, NEWT_LIBRARY=os.path.join(tmp, "no-such-libnewt.so.0"))
    p = subprocess.run([sys.executable, "-c", "import newt"], env=env, stderr=subprocess.PIPE, text=True)
    check(p.returncode != 0 and "libnewt.so not found" in p.stderr and "no-such-libnewt" in p.stderr,
          f"import errors: {p.stderr[-500:]}")
    print("ok import_errors", flush=True)


CASES = {"misuse": test_misuse, "sigint": test_sigint, "init_optimizer_state": test_init_optimizer_state,
         "numpy": test_numpy, "import_errors": test_import_errors, "dropped_work": test_dropped_work}


def main():
    names = sys.argv[1:] or list(CASES)
    with tempfile.TemporaryDirectory(prefix="newt-py-") as tmp:
        for n in names:
            CASES[n](tmp)
    if failures:
        print(f"{len(failures)} failed", flush=True)
        sys.exit(1)
    print("all passed", flush=True)


if __name__ == "__main__":
    main()
