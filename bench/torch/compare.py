"""newt beside torch's own tools on one PyTorch program: examples/torch/train.py as newt
workers, and the same training (bench/torch/ddp_train.py) under torchrun with gloo and DDP.

    /usr/bin/python3 bench/torch/compare.py [throughput|recovery|all] [flags]

throughput: runs the example under `newt run --nproc 2` (its gradients reduced by
job.reduce_gradients, and again with --ddp: torch's DistributedDataParallel over newt,
newt.torch) and ddp_train.py under torchrun --nproc_per_node 2, alternately for --rounds rounds,
with the same steps, global batch G and micro-batch M. Each run's figure is the median over windows of --window steps, from step
--warmup on, of the window's tokens (G seq a step) over its wall time, from the step log's wall
times (windows, not single steps: newt's step log has whole milliseconds, a step tens of
them); the line has the median over the rounds (each round's in newt_rounds and ddp_rounds;
load_before: the 1-minute load average at the start, for telling a busy machine's figures
apart; the final losses agree to about 1e-7, the two trainings being the same):
  {"bench":"torch_throughput","newt_tokens_per_s":..,"newt_ddp_tokens_per_s":..,"ddp_tokens_per_s":..,
   "ratio":newt/ddp,"ratio_ddp":newt_ddp/ddp,"ddp_over_reduce_gradients":newt_ddp/newt,...}
recovery: `newt bench recovery --fault kill` of the example (--runs runs, a worker SIGKILLed at
step --kill-at; its median line; again with --ddp), and --runs torchrun jobs of ddp_train.py (--max_restarts 3,
a checkpoint every --ckpt-every steps) in each of which rank 1 is SIGKILLed once the step log
reaches step --kill-at: the time from the kill to the first step the restarted workers complete,
and the steps done before the restart that the restart did again (rank 0's steps completed
before its restart, less the checkpoint's step). Medians:
  {"bench":"torch_recovery","newt_recovery_ms":..,"newt_steps_lost":..,"newt_ddp_recovery_ms":..,
   "newt_ddp_steps_lost":..,"torchrun_recovery_ms":..,"torchrun_steps_redone":..,"ratio":newt/torchrun,
   "ratio_ddp":newt_ddp/torchrun,"torchrun_failed_runs":..,...}
A torchrun run that torchrun itself ends with an error before the restarted job is over (torch
1.13's c10d store fails now and then on a loaded machine) is said on stderr, counted in
torchrun_failed_runs and run again, up to --torchrun-retries times.

Every run gets OMP_NUM_THREADS=1, as torchrun sets it for its workers by itself: newt run does
not, and without it Debian's OpenBLAS runs a thread pool of its own besides torch's one thread,
which makes the example's steps under newt up to twice as long on 2 cores.

Both print one JSON line each on stdout (each run's figures go to stderr) and exit 0; a run that
fails, or outlasts --timeout-s, ends the script with exit status 1 and a message naming the run
and the tail of its log. Every process it started is killed and its temporary directory removed
on the way out (--keep keeps the directory). The environment: NEWT_BIN (default build/newt of
this tree), NEWT_PYTHON (the Python with torch: default /usr/bin/python3), PYTHONPATH (default
build/python of this tree, for the newt package).
"""

import argparse
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "torch", "train.py")
DDP_TRAIN = os.path.join(HERE, "ddp_train.py")


class Fail(Exception):
    pass


class TorchrunFailed(Fail):
    """torchrun itself ended with an error before the run was over (its own rendezvous or
    store failing under load, as torch 1.13's c10d store does now and then): the peer's
    failure, not a measurement."""


# --- processes ------------------------------------------------------------------------------------

live = []  # the Popen of each process group still running


def spawn(cmd, log_path, env, out_path=None):
    """Starts cmd in a process group of its own (so that it and its children can be killed
    together), its stderr to log_path, its stdout to out_path (None: log_path too)."""
    with open(log_path, "ab") as log, open(out_path or os.devnull, "wb") as out:
        p = subprocess.Popen(cmd, stdout=out if out_path else log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                             start_new_session=True)
    live.append(p)
    return p


