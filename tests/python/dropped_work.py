"""A worker that drops an async collective's Work without wait() (issue 37, item 6), run by
test_python.py under `newt run` with two workers. At step 2 the data-parallel rank 0 starts
an allreduce of a 64 MiB tensor (its own mapping: freed, it is unmapped), drops the Work and
collects garbage, then writes a marker file; rank 1 waits for the marker and only then takes
its part, so the collective is still in flight when rank 0's Work is gone. Before, rank 0
died of SIGSEGV: libnewt wrote into the freed tensor. Both ranks print "went on" and train to
the end.

    dropped_work.py MARKER_DIR
"""

import gc
import os
import sys
import time

import torch

import newt


def main():
    marker_dir = sys.argv[1]
    with newt.join() as job:
        w = torch.zeros(4)
        job.state.add("w", w)
        for step in job.steps():
            with step:
                g = job.layout.dp
                if step.number == 2 and g.size > 1:
                    marker = os.path.join(marker_dir, f"dropped-{job.layout.generation}")
                    if g.rank == 0:
                        work = g.allreduce_async(torch.ones(1 << 24))
                        del work  # never waited for: the tensor's last reference was the Work's
                        gc.collect()
                        with open(marker, "w"):
                            pass
                    else:
                        while not os.path.exists(marker):  # the event: rank 0 dropped its Work
                            time.sleep(0.005)
                        t = g.allreduce_async(torch.ones(1 << 24))
                        t.wait()
                    print(f"dropped_work: rank {g.rank} went on", flush=True)
                total = step.commit(float(w.sum()))
                w += 1
                step.end(loss=total)


if __name__ == "__main__":
    main()
