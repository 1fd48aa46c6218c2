"""The restart mode (newt run --restart, docs/elastic.md "Scripts that do not link newt") with
an unmodified torch DDP script, examples/torch/torchrun_ddp.py (ctest restart_*):

  restart_faults  through a kill, a join, a preemption (SIGTERM), a stopped supervisor (a hung
                  node), a stopped script (SIGSTOP of the program itself) and a script that
                  makes no progress (no I/O, no heartbeat), the job ends done at the script's
                  last step with the final loss of an uninterrupted run (resumed from the same
                  checkpoints; to float64's rounding of sums taken over other world sizes),
                  every restart counted (TORCHELASTIC_RESTART_COUNT, the summary), the world of
                  each generation the one the fault leaves
  restart_env     the variables the script gets under newt are those torchrun 1.13 gives it for
                  the same layout (2 workers on one host): names, and values where they must match
  restart_exit    a script that exits non-zero every time is restarted until the failure
                  budget is spent, and the job fails saying so

Every fault waits for its event: the script's gate file holds every rank before a given step
while the restart count is a given one (the step line is in the step log, the fault is
injected, the restart lets it pass), so no step count depends on time.

Run: NEWT_BIN=build/newt NEWT_PYTHON=/usr/bin/python3 python3 tests/python/test_restart.py [CASE]"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from harness import NEWT, SRC, check, failures

PY = os.environ.get("NEWT_PYTHON", "/usr/bin/python3")
SCRIPT = os.path.join(SRC, "examples", "torch", "torchrun_ddp.py")


def run_cmd(tmp, tag, nproc, script_args, extra=()):
    logs, summary = os.path.join(tmp, tag), os.path.join(tmp, tag + ".json")
    cmd = [NEWT, "run", "--restart", "--job", "rs-" + tag, "--nproc", str(nproc), "--log-dir", logs, "--summary",
           summary, "--timeout-ms", "400000", *extra, "--", PY, SCRIPT, *script_args]
    return cmd, logs, summary


def finish(p, summary, timeout=420):
    out, _ = p.communicate(timeout=timeout)
    s = None
    if os.path.exists(summary):
        with open(summary) as f:
            s = json.load(f)
    return p.returncode, out, s


def step_lines(logs):
    path = os.path.join(logs, "steps.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def wait_step(logs, p, step, restarts):
    """Waits for the script's line of step `step` in the run of `restarts` restarts (the gate holds it there)."""
    while p.poll() is None:
        if any(s["step"] == step and s.get("restarts", 0) == restarts for s in step_lines(logs)):
            return True
        time.sleep(0.02)  # polling a file for the event, not a duration the test depends on
    return False


def proc_stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[1])  # state, ppid


def supervisor_pid(job, worker):
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and b"--restart" in argv and job.encode() in argv and worker.encode() in argv:
            return int(d)
    return None


def child_of(pid):
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if proc_stat(d)[1] == pid:
                    return int(d)
            except (OSError, ValueError):
                pass
    return None


def test_faults(tmp):
    steps, args = 60, ["--steps", "60", "--ckpt-every", "5"]
    # the uninterrupted run
    cmd, logs, summary = run_cmd(tmp, "ref", 2, args + ["--ckpt-dir", os.path.join(tmp, "ck-ref")])
    rc, out, ref = finish(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), summary)
    if not check(rc == 0 and ref and ref["done"] and ref["steps"] == steps, f"faults: the reference run: {rc}\n{out}"):
        return
    check(ref["restart"]["restarts"] == 0 and ref["samples_consumed"] == 0, f"faults: reference {ref}")
    # the faults, each at a step the gate holds (step, restart count before it)
    gate = os.path.join(tmp, "gate")
    held = [(12, 0), (24, 1), (36, 2), (48, 3), (52, 4)]
    with open(gate, "w") as f:
        f.writelines(f"{s} {r}\n" for s, r in held)
    chaos = "kill:worker:1@step=12,join:1@step=24,term:worker:0@step=36,stop:worker:2@step=48"
    cmd, logs, summary = run_cmd(tmp, "faults", 3, args + ["--ckpt-dir", os.path.join(tmp, "ck-faults"), "--gate", gate,
                                                           "--sleep-at", "56", "5"],
                                 ["--chaos", chaos, "--hang-timeout-ms", "2000"])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # the script itself stopped (SIGSTOP of the program, not of its supervisor): w3, the joiner,
    # is the one left with w2 stopped and w0 gone
    if wait_step(logs, p, 52, 4):
        sup = supervisor_pid("rs-faults", "w3")
        child = child_of(sup) if sup else None
        if check(child, f"faults: no program of w3 (supervisor {sup})"):
            os.kill(child, signal.SIGSTOP)
    rc, out, s = finish(p, summary)
    if not check(rc == 0 and s and s["done"], f"faults: newt run exited {rc}:\n{out[-6000:]}"):
        return
    check(s["steps"] == steps, f"faults: {s['steps']} steps")
    check(s["restart"]["restarts"] == 6, f"faults: {s['restart']} (expected 6 restarts)\n{out[-4000:]}")
    check(s["restart"]["steps_redone"] > 0, f"faults: no step redone: {s['restart']}")
    check(abs(s["final_loss"] - ref["final_loss"]) <= 1e-9 * abs(ref["final_loss"]),
          f"faults: final loss {s['final_loss']!r}, uninterrupted {ref['final_loss']!r}")
    causes = [r["cause"] for r in s["recoveries"]]
    check(causes == ["crash", "join", "leave", "hang"], f"faults: recoveries {causes}")
    worlds = []
    for line in step_lines(logs):
        key = (line.get("restarts", 0), line["world"])
        if not worlds or worlds[-1] != key:
            worlds.append(key)
    check([w for _, w in worlds] == [3, 2, 3, 2, 1, 1, 1] and [r for r, _ in worlds] == list(range(7)),
          f"faults: (restarts, world) of the step lines {worlds}")
    print(f"ok faults (final loss {s['final_loss']!r}, uninterrupted {ref['final_loss']!r}, "
          f"{s['restart']['steps_redone']} steps redone)", flush=True)


