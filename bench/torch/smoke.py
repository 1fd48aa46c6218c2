"""The bench_torch test: compare.py (both parts) with tiny settings, once; both JSON lines must
come out, every figure a positive number (newt's steps lost at least 0). No figure is compared
with a target: speed is not for a timed test. Prints `N passed, N failed`; exits non-zero on any
failure.

    NEWT_BIN=build/newt PYTHONPATH=build/python /usr/bin/python3 bench/torch/smoke.py
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = ["all", "--steps", "24", "--warmup", "4", "--rounds", "1", "--rec-steps", "24", "--kill-at", "12",
        "--ckpt-every", "10", "--runs", "1", "--timeout-s", "120"]
# each field: True, a positive number; False, a number at least 0
WANT = {"torch_throughput": {"newt_tokens_per_s": True, "newt_ddp_tokens_per_s": True, "ddp_tokens_per_s": True,
                             "ratio": True, "ratio_ddp": True, "ddp_over_reduce_gradients": True},
        "torch_recovery": {"newt_recovery_ms": True, "newt_steps_lost": False, "newt_ddp_recovery_ms": True,
                           "newt_ddp_steps_lost": False, "torchrun_recovery_ms": True, "torchrun_steps_redone": True,
                           "torchrun_failed_runs": False, "ratio": True, "ratio_ddp": True}}


def main():
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        passed, failed = passed + ok, failed + (not ok)
        print(f"{'ok  ' if ok else 'FAIL'} {what}")

    p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), *TINY], stdout=subprocess.PIPE, text=True,
                       timeout=600)
    print(p.stdout, end="")
    check(p.returncode == 0, f"compare.py exits 0 (got {p.returncode})")
    lines = {}
    for line in p.stdout.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("bench") in WANT:
            lines[e["bench"]] = e
    for bench, fields in WANT.items():
        e = lines.get(bench)
        check(e is not None, f"a {bench} line")
        for k, positive in fields.items():
            v = e.get(k) if e else None
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (v > 0 if positive else v >= 0)
            check(ok, f"{bench}.{k} = {v} ({'positive' if positive else 'at least 0'})")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
