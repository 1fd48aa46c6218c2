#!/bin/sh
# The demo corpus: the King James Bible from the Debian package bible-kjv (installed by
# `make demo` / scripts/install-deps.sh demo), dumped by its own `bible` tool one verse per
# line without the verse references, then tokenized byte by byte into a token file.
#
#   scripts/demo-corpus.sh [newt binary] [output token file]
#
# defaults: build/newt, build/kjv.tok. The text is never committed; this regenerates it.
set -eu
newt=${1:-build/newt}
out=${2:-build/kjv.tok}
if ! command -v bible >/dev/null 2>&1; then
  echo "demo-corpus.sh: the bible command is missing: scripts/install-deps.sh demo (package bible-kjv)" >&2
  exit 1
fi
tmp=$(mktemp "${TMPDIR:-/tmp}/kjv.XXXXXX")
trap 'rm -f "$tmp"' EXIT
# -f turns pretty-printing off: "Ge1:1 In the beginning ..." one verse a line; drop the reference.
bible -f gen1:1-rev22:21 </dev/null | sed 's/^[^ ]* //' >"$tmp"
lines=$(wc -l <"$tmp")
if [ "$lines" -lt 31000 ]; then
  echo "demo-corpus.sh: bible printed $lines verses, expected 31102" >&2
  exit 1
fi
"$newt" data prepare --in "$tmp" --out "$out"
