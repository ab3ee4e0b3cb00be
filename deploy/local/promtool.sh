#!/usr/bin/env bash
# Build Prometheus' promtool from its published Go module (no prebuilt download is reachable
# from CI). The tests run `promtool test rules` on the chart's alerts. The binary lands in
# $BN_CACHE/promtool/<version>/promtool and a second run reuses it in a second.
#
#   promtool.sh install   build it once (minutes on two cores)
#   promtool.sh path      print the binary's path (building it first when missing)
SERVICE=promtool
source "$(dirname "$0")/lib.sh"

# Prometheus 3.x publishes its Go module as v0.3xx.y (v0.316.0 is Prometheus 3.16.0).
PROMTOOL_VERSION=${PROMTOOL_VERSION:-v0.316.0}
out="$BN_CACHE/promtool/$PROMTOOL_VERSION"
bin="$out/promtool"

install() {
  [[ -x $bin ]] && return 0
  command -v go >/dev/null || die "go is required to build promtool"
  mkdir -p "$out"
  log "building promtool $PROMTOOL_VERSION (first run only; minutes)"
  # As helm.sh: the module cache is shared with the other Go builds; -p 2 for two cores.
  GOBIN="$out" CGO_ENABLED=0 go install -p 2 -trimpath -ldflags "-s -w" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
  "$bin" --version >/dev/null 2>&1 || die "the built promtool does not run"
  log "built promtool $PROMTOOL_VERSION in $out"
}

case ${1:-} in
  install) install ;;
  path) install; echo "$bin" ;;
  *) die "usage: $0 install|path" ;;
esac
