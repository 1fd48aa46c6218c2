#!/bin/sh
# `newt status` on a `newt run` job of this host, as the README shows it: `--job NAME` and no
# other flag (issue 38, items 3 and 4). The jobs are real (newt run's private etcd, with its
# authentication; docs/api.md's example program as the workers); XDG_RUNTIME_DIR is a
# directory of the test's, where newt run records its job.
#
#   live   a job that runs until it is interrupted: `newt status --job NAME` shows it running
#          (text and --json); the record is mode 0600 in a 0700 directory and holds no
#          password; a record others can read, one owned by another user (as root) and a link
#          in its place are refused naming the file; SIGINT ends the run, and status then says
#          it was interrupted, its etcd gone with it
#   watch  a job of a few seconds: `newt status --job NAME --watch` started while it runs
#          ends by itself, exit 0, saying the job is done; so does a watch whose next look is
#          ten minutes away (--interval-ms 600000): the run's end wakes it
#   away   an etcd that never answers: --watch gives up past --etcd-wait-ms, exit 1, naming
#          its address; with no record and nothing at the default address, status says how
#          to name the job's etcd
#
# Nothing waits for a time: each wait is for its event (a status that answers, a process that
# exits), with a generous bound only as a failsafe.
#
# usage: run_status.sh (NEWT_BIN: the newt binary; NEWT_LINREG: examples/linreg's program).
# Prints a line per check and "N passed, N failed"; exits 1 on any failure, keeping its files.
set -u
newt=${NEWT_BIN:?NEWT_BIN: the newt binary}
prog=${NEWT_LINREG:?NEWT_LINREG: examples/linreg}
t0=$(date +%s)
work=$(mktemp -d /tmp/newt-run-status-XXXXXX)
export XDG_RUNTIME_DIR="$work/xdg"
mkdir -m 700 "$XDG_RUNTIME_DIR"
unset NEWT_ETCD NEWT_ETCD_USER NEWT_ETCD_PASSWORD_FILE NEWT_JOB
records=$XDG_RUNTIME_DIR/newt
pids=""

. "$(dirname "$0")/../check.sh" # ok, fail, check
finish() {
  for p in $pids; do kill -INT "$p" 2>/dev/null; done
  for p in $pids; do wait "$p" 2>/dev/null; done
  echo "run_status.sh: $(($(date +%s) - t0)) s"
  if [ "$failed" -eq 0 ] && [ -z "${NEWT_KEEP_LOGS:-}" ]; then rm -rf "$work"; else echo "files in $work"; fi
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}
# gone PID SECONDS: waits for the process to exit (a failsafe bound, not a measure)
gone() {
  end=$(($(date +%s) + $2))
  while kill -0 "$1" 2>/dev/null; do
    [ "$(date +%s)" -ge "$end" ] && return 1
    sleep 0.1
  done
  return 0
}
# status_until JOB WORD OUT: `newt status --job JOB` until it exits 0 saying WORD (failsafe: 180 s)
status_until() {
  end=$(($(date +%s) + 180))
  while [ "$(date +%s)" -lt "$end" ]; do
    if "$newt" status --job "$1" >"$3" 2>&1 && grep -q "$2" "$3"; then return 0; fi
    sleep 0.2
  done
  return 1
}
start_run() { # start_run JOB STEPS: newt run in the background, $run its pid
  "$newt" run --job "$1" --nproc 2 --steps "$2" --global-batch 8 --micro-batch 4 --coordinators 1 --no-metrics \
    --log-dir "$work/$1" -- "$prog" >"$work/$1.out" 2>&1 &
  run=$!
  pids="$pids $run"
}

# --- live ------------------------------------------------------------------------------------
start_run live 100000000
check live_status "newt status --job live never showed it running: $(cat "$work/status.out" 2>/dev/null)" \
  status_until live "^job live: running" "$work/status.out"
check live_says_command "newt run does not say the command that watches it: $(head -3 "$work/live.out")" \
  grep -q "watch it with: newt status --job live --watch" "$work/live.out"
"$newt" status --job live --json >"$work/json.out" 2>&1
check live_json "newt status --job live --json: $(cat "$work/json.out")" grep -q '"state":"running"' "$work/json.out"
rec=$records/live.run
check record_private "the record $rec or its directory is not this user's alone: $(ls -la "$records")" \
  [ "$(stat -c %a "$records")" = 700 -a "$(stat -c %a "$rec")" = 600 ]
