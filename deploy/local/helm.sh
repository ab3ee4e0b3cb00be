#!/usr/bin/env bash
# The helm CLI, built from its Go module (lib.sh's go_tool). The tests render
# charts/bucketnotify with it and `make lint` runs `helm lint`.
#
#   helm.sh install   build it once (several minutes on two cores)
#   helm.sh path      print the binary's path (building it first when missing)
SERVICE=helm
source "$(dirname "$0")/lib.sh"

HELM_VERSION=${HELM_VERSION:-v3.22.0}
go_tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
  "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "${1:-}"
