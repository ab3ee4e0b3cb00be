#!/usr/bin/env bash
# Prometheus' promtool, built from its Go module (lib.sh's go_tool). The tests run
# `promtool test rules` on the chart's alerts.
#
#   promtool.sh install   build it once (minutes on two cores)
#   promtool.sh path      print the binary's path (building it first when missing)
SERVICE=promtool
source "$(dirname "$0")/lib.sh"

# Prometheus 3.x publishes its Go module as v0.3xx.y (v0.316.0 is Prometheus 3.16.0).
PROMTOOL_VERSION=${PROMTOOL_VERSION:-v0.316.0}
go_tool promtool "$PROMTOOL_VERSION" github.com/prometheus/prometheus/cmd/promtool "-s -w" "${1:-}"
