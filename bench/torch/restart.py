"""newt's restart mode beside torchrun (TorchElastic 1.13), the same unmodified DDP script
(examples/torch/torchrun_ddp.py: gloo, its own checkpoint every --ckpt-every steps) under both:

  kill   kill -9 of one of the script's processes (rank 1) at step --at: seconds from the kill
         to the script's next step (the first line of its step log after the kill)
  join   a worker added at step --at: seconds from the joiner's start (newt run's chaos join; a
         new torchrun agent, --nnodes 1:4 with one process per agent) to the script's first step
         with the larger world

Each figure is the median of --runs runs; one JSON line per (tool, what), then one line of the
ratios. The times come from the script's own step log (STEP_LOG: a line per step with its wall
time), read the same way for both tools.

    /usr/bin/python3 bench/torch/restart.py [--runs 5] [--nproc 2] [--at 30] [--what kill,join]

Environment: NEWT_BIN (default build/newt), NEWT_PYTHON (default /usr/bin/python3)."""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
NEWT = os.environ.get("NEWT_BIN", os.path.join(SRC, "build", "newt"))
PY = os.environ.get("NEWT_PYTHON", "/usr/bin/python3")
SCRIPT = os.path.join(SRC, "examples", "torch", "torchrun_ddp.py")
TORCHRUN = [PY, "-m", "torch.distributed.run", "--redirects", "2", "--tee", "2", "--monitor_interval", "0.1"]


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.endswith("\n")]
    except OSError:
        return []


def wait_for(path, cond, procs, limit_s=300):
    t0 = time.time()
    while time.time() - t0 < limit_s:
        found = [l for l in lines(path) if cond(l)]
        if found:
            return found[0]
        if any(p.poll() is not None for p in procs):
            return None
        time.sleep(0.005)
    return None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    t = f.read()
                if int(t[t.rindex(")") + 2:].split()[1]) == pid:
                    out.append(int(d))
            except (OSError, ValueError):
                pass
    return out


def script_rank(root, rank):
    """The script's process of RANK rank under process root (any depth)."""
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            env, cmd = [], b""
        if b"torchrun_ddp.py" in cmd and f"RANK={rank}".encode() in env:
            return pid
        todo += children(pid)
    return None


def stop(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except OSError:
                pass
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def start(cmd, env, log):
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def script_args(tmp, a):
    return [SCRIPT, "--steps", "1000000", "--ckpt-every", str(a.ckpt_every), "--ckpt-dir", os.path.join(tmp, "ck")]


def kill_once(tool, a):
    with tempfile.TemporaryDirectory(prefix="newt-bench-restart-") as tmp:
        env = dict(os.environ, STEP_LOG=os.path.join(tmp, "steps.jsonl"), OMP_NUM_THREADS="1")
        log = open(os.path.join(tmp, "run.log"), "w")
        if tool == "newt":
            cmd = [NEWT, "run", "--restart", "--quiet", "--nproc", str(a.nproc), "--log-dir", os.path.join(tmp, "logs"),
                   "--", PY, *script_args(tmp, a)]
        else:
            cmd = [*TORCHRUN, "--nnodes", "1", "--nproc_per_node", str(a.nproc), "--max_restarts", "3",
                   "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "bench",
                   *script_args(tmp, a)]
        p = start(cmd, env, log)
        try:
            if not wait_for(env["STEP_LOG"], lambda l: l["step"] >= a.at, [p]):
                return None
            victim = script_rank(p.pid, 1)
            t_kill = time.time()
            os.kill(victim, signal.SIGKILL)
            nxt = wait_for(env["STEP_LOG"], lambda l: l["t"] > t_kill and l["restart"] > 0, [p])
            last = max(l["step"] for l in lines(env["STEP_LOG"]) if l["t"] <= t_kill)
            return None if not nxt else {"s": nxt["t"] - t_kill, "redone": last - nxt["step"] + 1}
        finally:
            stop([p])


def join_once(tool, a):
    with tempfile.TemporaryDirectory(prefix="newt-bench-restart-") as tmp:
        env = dict(os.environ, STEP_LOG=os.path.join(tmp, "steps.jsonl"), OMP_NUM_THREADS="1")
        log = open(os.path.join(tmp, "run.log"), "w")
        procs = []
        try:
            if tool == "newt":
                summary = os.path.join(tmp, "summary.json")
                procs.append(start([NEWT, "run", "--restart", "--quiet", "--nproc", str(a.nproc), "--log-dir",
                                    os.path.join(tmp, "logs"), "--summary", summary, "--chaos", f"join:1@step={a.at}",
                                    "--", PY, *script_args(tmp, a)], env, log))
                first = wait_for(env["STEP_LOG"], lambda l: l["world"] == a.nproc + 1, procs)
                if not first:
                    return None
                os.killpg(procs[0].pid, signal.SIGINT)
                procs[0].wait(timeout=120)
                with open(summary) as f:
                    s = json.load(f)
                joins = [r for r in s["recoveries"] if r["cause"] == "join" and r.get("injected")]
                if not joins:
                    return None
                t_join = joins[0]["t_ms"] / 1000.0  # the fault's time: when newt run started the joiner
                return {"s": first["t"] - t_join}
            port = free_port()
            agent = [*TORCHRUN, "--nnodes", "1:4", "--nproc_per_node", "1", "--max_restarts", "3", "--rdzv_backend",
                     "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "bench", *script_args(tmp, a)]
            procs += [start(agent, env, log) for _ in range(a.nproc)]
            if not wait_for(env["STEP_LOG"], lambda l: l["step"] >= a.at and l["world"] == a.nproc, procs):
                return None
            t_join = time.time()
            procs.append(start(agent, env, log))
            first = wait_for(env["STEP_LOG"], lambda l: l["world"] == a.nproc + 1, procs)
            return None if not first else {"s": first["t"] - t_join}
        finally:
            stop(procs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--at", type=int, default=30)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--what", default="kill,join")
    a = ap.parse_args()
    medians = {}
    for what in a.what.split(","):
        for tool in ("newt", "torchrun"):
            got = [r for r in ((kill_once if what == "kill" else join_once)(tool, a) for _ in range(a.runs)) if r]
            figs = sorted(r["s"] for r in got)
            line = {"bench": "restart", "what": what, "tool": tool, "nproc": a.nproc, "runs": len(got),
                    "median_s": round(statistics.median(figs), 3) if figs else None,
                    "min_s": round(figs[0], 3) if figs else None, "max_s": round(figs[-1], 3) if figs else None}
            if what == "kill" and got:
                line["steps_redone_median"] = statistics.median(r["redone"] for r in got)
            medians[(what, tool)] = line["median_s"]
            print(json.dumps(line), flush=True)
    ratios = {w: round(medians[(w, "torchrun")] / medians[(w, "newt")], 2)
              for w in a.what.split(",") if medians.get((w, "newt")) and medians.get((w, "torchrun"))}
    print(json.dumps({"bench": "restart", "torchrun_over_newt": ratios}), flush=True)


if __name__ == "__main__":
    main()
