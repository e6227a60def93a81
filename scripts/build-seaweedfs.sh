#!/usr/bin/env bash
# SeaweedFS's `weed` into .tools/bin/weed, from the Go module proxy at one pinned version: the compiled
# S3 endpoint the benchmarks may use instead of moto (devtools/services.py, start_s3(kind="seaweedfs")).
# Idempotent: does nothing when the binary of this version is there. `make s3-compiled` runs it.
#
# `go install …/weed@version` refuses the module (its go.mod has a replace directive), so the module is
# downloaded, copied to a writable directory and built there, with its own go.mod as the main module.
# Go's caches stay under .tools/go; nothing outside the checkout is written.
set -euo pipefail

MODULE=github.com/seaweedfs/seaweedfs
VERSION=v0.0.0-20261109003541-7506e5f91cd6

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=${TOOLS_DIR:-$REPO/.tools}
BIN=$TOOLS/bin/weed
STAMP=$BIN.version
SRC=$TOOLS/src/seaweedfs-${VERSION##*-}

if [[ -x $BIN && -f $STAMP && $(cat "$STAMP") == "$MODULE@$VERSION" ]]; then
	echo "$BIN is $MODULE@$VERSION already"
	exit 0
fi
command -v go >/dev/null || { echo "error: Go is required to build SeaweedFS (https://go.dev/dl/)" >&2; exit 1; }

export GOMODCACHE=$TOOLS/go/mod GOCACHE=$TOOLS/go/build GOPATH=$TOOLS/go/path
export GOFLAGS="-mod=mod -buildvcs=false"
mkdir -p "$TOOLS/bin" "$TOOLS/src" "$GOMODCACHE" "$GOCACHE" "$GOPATH"

dir=$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
[[ -n $dir && -f $dir/go.mod ]] || { echo "error: go mod download $MODULE@$VERSION gave no module directory" >&2; exit 1; }
# The module cache is read-only, and building in it would write go.sum updates there.
rm -rf "$SRC.tmp"
cp -r "$dir" "$SRC.tmp"
chmod -R u+w "$SRC.tmp"
rm -rf "$SRC"
mv "$SRC.tmp" "$SRC"

echo "building $MODULE@$VERSION (several minutes on 2 cores) ..."
start=$(date +%s)
(cd "$SRC" && nice -n 10 go build -o "$BIN.tmp" ./weed)
mv "$BIN.tmp" "$BIN"
echo "$MODULE@$VERSION" >"$STAMP"
echo "built $BIN ($(du -h "$BIN" | cut -f1)) in $(($(date +%s) - start)) s: $("$BIN" version 2>/dev/null | head -1)"