def kill_group(p):
    """SIGTERM to p's group, then SIGKILL to what is left of it once p ended or after 5 s
    (newt run stops its workers, etcd and coordinators on SIGTERM; torchrun's workers share
    its group)."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            break
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:  # the leader ended: its group may still hold children
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        break
    if p in live:
        live.remove(p)


def kill_all():
    for p in list(live):
        kill_group(p)


def tail(path, lines=25):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)\n"


def logs(paths):
    """The ends of the logs at paths, each under its name."""
    return "".join(f"--- the end of {q}:\n{tail(q)}" for q in paths if os.path.exists(q))


def wait(p, what, log_paths, timeout_s, failed=Fail):
    """Waits for p to end within timeout_s; Fail (with the ends of log_paths) when it did not,
    failed (a Fail) when it exited non-zero."""
    try:
        rc = p.wait(timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(p)
        raise Fail(f"{what}: not done after {timeout_s:.0f} s\n{logs(log_paths)}")
    kill_group(p)  # whatever it left in its group
    if rc != 0:
        raise failed(f"{what}: exit status {rc}\n{logs(log_paths)}")


def run(cmd, what, log_paths, env, timeout_s):
    wait(spawn(cmd, log_paths[0], env), what, log_paths, timeout_s)


# --- step logs ------------------------------------------------------------------------------------


def read_jsonl(path):
    """The JSON lines of path (a last line being written is skipped)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):
                    out.append(json.loads(line))
    except FileNotFoundError:
        pass
    return out


def median_tokens_per_s(times, warmup, window, tokens_per_step, what):
    """times: {step: wall time in s}, steps 1..last. The median over the whole windows of
    `window` steps from step warmup on (steps warmup..warmup+window-1, ...; one window
    warmup..last when none fits) of their tokens over their time, t[b] - t[a - 1]."""
    last = max(times)
    spans = [(a, a + window - 1) for a in range(warmup, last - window + 2, window)] or [(warmup, last)]
    rates = [tokens_per_step * (b - a + 1) / (times[b] - times[a - 1]) for a, b in spans if times[b] > times[a - 1]]
    if not rates:
        raise Fail(f"{what}: no step from {warmup} on in its step log")
    return statistics.median(rates)


# --- the runs -------------------------------------------------------------------------------------


def torchrun(o, work, extra, ddp_args):
    return [o.python, "-m", "torch.distributed.run", "--standalone", "--redirects", "2", "--tee", "2",
            "--nproc_per_node", str(o.nproc), "--log_dir", os.path.join(work, "torchrun-logs"), *extra,
            DDP_TRAIN, "--global-batch", str(o.global_batch), "--micro-batch", str(o.micro_batch),
            "--seq", str(o.seq), *ddp_args]


def newt_throughput(o, work, env, k, ddp=False):
    """The example under newt: its gradients reduced by job.reduce_gradients, or (ddp) by torch's
    DDP over newt (newt.torch), each bucket as backward fills it."""
    tag = f"newt{'-ddp' if ddp else ''}-{k}"
    d = os.path.join(work, tag)
    cmd = [o.newt, "run", "--quiet", "--nproc", str(o.nproc), "--steps", str(o.steps), "--global-batch",
           str(o.global_batch), "--micro-batch", str(o.micro_batch), "--log-dir", d, "--summary", d + ".json",
           "--timeout-ms", str(int(o.timeout_s * 1000)), "--", o.python, EXAMPLE, "--seq", str(o.seq),
           *(["--ddp"] if ddp else [])]
    os.makedirs(d)
    what = f"newt run{' --ddp' if ddp else ''} (round {k})"
    run(cmd, what, [d + ".log", os.path.join(d, "w0.log"), os.path.join(d, "w1.log")], env, o.timeout_s + 30)
    ev = read_jsonl(os.path.join(d, "steps.jsonl"))
    times = {e["step"]: e["t_ms"] / 1000.0 for e in ev}
    if set(times) != set(range(1, o.steps + 1)):
        raise Fail(f"{what}: steps {sorted(times)[:3]}.. in its step log, 1..{o.steps} expected")
    return median_tokens_per_s(times, o.warmup, o.window, o.global_batch * o.seq, what), ev[-1]["loss"]


