#!/bin/sh
# libnewt installed, and a program built against the installed copy alone:
#
#   1. the install (`make install`'s step: DESTDIR=<root> cmake --install <build> --prefix
#      /usr/local) puts newt, libnewt.so, libnewt.a, newt.pc and newt.h under the root;
#   2. the installed libnewt.so exports exactly the functions newt.h declares (NEWT_API), and
#      libnewt.a defines no global symbol but them;
#   3. pkg-config (PKG_CONFIG_PATH and PKG_CONFIG_SYSROOT_DIR into the root) names the root's
#      include and lib directories, the header's version, and for --static everything libnewt.a
#      needs (the CUDA runtime too when libnewt.so needs it); in a clean directory holding only a
#      copy of tests/api/client.c, the client is built with it twice: against libnewt.so
#      (newt.pc), and with libnewt.a linked in (newt-static.pc, the other libraries shared);
#   4. both binaries are the two workers of one real job, run by the installed newt
#      (`newt run --nproc 2 -- worker.sh`: worker 0 runs the shared client, worker 1 the static
#      one, neither with LD_LIBRARY_PATH: newt.pc's rpath finds libnewt.so): the job ends done,
#      and both print the same final state, the one computed here independently (awk) from the
#      same deterministic update; a client linked without the rpath (-L -lnewt alone) cannot
#      start, and `newt run` says the loader's message from the worker's log, offering no report
#      of a run that made no step;
#   5. the Python package (PREFIX/lib/python3/dist-packages/newt) imports with that directory
#      on PYTHONPATH and loads the installed libnewt; newt.pth in PREFIX/lib/python3.X/
#      dist-packages (a directory Debian's python3 searches for /usr/local) leads to it.
#
# usage: install.sh BUILD_DIR (ctest passes it; NEWT_SOURCE_DIR is the source tree;
# NEWT_CLIENT_CFLAGS, flags the client must be built with too: a sanitized build's). Prints a
# line per check and "N passed, N failed"; exits 1 on any failure, keeping its files (also
# kept with NEWT_KEEP_LOGS=1).
set -u
build=$(cd "${1:?usage: install.sh BUILD_DIR}" && pwd)
src=${NEWT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
steps=20
gb=8
xflags=${NEWT_CLIENT_CFLAGS:-}
t0=$(date +%s)
work=$(mktemp -d /tmp/newt-install-XXXXXX)
root=$work/root
prefix=/usr/local

. "$src/tests/check.sh" # ok, fail, check
finish() {
  echo "install.sh: $(($(date +%s) - t0)) s"
  if [ "$failed" -eq 0 ] && [ -z "${NEWT_KEEP_LOGS:-}" ]; then rm -rf "$work"; else echo "files in $work"; fi
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}
for tool in cc pkg-config nm readelf awk; do
  command -v "$tool" >/dev/null 2>&1 || { fail tools "$tool is not on PATH (scripts/install-deps.sh build)"; finish; }
done

# --- 1. the install ---------------------------------------------------------------------------
if DESTDIR=$root cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1; then
  ok install
else
  fail install "cmake --install failed: $(tail -5 "$work/install.log")"
  finish
fi
lib=$root$prefix/lib
missing=""
for f in bin/newt lib/libnewt.so lib/libnewt.a lib/pkgconfig/newt.pc lib/pkgconfig/newt-static.pc include/newt.h; do
  [ -e "$root$prefix/$f" ] || missing="$missing $f"
done
check installed_files "missing under $root$prefix:$missing" [ -z "$missing" ]
check installed_header "the installed newt.h differs from include/newt.h" cmp -s "$root$prefix/include/newt.h" \
  "$src/include/newt.h"
[ -z "$missing" ] || finish

# --- 2. the symbols ----------------------------------------------------------------------------
sed -n 's/^NEWT_API .*[ *]\(newt_[a-z0-9_]*\)(.*/\1/p' "$root$prefix/include/newt.h" | sort -u >"$work/api.txt"
napi=$(wc -l <"$work/api.txt")
check header_declarations "newt.h declares $napi NEWT_API functions (expected some 30)" [ "$napi" -ge 30 ]
nm -D --defined-only "$lib/libnewt.so" | awk 'NF == 3 { print $3 }' | sort -u >"$work/so.txt"
if cmp -s "$work/api.txt" "$work/so.txt"; then
  ok so_exports
else
  fail so_exports "libnewt.so's exports are not newt.h's functions: $(diff "$work/api.txt" "$work/so.txt" | grep '^[<>]' | tr '\n' ' ')"
fi
nm -g --defined-only "$lib/libnewt.a" | awk 'NF == 3 { print $3 }' | sort -u >"$work/a.txt"
if cmp -s "$work/api.txt" "$work/a.txt"; then
  ok archive_globals
else
  fail archive_globals "libnewt.a's global symbols are not newt.h's functions: $(diff "$work/api.txt" "$work/a.txt" | grep '^[<>]' | tr '\n' ' ')"
fi

# --- 3. the client, from a clean directory -------------------------------------------------------
export PKG_CONFIG_PATH="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$root"
clean=$work/clean
mkdir "$clean" && cp "$src/tests/api/client.c" "$clean/" && cd "$clean" || { fail clean_dir "cannot make $clean"; finish; }
version=$(sed -n 's/^#define NEWT_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$src/include/newt.h" | paste -sd.)
check pc_version "pkg-config --modversion newt says '$(pkg-config --modversion newt 2>&1)', newt.h $version" \
  [ "$(pkg-config --modversion newt 2>/dev/null)" = "$version" ]
cflags=$(pkg-config --cflags newt) && libs=$(pkg-config --libs newt) && slibs=$(pkg-config --static --libs newt) ||
  { fail pkg_config "pkg-config newt: $(pkg-config --cflags --libs newt 2>&1)"; finish; }
# newt's own paths are the root's, once (the .pc is relocatable: ${pcfiledir})
inc=$(for f in $cflags; do case $f in -I*) echo "${f#-I}"; break ;; esac; done)
ldir=$(for f in $libs; do case $f in -L*) echo "${f#-L}"; break ;; esac; done)
check pc_paths "pkg-config names -I$inc -L$ldir, not the root's $root$prefix/include and lib" \
  [ "$(cd "$inc" 2>/dev/null && pwd -P)" = "$(cd "$root$prefix/include" && pwd -P)" -a \
    "$(cd "$ldir" 2>/dev/null && pwd -P)" = "$(cd "$lib" && pwd -P)" ]
