#!/bin/sh
# The layering of the product, checked (docs/architecture.md is the map):
#   1. folders: each product folder includes only the folders its row of LAYERS allows,
#      so no folder includes a folder that includes it back;
#   2. files: no two object files of the product call each other in a loop (a symbol
#      defined in one and used by another is an arrow; any cycle of arrows fails);
#   3. records: rendezvous/ names no record of a job (job/ owns every key and record): no
#      key of one as a string literal, no record type or codec;
#   4. job/'s codecs are pure: only its store side (JOB_STORE) calls rendezvous/; the other
#      files of job/ turn bytes into structs and back, and include no rendezvous/ header
#      (but view.[ch], which decode etcd's key-values and may see rendezvous/etcd.h's types).
# Usage: check_layers.sh SOURCE_DIR BUILD_DIR (ctest runs it as arch_layers). Exits non-zero
# naming every violation.
set -u
src=$1
build=$2
fail=0

# folder: the folders it may include (besides itself). Lower layers first.
LAYERS='
common:
rendezvous: common
comm: common
ckpt: common
model: common comm
job: common rendezvous
coordinator: common rendezvous job
worker: common rendezvous comm ckpt job
gpt: common comm ckpt model job worker
launch: common rendezvous job
bench: common rendezvous comm model ckpt job launch gpt
cli: common rendezvous comm model ckpt job coordinator worker gpt launch bench
examples:
'

folders=$(printf '%s\n' "$LAYERS" | sed -n 's/^\([a-z]*\):.*/\1/p')
for f in $folders; do
  [ -d "$src/$f" ] || continue
  allowed=$(printf '%s\n' "$LAYERS" | sed -n "s/^$f:\(.*\)/\1/p")
  used=$(find "$src/$f" -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | xargs grep -ho '^#include "[a-z_]*/' |
         sed 's/#include "//; s,/,,' | sort -u)
  for u in $used; do
    [ "$u" = "$f" ] && continue
    case " $allowed " in
      *" $u "*) ;;
      *) echo "layers: $f/ includes $u/, which its layer may not use:" \
              "$(grep -ln "^#include \"$u/" $(find "$src/$f" -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh') | sed "s,^$src/,," | tr '\n' ' ')"
         fail=1 ;;
    esac
  done
done

# File-level arrows from the symbol tables of the product's objects (libraries newt_* and
# the newt binary; not the builds of the same sources that tests make inside this one, the
# test double's in gpu-double/ and the sanitized binary's in asan/, which may be left from
# older sources). An undefined symbol of A defined in B: A -> B.
objs=$(cd "$build" && find . -path '*/CMakeFiles/newt*.dir/*' -name '*.o' | grep -v '/tests/' |
       grep -v -e '^\./gpu-double/' -e '^\./asan/' | sed "s,^\.,$build," | sort)
[ -n "$objs" ] || { echo "layers: no object files under $build (build first)"; exit 1; }
for o in $objs; do
  # build/comm/CMakeFiles/newt_comm.dir/x.c.o -> comm/x.c; .../newt.dir/__/bench/y.c.o -> bench/y.c
  name=$(echo "$o" | sed 's,^.*/\([a-z_]*\)/CMakeFiles/newt[a-z_]*\.dir/\(.*\)\.o$,\1/\2,; s,^[a-z_]*/__/,,')
  [ -f "$src/$name" ] || continue # an object left from a source file that is gone
  nm "$o" 2>/dev/null | awk -v f="$name" '$1 == "U" { print "U", f, $2; next }
                                        NF == 3 && $2 ~ /^[TDBRVW]$/ { print "D", f, $3 }'
