#!/usr/bin/env bash
# Headless Chromium from Debian, for the test that opens the Spark job's HTML report the way
# a person would (a browser) and for screenshots of it. Debian's package, not a browser
# build of its own: CI reaches Debian's mirrors and nothing else.
#
#   chromium.sh install   install it once (apt; quiet and quick when already there)
#   chromium.sh path      print the binary's path (installing it first when missing)
SERVICE=chromium
source "$(dirname "$0")/lib.sh"

install() { apt_ensure chromium fonts-dejavu-core; }

case ${1:-} in
  install) install ;;
  path) install; command -v chromium ;;
  *) echo "usage: $0 install|path" >&2; exit 2 ;;
esac