# PKG_CONFIG_SYSROOT_DIR prefixes every -L with the root, the host's libraries' too (libcurl,
# the CUDA runtime): only newt is under this root, so a directory that is not there but is on
# the host is the host's. -lnewt is taken from the archive.
host_libs() {
  for f in "$@"; do
    case $f in
      -L"$root"/*) d=${f#-L"$root"}; [ ! -d "$root$d" ] && [ -d "$d" ] && f=-L$d ;;
    esac
    printf '%s ' "$f"
  done
}
# The static link: newt-static.pc names libnewt.a by its path and what it needs (its
# dependencies as the shared libraries they are here, pthread, dl, m, the CUDA runtime when
# built with CUDA); newt.pc's --static names the same after -lnewt, with nothing of the
# dependencies' own private libraries (libcurl's nghttp2, rtmp, ...: a host need not have
# their development files, this one has not)
own=$(sed -n 's/^Libs.private: *//p' "$lib/pkgconfig/newt.pc")
static_libs=$(pkg-config --libs newt-static) ||
  { fail pc_static "pkg-config newt-static: $(pkg-config --libs newt-static 2>&1)"; finish; }
unnamed=""
# shellcheck disable=SC2086
for f in $own; do
  case $f in -l*) ;; *) continue ;; esac # -L paths: the sysroot prefixes them
  case " $slibs " in *" $f "*) ;; *) unnamed="$unnamed $f" ;; esac
  case " $static_libs " in *" $f "*) ;; *) unnamed="$unnamed $f (newt-static)" ;; esac