def dump_env(tmp, tag, cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    envs = {}
    d = os.path.join(tmp, tag)
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        with open(os.path.join(d, name)) as f:
            e = json.load(f)
        envs[int(e["RANK"])] = e
    return p.returncode, p.stdout, envs


def test_env(tmp):
    args = ["--ckpt-dir", os.path.join(tmp, "ck-env")]
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    torchrun = [PY, "-m", "torch.distributed.run", "--redirects", "2", "--tee", "2", "--standalone",
                "--nproc_per_node", "2", "--max_restarts", "3", SCRIPT, *args, "--dump-env", os.path.join(tmp, "torchrun")]
    rc, out, theirs = dump_env(tmp, "torchrun", torchrun)
    if not check(rc == 0 and len(theirs) == 2, f"env: torchrun exited {rc}:\n{out[-4000:]}"):
        return
    cmd, logs, summary = run_cmd(tmp, "env", 2, args + ["--dump-env", os.path.join(tmp, "newt")], ["--max-failures", "3"])
    rc, out, ours = dump_env(tmp, "newt", cmd)
    if not check(rc == 0 and len(ours) == 2, f"env: newt run exited {rc}:\n{out[-4000:]}"):
        return
    same = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_USE_AGENT_STORE", "NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS"]
    present = ["MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"]  # theirs and ours differ by design
    for rank in (0, 1):
        t, o = theirs[rank], ours[rank]
        for k in same:
            check(t.get(k) is not None and t.get(k) == o.get(k), f"env: rank {rank} {k}: torchrun {t.get(k)!r}, newt {o.get(k)!r}")
        for k in present:
            check(t.get(k) and o.get(k), f"env: rank {rank} {k}: torchrun {t.get(k)!r}, newt {o.get(k)!r}")
    check(ours[0]["MASTER_PORT"] == ours[1]["MASTER_PORT"] and ours[0]["TORCHELASTIC_RUN_ID"] == "rs-env",
          f"env: newt's {ours}")
    if not failures:
        print("ok env", flush=True)


def test_exit(tmp):
    bad = os.path.join(tmp, "bad.py")
    with open(bad, "w") as f:
        f.write("import os, sys\nprint('NEWT_STEP 1 loss 1.0', flush=True)\nsys.exit(3)\n")
    logs, summary = os.path.join(tmp, "exit"), os.path.join(tmp, "exit.json")
    cmd = [NEWT, "run", "--restart", "--job", "rs-exit", "--nproc", "2", "--log-dir", logs, "--summary", summary,
           "--max-failures", "2", "--timeout-ms", "200000", "--", PY, bad]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    s = json.load(open(summary)) if os.path.exists(summary) else None
    check(p.returncode != 0 and s and not s["done"] and s["outcome"] == "failed",
          f"exit: newt run exited {p.returncode}, {s and s['outcome']}:\n{p.stdout[-4000:]}")
    # the first run's failure and the next two restart it; the third spends the budget of 2
    check(s and s["restart"]["restarts"] == 2, f"exit: {s and s.get('restart')} (expected 2 restarts)")
    check(s and "spec.fault.max_failures 2" in s.get("failed", ""), f"exit: failed {s and s.get('failed')!r}")
    if not failures:
        print("ok exit", flush=True)


CASES = {"faults": test_faults, "env": test_env, "exit": test_exit}

if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    failed = 0
    keep = os.environ.get("NEWT_KEEP_DIR")  # keeps the runs' files there, for a look after a failure
    with (contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory(prefix="newt-restart-")) as tmp:
        for n in names:
            before = len(failures)
            CASES[n](tmp)
            failed += len(failures) > before
    print(f"{len(names) - failed} passed, {failed} failed", flush=True)
    sys.exit(1 if failures else 0)