def ddp_throughput(o, work, env, k):
    log = os.path.join(work, f"ddp-{k}.jsonl")
    cmd = torchrun(o, work, [], ["--steps", str(o.steps), "--step-log", log])
    run(cmd, f"torchrun ddp_train.py (round {k})", [os.path.join(work, f"ddp-{k}.log")], env, o.timeout_s)
    ev = [e for e in read_jsonl(log) if e["event"] == "step"]
    times = {e["step"]: e["t"] for e in ev}
    if set(times) != set(range(1, o.steps + 1)):
        raise Fail(f"torchrun ddp_train.py (round {k}): steps {sorted(times)[:3]}.. in its step log, 1..{o.steps} "
                   "expected")
    return median_tokens_per_s(times, o.warmup, o.window, o.global_batch * o.seq,
                               f"torchrun ddp_train.py (round {k})"), \
        ev[-1]["loss"]


def throughput(o, work, env):
    """Alternating rounds of the three: newt with job.reduce_gradients, newt with torch's DDP
    over newt (newt.torch), torch's DDP over gloo under torchrun."""
    load = os.getloadavg()[0]
    newt, newt_ddp, ddp = [], [], []
    for k in range(o.rounds):
        n, n_loss = newt_throughput(o, work, env, k)
        w, w_loss = newt_throughput(o, work, env, k, ddp=True)
        d, d_loss = ddp_throughput(o, work, env, k)
        newt.append(n)
        newt_ddp.append(w)
        ddp.append(d)
        print(json.dumps({"round": k, "newt_tokens_per_s": round(n), "newt_ddp_tokens_per_s": round(w),
                          "ddp_tokens_per_s": round(d), "newt_final_loss": n_loss, "newt_ddp_final_loss": w_loss,
                          "ddp_final_loss": d_loss}), file=sys.stderr)
    n, w, d = statistics.median(newt), statistics.median(newt_ddp), statistics.median(ddp)
    return {"bench": "torch_throughput", "newt_tokens_per_s": round(n), "newt_ddp_tokens_per_s": round(w),
            "ddp_tokens_per_s": round(d), "ratio": round(n / d, 3), "ratio_ddp": round(w / d, 3),
            "ddp_over_reduce_gradients": round(w / n, 3), "steps": o.steps, "warmup": o.warmup, "window": o.window,
            "global_batch": o.global_batch,
            "micro_batch": o.micro_batch, "seq": o.seq, "workers": o.nproc, "rounds": o.rounds,
            "newt_rounds": [round(x) for x in newt], "newt_ddp_rounds": [round(x) for x in newt_ddp],
            "ddp_rounds": [round(x) for x in ddp], "newt_final_loss": round(n_loss, 6),
            "newt_ddp_final_loss": round(w_loss, 6), "ddp_final_loss": round(d_loss, 6), "load_before": round(load, 2)}


def newt_recovery(o, work, env, ddp=False):
    tag = "newt-ddp-recovery" if ddp else "newt-recovery"
    log = os.path.join(work, tag + ".log")
    out = os.path.join(work, tag + ".jsonl")
    cmd = [o.newt, "bench", "recovery", "--nproc", str(o.nproc), "--steps", str(o.rec_steps), "--global-batch",
           str(o.global_batch), "--micro-batch", str(o.micro_batch), "--kill-at", str(o.kill_at), "--fault", "kill",
           "--runs", str(o.runs), "--", o.python, EXAMPLE, "--seq", str(o.seq), *(["--ddp"] if ddp else [])]
    p = spawn(cmd, log, env, out)
    wait(p, "newt bench recovery", [log, out], o.timeout_s * o.runs)  # it removes its runs' logs but a failed one's
    lines = read_jsonl(out)
    for e in lines:
        if "run" in e:
            print(json.dumps({"newt_run": e["run"], "total_ms": e["total_ms"], "steps_lost": e["steps_lost"],
                              "detect_ms": e["detect_ms"], "restore": e["restore"]}), file=sys.stderr)
    med = [e for e in lines if "median_of" in e]
    if not med or med[0]["median_of"] != o.runs:
        raise Fail(f"newt bench recovery: no median of {o.runs} runs in its output\n{logs([out, log])}")
    return med[0]["total_ms"], med[0]["steps_lost"]