pw=$(cat "$work/live/etcd.password" 2>/dev/null)
check record_holds_no_password "the record holds etcd's password: $(cat "$rec")" \
  sh -c "[ -n '$pw' ] && [ -f '$rec' ] && ! grep -q '$pw' '$rec'"
chmod 644 "$rec"
"$newt" status --job live >"$work/open.out" 2>&1
check record_readable_refused "a record others can read was taken: $(cat "$work/open.out")" \
  grep -q "live.run can be read or written by other users" "$work/open.out"
chmod 600 "$rec"
if [ "$(id -u)" = 0 ]; then
  chown nobody "$rec"
  "$newt" status --job live >"$work/owner.out" 2>&1
  check record_owner_refused "a record another user owns was taken: $(cat "$work/owner.out")" \
    grep -q "live.run is owned by uid" "$work/owner.out"
  chown 0 "$rec"
fi
mv "$rec" "$rec.real" && ln -s "$rec.real" "$rec"
"$newt" status --job live >"$work/link.out" 2>&1
check record_link_refused "a link in the record's place was followed: $(cat "$work/link.out")" \
  grep -q "live.run: .*link" "$work/link.out"
rm -f "$rec" && mv "$rec.real" "$rec"
kill -INT "$run"
check live_run_ends "newt run did not end on SIGINT" gone "$run" 120
"$newt" status --job live >"$work/after.out" 2>&1
rc=$?
check live_after_end "after the run, newt status --job live (exit $rc): $(cat "$work/after.out")" \
  sh -c "[ $rc -eq 0 ] && grep -q '^job live: interrupted by SIGINT at step .*its newt run ended' '$work/after.out'"

# --- watch -----------------------------------------------------------------------------------
start_run quick 3000
check quick_status "newt status --job quick never answered: $(cat "$work/quick-status.out" 2>/dev/null)" \
  status_until quick "^job quick: " "$work/quick-status.out"
"$newt" status --job quick --watch >"$work/watch.out" 2>&1 &
watch=$!
"$newt" status --job quick --watch --interval-ms 600000 >"$work/slow.out" 2>&1 &
slow=$!
pids="$pids $watch $slow"
gone "$run" 300
check quick_run_done "newt run did not end done: $(tail -3 "$work/quick.out")" \
  grep -q '^newt run: done: 3000 steps' "$work/quick.out"
for w in watch slow; do
  eval p=\$$w
  if gone "$p" 60; then
    wait "$p"
    rc=$?
    check "${w}_ends_done" "--watch ($w) exited $rc: $(tail -5 "$work/$w.out")" \
      sh -c "[ $rc -eq 0 ] && tail -3 '$work/$w.out' | grep -q 'job quick: done at step 3000'"
  else
    fail "${w}_ends" "--watch ($w) still runs a minute after its job ended: $(tail -5 "$work/$w.out")"
  fi
done

# --- away ------------------------------------------------------------------------------------
"$newt" status --job quick --etcd http://127.0.0.1:9 --watch --interval-ms 100 --etcd-wait-ms 300 >"$work/away.out" 2>&1
rc=$?
check away_gives_up "--watch with etcd away (exit $rc): $(tail -3 "$work/away.out")" \
  sh -c "[ $rc -eq 1 ] && grep -q 'giving up: etcd unreachable at http://127.0.0.1:9 ' '$work/away.out'"
if ! "$newt" status --job nosuch --etcd http://127.0.0.1:2379 >/dev/null 2>&1 &&
  "$newt" status --job nosuch --etcd http://127.0.0.1:2379 2>&1 | grep -q "Failed to connect\|unreachable\|refused"; then
  "$newt" status --job nosuch >"$work/nosuch.out" 2>&1
  rc=$?
  check nosuch_says_how "newt status --job nosuch, nothing recorded (exit $rc): $(cat "$work/nosuch.out")" \
    sh -c "[ $rc -eq 1 ] && grep -q 'no newt run of job nosuch is recorded .*give the job.s etcd with --etcd URL' \
      '$work/nosuch.out'"
fi
finish
