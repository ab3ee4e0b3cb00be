#!/usr/bin/env bash
# Build the helm CLI from its published Go module (no prebuilt download is reachable from CI).
# The tests render charts/bucketnotify with it and `make lint` runs `helm lint`. The binary
# lands in $BN_CACHE/helm/<version>/helm and a second run reuses it in a second.
#
#   helm.sh install   build it once (several minutes on two cores)
#   helm.sh path      print the binary's path (building it first when missing)
SERVICE=helm
source "$(dirname "$0")/lib.sh"

HELM_VERSION=${HELM_VERSION:-v3.22.0}
out="$BN_CACHE/helm/$HELM_VERSION"
bin="$out/helm"

install() {
  [[ -x $bin ]] && return 0
  command -v go >/dev/null || die "go is required to build helm"
  mkdir -p "$out"
  log "building helm $HELM_VERSION (first run only; several minutes)"
  # GOBIN install keeps the module cache shared with kube-build.sh; -p 2 because the machines
  # have two cores and more parallel compiles only add memory pressure.
  GOBIN="$out" CGO_ENABLED=0 go install -p 2 -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  "$bin" version --short >/dev/null || die "the built helm does not run"
  log "built $("$bin" version --short) in $out"
}

case ${1:-} in
  install) install ;;
  path) install; echo "$bin" ;;
  *) die "usage: $0 install|path" ;;
esac
