#!/bin/sh
# A stand-in for a training program built on libnewt (tests/launch/test_command.c): it
# records what it was given, then exits or waits to be stopped.
#
#   $STANDIN_DIR/$NEWT_WORKER_ID.env   "pid=<its pid>", an "arg=<word>" line per argument,
#                                      then its environment (env), written under another
#                                      name and renamed, so a reader never sees half of it
#
# STANDIN_THEN=exit: it writes "done: stand-in" to $NEWT_TERMINATION_LOG (as the library
# does at the end of a job) and exits 0; otherwise it waits for a signal (exec: the same
# pid, with the default disposition of SIGTERM).
set -eu
out="$STANDIN_DIR/$NEWT_WORKER_ID.env"
{
  echo "pid=$$"
  for a in "$@"; do echo "arg=$a"; done
  env
} >"$out.tmp"
mv "$out.tmp" "$out"
if [ "${STANDIN_THEN:-wait}" = exit ]; then
  if [ -n "${NEWT_TERMINATION_LOG:-}" ]; then echo "done: stand-in" >"$NEWT_TERMINATION_LOG"; fi
  exit 0
fi
exec sleep infinity