done | awk '
  $1 == "D" { def[$3] = $2; next }
  $1 == "U" { use[++n] = $2 SUBSEP $3 }
  END {
    for (i = 1; i <= n; i++) {
      split(use[i], p, SUBSEP)
      if ((p[2] in def) && def[p[2]] != p[1]) {
        a = p[1]; b = def[p[2]]
        if (!((a, b) in e)) { e[a, b] = 1; why[a, b] = p[2]; files[a] = 1; files[b] = 1 }
      }
    }
    # reach = transitive closure (Floyd-Warshall over a few hundred files)
    nf = 0
    for (f in files) idx[++nf] = f
    for (k in e) r[k] = 1
    for (k = 1; k <= nf; k++) {
      K = idx[k]
      for (i = 1; i <= nf; i++) {
        I = idx[i]
        if (!((I, K) in r)) continue
        for (j = 1; j <= nf; j++) { J = idx[j]; if ((K, J) in r) r[I, J] = 1 }
      }
    }
    bad = 0
    for (k in e) {
      split(k, p, SUBSEP)
      if ((p[2], p[1]) in r) {
        printf "layers: %s -> %s (%s) closes a loop back to %s\n", p[1], p[2], why[k], p[1]
        bad = 1
      }
    }
    exit bad
  }' || fail=1

# 3. The job's keys ("plan", "workers/", "acks/%020lld/", ...) and records (rdzv_worker, a
# plan or spec codec, anything job_) belong to job/ (records.h's table): rendezvous/ knows keys,
# leases and revisions a caller hands it.
single='spec|plan|progress|done|ckpt|failed'
prefixed='workers|election|reports|acks|events|faults|links'
hits=$(grep -nE "\"($single)\"|\"($prefixed)/|\b(rdzv_(worker|plan|spec|event|barrier_ack|barrier_forget|members_count_acked)|job_[a-z_]+|plan_[a-z_]+|spec_[a-z_]+)\b" \
       "$src"/rendezvous/*.c "$src"/rendezvous/*.h 2>/dev/null | sed "s,^$src/,,")
if [ -n "$hits" ]; then
  echo "layers: rendezvous/ names a record of the job (its key or its type belongs to job/):"
  printf '%s\n' "$hits" | sed 's/^/  /'
  fail=1
fi

# 4. job/'s store side reads and writes etcd (store.c: the records over rendezvous' protocols;
# follow.c: the reads behind view.h); every other file of job/ is pure. From the objects: no
# rdzv_ symbol used outside the store side; from the sources: no rendezvous/ header included
# (view.[ch] may include rendezvous/etcd.h, for a key-value's type).
JOB_STORE='store follow'
JOB_KV='view'
for o in $(find "$build/job" -path '*/CMakeFiles/newt_job.dir/*' -name '*.c.o' 2>/dev/null | sort); do
  f=$(basename "$o" .c.o)
  [ -f "$src/job/$f.c" ] || continue
  case " $JOB_STORE " in *" $f "*) continue ;; esac
  calls=$(nm "$o" 2>/dev/null | awk '$1 == "U" && $2 ~ /^rdzv_/ { print $2 }' | tr '\n' ' ' | sed 's/ $//')
  if [ -n "$calls" ]; then
    echo "layers: job/$f.c calls rendezvous/ ($calls), but only job/'s store side (store.c, follow.c) may: move the call to job/store.c"
    fail=1
  fi
done
for p in "$src"/job/*.c "$src"/job/*.h; do
  f=$(basename "$p"); f=${f%.*}
  case " $JOB_STORE " in *" $f "*) continue ;; esac
  case " $JOB_KV " in
    *" $f "*) inc=$(grep -n '^#include "rendezvous/' "$p" | grep -v '"rendezvous/etcd.h"') ;;
    *) inc=$(grep -n '^#include "rendezvous/' "$p") ;;
  esac
  if [ -n "$inc" ]; then
    echo "layers: job/$(basename "$p") is a pure codec of job/ and includes rendezvous/: $(printf '%s' "$inc" | tr '\n' ' ')"
    fail=1
  fi
done

if [ "$fail" -eq 0 ]; then echo "layers: folders and files without loops; rendezvous/ names no record; job/'s codecs call no etcd"; fi
exit $fail