done
check pc_static "pkg-config --static --libs newt ($slibs) or newt-static ($static_libs) does not name$unnamed" \
  [ -n "$own" -a -z "$unnamed" ]
# shellcheck disable=SC2086
check pc_static_archive "pkg-config newt-static ($static_libs) does not name $lib/libnewt.a" \
  sh -c "for f in $static_libs; do [ \"\$f\" -ef '$lib/libnewt.a' ] && exit 0; done; exit 1"
# a build with CUDA: libnewt.so needs the CUDA runtime, and so does the archive
if readelf -d "$lib/libnewt.so" | grep NEEDED | grep -q libcudart; then
  check pc_static_cuda "libnewt.so needs libcudart, newt.pc's Libs.private ($own) does not name -lcudart" \
    sh -c "case ' $own ' in *' -lcudart '*) exit 0 ;; esac; exit 1"
fi
# shellcheck disable=SC2086 # flags are words
if cc -O2 $xflags $cflags client.c -o client_shared $libs -lm >"$work/cc_shared.log" 2>&1; then
  ok build_shared
else
  fail build_shared "cc $cflags client.c $libs -lm: $(head -20 "$work/cc_shared.log")"
fi
# shellcheck disable=SC2046,SC2086
static_link="$(host_libs $static_libs)"
# shellcheck disable=SC2086
if cc -O2 $xflags $cflags client.c -o client_static $static_link >"$work/cc_static.log" 2>&1; then
  ok build_static
else
  fail build_static "cc $cflags client.c $static_link: $(head -20 "$work/cc_static.log")"
fi
cd "$work" || finish
[ -x "$clean/client_shared" ] && [ -x "$clean/client_static" ] || finish
check clean_dir_holds_only_client "the clean directory holds $(ls "$clean" | tr '\n' ' ')" \
  [ "$(ls "$clean" | tr '\n' ' ')" = "client.c client_shared client_static " ]
# the rpath of newt.pc: the installed libnewt.so.0, with no LD_LIBRARY_PATH
found=$(env -u LD_LIBRARY_PATH ldd "$clean/client_shared" | sed -n 's/^.*libnewt.so.0 => \(\/[^ ]*\) .*$/\1/p')
check shared_needs_installed_lib "the shared client, with no LD_LIBRARY_PATH, does not take libnewt.so.0 from $lib: $(
  env -u LD_LIBRARY_PATH ldd "$clean/client_shared" | grep libnewt)" \
  sh -c "[ -n '$found' ] && [ '$found' -ef '$lib/libnewt.so.0' ]"
check static_has_no_libnewt "the static client needs $(readelf -d "$clean/client_static" | grep -o 'libnewt[^]]*')" \
  sh -c "! readelf -d '$clean/client_static' | grep NEEDED | grep -q libnewt && nm '$clean/client_static' | grep -q ' T newt_join$'"

# --- 4. both clients as the workers of one job ------------------------------------------------------
cat >"$work/worker.sh" <<EOF
#!/bin/sh
# worker 0 runs the shared client, the others the static one
unset LD_LIBRARY_PATH
if [ "\${LOCAL_RANK:-0}" = 0 ]; then
  echo "worker.sh: client_shared" >&2
  exec '$clean/client_shared'
fi
echo "worker.sh: client_static" >&2
exec '$clean/client_static'
EOF
chmod +x "$work/worker.sh"
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
"$root$prefix/bin/newt" run --nproc 2 --steps $steps --global-batch $gb --micro-batch 2 --coordinators 1 --no-metrics \
  --quiet --timeout-ms 240000 --log-dir "$work/run" -- "$work/worker.sh" >"$work/run.out" 2>&1
rc=$?
check run_done "newt run exited $rc: $(tail -5 "$work/run.out")" \
  sh -c "[ $rc -eq 0 ] && grep -q '^newt run: done: $steps steps' '$work/run.out'"
