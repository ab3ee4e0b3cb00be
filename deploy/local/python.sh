#!/usr/bin/env bash
# The unit tests on a Python other than the host's 3.11: Debian trixie's Python 3.13, in a
# Debian root of its own (debootstrap, built once under $BN_CACHE/python-roots/), with a venv
# of the project's dependencies at requirements.lock's versions inside it. The repository is
# bind-mounted at the same path inside the root; each run installs the checkout it runs from
# into the venv (editable, without dependencies: seconds, no network), so another clone of the
# repository (CI's) uses the same venv, and pytest runs in place.
#
#   deploy/local/python.sh install        build the root and the venv (once; again when
#                                         requirements.lock or pyproject.toml change)
#   deploy/local/python.sh test [ARGS]    pytest ARGS (default: tests/unit) in the root
#   deploy/local/python.sh version        the root's Python version
#
# No service runs in the root: only the unit tier, which needs none, runs there. Debian ships
# 3.11 (bookworm, the host's) and 3.13 (trixie); 3.12 has no Debian release to take it from.
SERVICE=python
source "$(dirname "$0")/lib.sh"

SUITE=trixie
# make: unit tests read the Makefile's recipes with `make -n` (make report, make demo-down).
PYTHON_PACKAGES=(python3 python3-venv make)
ROOT=$BN_CACHE/python-roots/$SUITE
VENV=/opt/bucketnotify-venv
# What the venv was made from: a change to any of them makes it again.
STAMP=$(cat "$BN_REPO/requirements.lock" "$BN_REPO/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)

root_build() {
  # Made again when the package list changed (a root made before holds none of the new).
  [[ -f $ROOT/.bucketnotify-python &&
    $(cat "$ROOT/.bucketnotify-packages" 2>/dev/null) == "${PYTHON_PACKAGES[*]}" ]] && return 0
  log "building a Debian $SUITE root for its Python in $ROOT (once; a few minutes)"
  # Unmounted first: a run that died may have left the repository bind-mounted in it.
  unmount_all "$ROOT"
  rm -rf --one-file-system "${ROOT:?}"
  debian_root "$ROOT.tmp" "$SUITE" "$SUITE" "${PYTHON_PACKAGES[@]}" ca-certificates
  chroot "$ROOT.tmp" python3 --version >"$ROOT.tmp/.bucketnotify-python"
  echo "${PYTHON_PACKAGES[*]}" >"$ROOT.tmp/.bucketnotify-packages"
  mv "$ROOT.tmp" "$ROOT"
}

# The root's file systems and the repository, mounted while $1 runs; unmounted after.
in_root() {
  mount_system "$ROOT"
  # The host's trust, whatever it holds (a proxy's CA included): pip in the root reaches
  # PyPI the way the host's does.
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] &&
    cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
  mkdir -p "$ROOT$BN_REPO"
  mountpoint -q "$ROOT$BN_REPO" || mount --bind "$BN_REPO" "$ROOT$BN_REPO"
  local rc=0
  chroot "$ROOT" env HOME=/root PATH="$VENV/bin:/usr/bin:/bin" PYTHONDONTWRITEBYTECODE=1 \
    bash -c "cd '$BN_REPO' && $1" || rc=$?
  unmount_all "$ROOT"
  return $rc
}

venv_build() {
  [[ $(cat "$ROOT$VENV/.stamp" 2>/dev/null) == "$STAMP" ]] && return 0
  log "making the venv in the root: the project's dependencies at requirements.lock's versions"
  rm -rf "${ROOT:?}$VENV"
  in_root "python3 -m venv $VENV && $VENV/bin/pip install -q --upgrade pip &&
    $VENV/bin/pip install -q -c requirements.lock -e '.[dev,report]' hatchling editables" >"$ROOT.venv.log" 2>&1 ||
    die_with_log "installing the project in the root's venv failed" "$ROOT.venv.log"
  echo "$STAMP" >"$ROOT$VENV/.stamp"
}

# One run at a time: two would mount and unmount the same root under each other.
mkdir -p "$BN_CACHE"
exec 8>"$BN_CACHE/python-root.lock"
flock 8

case ${1:-} in
  install) root_build; venv_build; log "$(cat "$ROOT/.bucketnotify-python")" ;;
  test)
    shift
    root_build
    venv_build
    args=("${@:-tests/unit}")
    # This checkout, not the one the venv was made from (its path is in the venv's .pth).
    in_root "pip install -q --no-deps --no-build-isolation -e . && pytest -p no:cacheprovider ${args[*]}"
    ;;
  version) cat "$ROOT/.bucketnotify-python" ;;
  *) die "usage: $0 install|test [pytest args]|version" ;;
esac