def poll(path, cond, timeout_s, what, p, log_path):
    """Polls the file at path every 5 ms: cond(its JSON lines) each time it grew, until cond
    returns a true value, which poll returns; Fail after timeout_s or once p ended."""
    deadline, size = time.time() + timeout_s, -1
    while True:
        try:
            now = os.stat(path).st_size
        except FileNotFoundError:
            now = -1
        if now != size:
            size = now
            v = cond(read_jsonl(path))
            if v:
                return v
        if p.poll() is not None:
            raise TorchrunFailed(f"{what}: torchrun ended (status {p.returncode}) first\n{logs([log_path])}")
        if time.time() > deadline:
            raise Fail(f"{what}: not seen after {timeout_s:.0f} s\n{logs([log_path])}")
        time.sleep(0.005)


def torchrun_recovery(o, work, env, k):
    """One torchrun job, rank 1 SIGKILLed at step kill_at: (ms from the kill to the first step
    after the restart, steps redone)."""
    d = os.path.join(work, f"torchrun-recovery-{k}")
    os.makedirs(d)
    slog, log = os.path.join(d, "steps.jsonl"), os.path.join(d, "torchrun.log")
    what = f"torchrun recovery (run {k})"
    cmd = torchrun(o, d, ["--max_restarts", "3", "--monitor_interval", "0.1"],
                   ["--steps", str(o.rec_steps), "--step-log", slog, "--ckpt-dir", os.path.join(d, "ckpt"),
                    "--ckpt-every", str(o.ckpt_every)])
    p = spawn(cmd, log, env)

    def at_kill_step(ev):
        victim = [e["pid"] for e in ev if e["event"] == "ready" and e["rank"] == 1]
        steps = [e["step"] for e in ev if e["event"] == "step"]
        return victim[0] if victim and steps and max(steps) >= o.kill_at else None

    victim = poll(slog, at_kill_step, o.timeout_s, f"{what}: step {o.kill_at}", p, log)
    tk = time.time()
    try:
        os.kill(victim, signal.SIGKILL)
    except ProcessLookupError:
        raise Fail(f"{what}: rank 1 (pid {victim}) was gone before the kill\n{logs([log])}") from None
    wait(p, what, [log], o.timeout_s, failed=TorchrunFailed)
    ev = read_jsonl(slog)
    ready = [e for e in ev if e["event"] == "ready" and e["rank"] == 0 and e["t"] > tk]
    if not ready:
        raise Fail(f"{what}: no restart after the kill in its step log {slog}")
    restart = ready[0]
    steps = [e for e in ev if e["event"] == "step"]
    done_before = max([e["step"] for e in steps if e["t"] < restart["t"]], default=0)
    after = [e for e in steps if e["t"] > restart["t"]]
    if not after or max(e["step"] for e in after) != o.rec_steps:
        raise Fail(f"{what}: the restarted job did not reach step {o.rec_steps} (step log {slog})")
    first = min(after, key=lambda e: e["t"])
    ms, redone = round((first["t"] - tk) * 1000), done_before - restart["start"]
    print(json.dumps({"torchrun_run": k, "recovery_ms": ms, "steps_redone": redone, "resumed_from": restart["start"],
                      "last_step_before_restart": done_before, "restart_init_s": restart["init_s"]}), file=sys.stderr)
    return ms, redone


