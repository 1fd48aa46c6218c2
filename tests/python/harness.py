"""What the Python tests of this folder share: where the sources and the newt binary are
(NEWT_SOURCE_DIR, NEWT_BIN), and check(), which says a failure at once and keeps it in
failures for the exit status."""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("NEWT_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
NEWT = os.environ.get("NEWT_BIN", os.path.join(SRC, "build", "newt"))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}", flush=True)
    return cond