want=$(awk -v steps=$steps -v gb=$gb 'BEGIN {
  for (i = 0; i < 8; i++) x[i] = i + 1
  for (s = 1; s <= steps; s++)
    for (i = 0; i < 8; i++) {
      G = 0
      for (k = (s - 1) * gb; k < s * gb; k++) G += (7 * k + 3 * i) % 11
      v = 3 * x[i] + G + 1
      x[i] = v - int(v / 65521) * 65521
    }
  printf "client: final step %d x", steps
  for (i = 0; i < 8; i++) printf " %.0f", x[i]
  printf "\n"
}')
kinds=$(cat "$work/run"/w*.log 2>/dev/null | sed -n 's/^worker.sh: //p' | sort | tr '\n' ' ')
check both_binaries_ran "the workers ran: $kinds" [ "$kinds" = "client_shared client_static " ]
got0=$(grep '^client: final' "$work/run/w0.log" 2>/dev/null)
got1=$(grep '^client: final' "$work/run/w1.log" 2>/dev/null)
check same_final_state "w0 printed '$got0', w1 '$got1'" [ -n "$got0" -a "$got0" = "$got1" ]
check expected_final_state "the clients printed '$got0', the update computed here gives '$want'" [ "$got0" = "$want" ]

# a client linked without newt.pc's rpath cannot start: newt run says the loader's word
if cc -O2 $xflags $cflags "$clean/client.c" -o "$work/client_norpath" -L"$lib" -lnewt -lm >"$work/cc_norpath.log" 2>&1; then
  env -u LD_LIBRARY_PATH "$root$prefix/bin/newt" run --nproc 1 --steps 2 --global-batch 2 --micro-batch 2 \
    --coordinators 1 --no-metrics --timeout-ms 120000 --log-dir "$work/norpath" -- "$work/client_norpath" \
    >"$work/norpath.out" 2>&1
  rc=$?
  check not_started_says_loader "newt run (exit $rc) does not say the loader's message: $(cat "$work/norpath.out")" \
    sh -c "[ $rc -ne 0 ] && grep -q 'w0 exited (exit 127): .*error while loading shared libraries: libnewt.so.0' \
      '$work/norpath.out'"
  check not_started_no_report "newt run offers a report of a run that made no step: $(cat "$work/norpath.out")" \
    sh -c "! grep -q 'newt report' '$work/norpath.out'"
else
  fail build_norpath "cc client.c -L$lib -lnewt: $(head -20 "$work/cc_norpath.log")"
fi

# --- 5. the Python package ---------------------------------------------------------------------
# installed beside the library (PREFIX/lib/python3/dist-packages/newt), it imports with
# nothing but PYTHONPATH and loads the installed libnewt (not the build tree's); newt.pth in
# PREFIX/lib/python3.X/dist-packages, a directory Debian's python3 searches for /usr/local,
# names it (relative to itself: it holds under DESTDIR too)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
pkg=$root$prefix/lib/python3/dist-packages/newt
check python_installed "no newt package at $pkg" [ -f "$pkg/__init__.py" ]
if [ -f "$pkg/__init__.py" ]; then
  loaded=$(cd "$work" && env -u NEWT_LIBRARY PYTHONPATH="$(dirname "$pkg")" "$py" -c \
    'import newt; print(newt.library_path, newt.library_version())' 2>&1)
  check python_import "import newt from the install printed: $loaded (expected $lib/libnewt.so.0)" \
    [ "${loaded%% *}" = "$lib/libnewt.so.0" ]
  site=$root$prefix/lib/python$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')/dist-packages
  loaded=$(cd "$work" && env -u NEWT_LIBRARY -u PYTHONPATH "$py" -c \
    "import site; site.addsitedir('$site'); import newt; print(newt.library_path)" 2>&1)
  check python_pth "import newt through $site/newt.pth printed: $loaded (expected $lib/libnewt.so.0)" \
    [ "$loaded" = "$lib/libnewt.so.0" ]
fi
finish
