"""The Python package's own tests (ctest python_*): misuse raises newt.UsageError naming what
is wrong (misuse.py, each mode a real `newt run` job), Ctrl-C leaves gracefully, the
optimizer's state allocated ahead is what a first step finds, the NumPy example trains
through a kill to the loss of one worker, an installed package finds its installed library,
and newt.torch's DistributedDataParallel keeps BatchNorm's buffers equal, reduces exactly
what the global batch's mean asks (accumulated with no_sync), and trains autocast bf16
through a kill, and a Work dropped while its collective is in flight crashes nothing
(dropped_work.py). Run: NEWT_BIN=build/newt PYTHONPATH=build/python python3 tests/python/test_python.py [CASE]

Environment: NEWT_BIN (the newt binary), NEWT_SOURCE_DIR (the repository), PYTHONPATH (the
package). Prints "ok CASE" per case; exits 1 when any failed."""

import json
import os
import subprocess
import sys
import tempfile

from harness import HERE, NEWT, SRC, check, failures


def newt_run(tmp, tag, nproc, steps, script, args=(), extra=(), gb=8):
    """A `newt run` of a Python script; (exit status, its output, its logs dir, its summary or None)."""
    logs, summary = os.path.join(tmp, tag), os.path.join(tmp, tag + ".json")
    cmd = [NEWT, "run", "--job", "py-" + tag.replace("_", "-"), "--nproc", str(nproc), "--steps", str(steps),
           "--global-batch", str(gb), "--micro-batch", "2", "--log-dir", logs, "--summary", summary,
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


def check_one_kill(name, one, killed, steps, gb, tol):
    """A run through one kill against one worker's run of the same job: both exit 0, every
    step and every sample once, one recovery (a crash) that lost no step, the final loss
    within tol (relative) of one worker's. one, killed: (rc, output, summary)."""
    (rc1, out1, ref), (rc, out, s) = one, killed
    if not check(rc1 == 0 and rc == 0 and ref and s, f"{name}: newt run exited {rc1} / {rc}:\n{out1}\n{out}"):
        return
    check(s["steps"] == steps and s["samples_consumed"] == steps * gb and "samples_repeated" not in s,
          f"{name}: {s['steps']} steps, {s['samples_consumed']} samples, {s.get('samples_repeated')} repeated")
    causes = [r["cause"] for r in s["recoveries"]]
    check(causes == ["crash"] and s["recoveries"][0]["steps_lost"] == 0, f"{name}: recoveries {s['recoveries']}")
    a, b = s["final_loss"], ref["final_loss"]
    check(abs(a - b) <= tol * abs(b), f"{name}: final loss {a!r}, one worker's {b!r}")
    print(f"ok {name} (final loss {a:.9g}, one worker {b:.9g})", flush=True)


def test_numpy(tmp):
    """The NumPy example through a kill: every step, every sample, the loss of one worker."""
    script = os.path.join(SRC, "examples", "numpy", "train.py")
    rc1, out1, _, ref = newt_run(tmp, "np_ref", 1, 120, script)
    rc, out, _, s = newt_run(tmp, "np_kill", 4, 120, script, extra=["--chaos", "kill:worker:1@step=10"])
    check_one_kill("numpy", (rc1, out1, ref), (rc, out, s), 120, 8, 1e-5)


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


def test_join_unreachable(tmp):
    """newt.join with etcd on a closed loopback port gives up after its wait (spec_wait_s),
    raising newt.Error that names etcd's address. The subprocess's timeout is a failsafe only."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    code = ("import newt\n"
            "try:\n"
            f"    newt.join(etcd='http://127.0.0.1:{port}', job='py-wait', spec_wait_s=1)\n"
            "except newt.Error as e:\n"
            "    print('raised', type(e).__name__, e, flush=True)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEWT_")}
    env["NEWT_TERMINATION_LOG"] = os.path.join(tmp, "join.end")
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
        out = p.stdout
    except subprocess.TimeoutExpired as e:
        out = f"still waiting at the failsafe: {e.stdout}"
    check("raised" in out and f"127.0.0.1:{port}" in out, f"join_unreachable: {out[-1500:]}")
    print("ok join_unreachable", flush=True)


def ddp_digests(logs, n):
    """Each rank's fingerprint of its BatchNorm buffers at the end (ddp.py's last line)."""
    out = {}
    for i in range(n):
        path = os.path.join(logs, f"w{i}.log")
        if not os.path.exists(path):
            continue
        for line in log_of(logs, f"w{i}").splitlines():
            if line.startswith("ddp.py: rank ") and " buffers " in line:
                out[f"w{i}"] = line.split(" buffers ")[1].split()[0]
    return out


def test_ddp_buffers(tmp):
    """examples/torch/ddp.py on 3 ranks: BatchNorm's buffers bitwise equal on every rank at the
    end (broadcast_buffers); without it each rank's drift apart and newt's check of the
    replicas fails the job, naming them."""
    script = os.path.join(SRC, "examples", "torch", "ddp.py")
    rc, out, logs, s = newt_run(tmp, "ddp_bn", 3, 20, script)
    digests = ddp_digests(logs, 3)
    check(rc == 0 and s and s["done"], f"ddp buffers: newt run exited {rc}:\n{out}")
    check(len(digests) == 3 and len(set(digests.values())) == 1, f"ddp buffers: the ranks' buffers differ: {digests}")
    rc, out, logs, s = newt_run(tmp, "ddp_bn_off", 3, 20, script, ["--no-broadcast-buffers"])
    check(rc == 4 and s and s["outcome"] == "failed" and "running_mean" in s.get("failed", ""),
          f"ddp buffers off: newt run exited {rc}, not the job failing on BatchNorm's buffers:\n{out}")
    print("ok ddp_buffers", flush=True)


def test_ddp_no_sync(tmp):
    """Accumulation with no_sync() gives the gradients of the global batch's mean, on ranks of
    unequal shares (ddp_units.py checks it at every step)."""
    rc, out, logs, s = newt_run(tmp, "ddp_units", 3, 6, os.path.join(HERE, "ddp_units.py"))
    text = "".join(log_of(logs, f"w{i}") for i in range(3))
    check(rc == 0 and s and s["done"], f"ddp no_sync: newt run exited {rc}:\n{out}")
    check("FAIL" not in text and text.count("ok step ") == 18, f"ddp no_sync: {text[-3000:]}")
    check("2 micro-batches" in text and "1 micro-batches" in text, "ddp no_sync: no rank accumulated")
    print("ok ddp_no_sync", flush=True)


def test_ddp_autocast(tmp):
    """examples/torch/ddp.py with autocast bf16 through a kill: every step, every sample, no
    step lost, near the loss of one worker. A global batch of 24 in micro-batches of 2 splits
    into the same micro-batches on 4, 3 or 1 ranks (BatchNorm normalises each over the same
    samples), so the world size changes only the order the gradients are summed in: in fp32
    that moves the final loss by 1.3e-7 (relative) here, but bf16 keeps 8 bits of mantissa,
    and weights that differ in their last fp32 bits round some activations the other way
    (1.3e-3 here): within 5e-3."""
    script = os.path.join(SRC, "examples", "torch", "ddp.py")
    rc1, out1, _, ref = newt_run(tmp, "ddp_bf16_ref", 1, 60, script, ["--autocast", "bf16"], gb=24)
    rc, out, _, s = newt_run(tmp, "ddp_bf16", 4, 60, script, ["--autocast", "bf16"],
                             extra=["--chaos", "kill:worker:1@step=10"], gb=24)
    check_one_kill("ddp_autocast", (rc1, out1, ref), (rc, out, s), 60, 24, 5e-3)


def test_ddp_zero1(tmp):
    """examples/torch/ddp.py --zero1: AdamW's state sharded over the ranks (ZeRO stage 1), each
    rank's about a third of one worker's on 3 ranks, the same loss as without it."""
    script = os.path.join(SRC, "examples", "torch", "ddp.py")
    rc1, out1, logs1, ref = newt_run(tmp, "zero1_ref", 1, 20, script, ["--zero1"], gb=24)
    rc, out, logs, s = newt_run(tmp, "zero1", 3, 20, script, ["--zero1"], gb=24)
    rc0, out0, _, plain = newt_run(tmp, "zero1_plain", 3, 20, script, gb=24)

    def opt_bytes(logs_dir, n):
        out = []
        for i in range(n):
            for line in log_of(logs_dir, f"w{i}").splitlines():
                if line.startswith("ddp.py: rank ") and " optimizer state " in line:
                    out.append(int(line.split(" optimizer state ")[1].split()[0]))
        return out
    if not check(rc1 == 0 and rc == 0 and rc0 == 0 and ref and s and plain,
                 f"zero1: newt run exited {rc1} / {rc} / {rc0}:\n{out1}\n{out}\n{out0}"):
        return
    whole, shards = opt_bytes(logs1, 1), opt_bytes(logs, 3)
    check(len(whole) == 1 and len(shards) == 3, f"zero1: the ranks did not say their optimizer state: {whole} {shards}")
    if whole and len(shards) == 3:
        # a third of the moments each (the step counter, one scalar, on every rank)
        check(all(b <= whole[0] / 3 + 64 for b in shards) and sum(shards) <= whole[0] + 3 * 64,
              f"zero1: optimizer state per rank {shards} bytes, one worker's {whole[0]}")
    a, b, c = s["final_loss"], ref["final_loss"], plain["final_loss"]
    check(abs(a - b) <= 1e-5 * abs(b) and abs(a - c) <= 1e-5 * abs(c),
          f"zero1: final loss {a!r}, one worker's {b!r}, unsharded {c!r}")
    print(f"ok ddp_zero1 (optimizer state per rank {shards} bytes, one worker {whole})", flush=True)


CASES = {"misuse": test_misuse, "sigint": test_sigint, "init_optimizer_state": test_init_optimizer_state,
         "numpy": test_numpy, "import_errors": test_import_errors, "ddp_buffers": test_ddp_buffers,
         "ddp_no_sync": test_ddp_no_sync, "ddp_autocast": test_ddp_autocast, "ddp_zero1": test_ddp_zero1,
         "dropped_work": test_dropped_work, "join_unreachable": test_join_unreachable}


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
