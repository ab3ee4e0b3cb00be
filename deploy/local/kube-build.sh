#!/usr/bin/env bash
# Build kube-apiserver, kubectl and etcd from the published Go modules.
#
# k8s.io/kubernetes is not meant to be imported: its go.mod replaces every k8s.io/* staging
# module with a path inside its own tree. A tiny module of ours requires it and replaces each
# staging module with its published v0.X.Y tag instead, which is the same code. The binaries
# land in $BN_CACHE/kube/<version>/ and a second run reuses them in a second.
SERVICE=kube-build
source "$(dirname "$0")/lib.sh"

KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
out="$BN_CACHE/kube/$KUBE_VERSION"
if [[ -x $out/kube-apiserver && -x $out/kubectl && -x $out/etcd ]]; then
  exit 0
fi
# kube.sh and node.sh both need these and may run at once (make -j2): one builds, the
# other waits and finds them built.
mkdir -p "$BN_CACHE/kube"
exec 9>"$BN_CACHE/kube/.build-$KUBE_VERSION.lock"
flock 9
if [[ -x $out/kube-apiserver && -x $out/kubectl && -x $out/etcd ]]; then
  exit 0
fi
command -v go >/dev/null || die "go is required to build kube-apiserver"

work="$BN_CACHE/kube/build-$KUBE_VERSION"
mkdir -p "$work" "$out"
cd "$work"
log "building kube-apiserver, kubectl and etcd for $KUBE_VERSION (first run only; several minutes)"

# The list of staging modules comes from upstream's own go.mod, so it stays right for any
# version we pick.
GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >download.json
upstream_mod=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])' <download.json)
mapfile -t staging < <(grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$upstream_mod" | awk '{print $1}' | sort -u)
((${#staging[@]} > 10)) || die "could not read the staging modules from $upstream_mod"
go_directive=$(awk '/^go /{print $2; exit}' "$upstream_mod")

{
  echo "module bucketnotify.local/kubebuild"
  echo
  echo "go $go_directive"
  echo
  echo "require k8s.io/kubernetes $KUBE_VERSION"
  echo
  echo "replace ("
  for m in "${staging[@]}"; do echo "	$m => $m $STAGING_VERSION"; done
  echo ")"
} >go.mod
cat >tools.go <<'GO'
//go:build tools

package kubebuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/component-base/cli"
)
GO
cat >main.go <<'GO'
package kubebuild
GO
# etcd from the very server module kube-apiserver was tested against (its go.mod pins it),
# rather than Debian's 3.4, far older than what this apiserver release is tested with.
mkdir -p cmd/etcd
cat >cmd/etcd/main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
GOFLAGS=-mod=mod go get "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null 2>&1 || true
GOFLAGS=-mod=mod go mod tidy
# -p 2: the machines have two cores; more parallel compiles only add memory pressure.
CGO_ENABLED=0 go build -p 2 -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION" -o "$out/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
CGO_ENABLED=0 go build -p 2 -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION" -o "$out/kubectl" k8s.io/kubernetes/cmd/kubectl
CGO_ENABLED=0 go build -p 2 -trimpath -ldflags "-s -w" -o "$out/etcd" ./cmd/etcd
log "built kube-apiserver, kubectl and etcd in $out"
