#!/bin/sh
# The OpenBLAS core newt's training commands run their GEMMs on (model/ops.h): on a CPU
# that runs AVX2 and FMA, never one without them (OpenBLAS 0.3.21 takes a CPU model it does
# not know for a Prescott, and newt asks for the CPU's own); a core the user names with
# OPENBLAS_CORETYPE is kept as it is.
#   blas_core.sh NEWT
set -u
newt=$1
core() { # the blas_core of one short `newt bench train`
  out=$("$@" "$newt" bench train --steps 1 --warmup 0 --batch 2 2>/dev/null) || { echo "bench train failed" >&2; exit 1; }
  echo "$out" | sed -n 's/.*"blas_core":"\([^"]*\)".*/\1/p'
}
old="unknown katmai coppermine northwood prescott banias atom core2 penryn dunnington nehalem sandybridge opteron barcelona bobcat bulldozer piledriver nano"
flags=$(grep -m1 '^flags' /proc/cpuinfo)
own=$(core env -u OPENBLAS_CORETYPE)
[ -n "$own" ] || { echo "FAIL: no blas_core in newt bench train's line"; exit 1; }
echo "this CPU: core $own"
lower=$(echo "$own" | tr 'A-Z' 'a-z')
case " $flags " in
  *" avx2 "*)
    case " $flags " in
      *" fma "*)
        for o in $old; do
          [ "$lower" = "$o" ] && { echo "FAIL: the CPU runs AVX2 and FMA, and the GEMMs ran on $own"; exit 1; }
        done ;;
    esac
    mine=$(core env OPENBLAS_CORETYPE=Haswell)
    [ "$mine" = Haswell ] || { echo "FAIL: OPENBLAS_CORETYPE=Haswell gave core $mine"; exit 1; } ;;
esac
mine=$(core env OPENBLAS_CORETYPE=Prescott)
[ "$mine" = Prescott ] || { echo "FAIL: OPENBLAS_CORETYPE=Prescott (the user's) gave core $mine"; exit 1; }
echo "PASS"