def recovery(o, work, env):
    load = os.getloadavg()[0]
    n_ms, n_lost = newt_recovery(o, work, env)
    w_ms, w_lost = newt_recovery(o, work, env, ddp=True)
    t, failed = [], []
    while len(t) < o.runs:
        k = len(t) + len(failed)
        try:
            t.append(torchrun_recovery(o, work, env, k))
        except TorchrunFailed as e:  # torchrun's own failure: said, counted, and the run tried again
            failed.append(k)
            print(f"compare.py: {e}", file=sys.stderr)
            if len(failed) > o.torchrun_retries:
                raise Fail(f"torchrun failed on its own in {len(failed)} recovery runs (runs {failed}), "
                           f"more than --torchrun-retries {o.torchrun_retries}") from None
            print(f"compare.py: torchrun recovery run {k} failed on its own; another run in its place",
                  file=sys.stderr)
    t_ms, t_redone = statistics.median(x[0] for x in t), statistics.median(x[1] for x in t)
    return {"bench": "torch_recovery", "newt_recovery_ms": n_ms, "newt_steps_lost": n_lost,
            "newt_ddp_recovery_ms": w_ms, "newt_ddp_steps_lost": w_lost,
            "torchrun_recovery_ms": round(t_ms), "torchrun_steps_redone": t_redone, "torchrun_failed_runs": len(failed),
            "ratio": round(n_ms / t_ms, 3) if t_ms > 0 else None,
            "ratio_ddp": round(w_ms / t_ms, 3) if t_ms > 0 else None, "runs": o.runs, "workers": o.nproc,
            "steps": o.rec_steps, "kill_at": o.kill_at, "ckpt_every": o.ckpt_every, "load_before": round(load, 2)}


# --- main -----------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", nargs="?", default="all", choices=["throughput", "recovery", "all"])
    ap.add_argument("--nproc", type=int, default=2, help="workers of every run")
    ap.add_argument("--steps", type=int, default=120, help="steps of each throughput run")
    ap.add_argument("--warmup", type=int, default=20, help="the first step the throughput counts")
    ap.add_argument("--window", type=int, default=10, help="steps of each window the throughput's median is of")
    ap.add_argument("--rounds", type=int, default=3, help="throughput runs of each, alternately")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32, help="tokens per sample (the example's --seq)")
    ap.add_argument("--rec-steps", type=int, default=40, help="steps of each recovery run")
    ap.add_argument("--kill-at", type=int, default=15, help="the step of the kill")
    ap.add_argument("--ckpt-every", type=int, default=10, help="torchrun's checkpoint interval")
    ap.add_argument("--torchrun-retries", type=int, default=2,
                    help="recovery runs in which torchrun itself fails (its store or rendezvous) that are "
                         "run again, each counted in torchrun_failed_runs; one more ends the script")
    ap.add_argument("--runs", type=int, default=3, help="recovery runs of each")
    ap.add_argument("--timeout-s", type=float, default=300, help="the longest one run may take")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (its path goes to stderr)")
    o = ap.parse_args()
    o.newt = os.environ.get("NEWT_BIN") or os.path.join(ROOT, "build", "newt")
    o.python = os.environ.get("NEWT_PYTHON") or "/usr/bin/python3"
    if o.warmup < 2 or o.steps < o.warmup or o.window < 1:
        ap.error("--warmup 2..--steps, --window at least 1")
    if o.nproc < 2:
        ap.error("--nproc at least 2 (the recovery kills rank 1)")
    if not 1 <= o.ckpt_every < o.kill_at < o.rec_steps:
        ap.error("1 <= --ckpt-every < --kill-at < --rec-steps")
    if o.global_batch % (o.micro_batch * o.nproc):
        ap.error("--global-batch must split in micro-batches over --nproc workers")
    for path, what in ((o.newt, "NEWT_BIN"), (o.python, "NEWT_PYTHON")):
        if not os.access(path, os.X_OK):
            ap.error(f"{what}: {path} is not an executable")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "build", "python"))

    work = tempfile.mkdtemp(prefix="newt-bench-torch-")
    atexit.register(lambda: o.keep or shutil.rmtree(work, ignore_errors=True))
    atexit.register(kill_all)  # runs first: the processes go before their directory

    def stop(sig, frame):
        raise SystemExit(128 + sig)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    if o.keep:
        print(f"compare.py: runs in {work}", file=sys.stderr)
    try:
        if o.part in ("throughput", "all"):
            print(json.dumps(throughput(o, work, env)), flush=True)
        if o.part in ("recovery", "all"):
            print(json.dumps(recovery(o, work, env)), flush=True)
    except Fail as e:
        keep = f"(logs kept in {work})" if o.keep else "(--keep keeps the logs)"
        print(f"compare.py: {e}{keep}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
