#!/bin/sh
# `make demo`: the main job on its single-host default. It grows with the project.
set -eu
newt=${1:-build/newt}
exec "$newt" demo
