# Shared helpers for the scripts that install and start the real services used by tests and
# the local demo. Sourced, never executed.
#
# Layout on disk (both outside the repo so a fresh clone reuses what an earlier run built):
#   $BN_CACHE  built or downloaded artefacts that survive between runs (binaries, jars)
#   $BN_RUN    runtime state of started services: one directory per service holding its
#              data, its log, its pid file and an `env` file of KEY=VALUE connection details
#              that the pytest fixtures and the demo read.
set -euo pipefail

BN_CACHE=${BN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bucketnotify}
BN_RUN=${BN_RUN:-/tmp/bucketnotify-local}
BN_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export BN_CACHE BN_RUN BN_REPO

log() { printf '[%s] %s\n' "${SERVICE:-local}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Fail with the tail of a service log: a service that does not come up must say why.
die_with_log() {
  local msg=$1 logfile=$2
  log "ERROR: $msg"
  if [[ -f $logfile ]]; then
    log "last lines of $logfile:"
    tail -n 40 "$logfile" >&2 || true
  fi
  exit 1
}

# Install Debian packages only when one of them is missing (idempotent, quiet when warm).
apt_ensure() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  mkdir -p "$BN_CACHE"
  # `make test` installs its services side by side (make -j2): two apt-gets at once would
  # fail on apt's lock instead of waiting, so ours take turns.
  (
    flock 9
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  ) 9>"$BN_CACHE/apt.lock"
}

# --- Debian roots (debootstrap): a Ceph release or a Python other than the host's ------

# The Debian mirror this host's apt uses: the roots come from the same archive.
host_mirror() {
  local uri
  uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [[ -n $uri ]] || uri=$(awk '/^deb / && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [[ -n $uri ]] || die "no Debian mirror found in this host's apt sources"
  printf '%s\n' "$uri"
}

# The kernel's file systems a package's scripts and the programs run in root $1 need.
mount_system() {
  local root=$1
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  mountpoint -q "$root/sys" || mount --rbind /sys "$root/sys"
  mountpoint -q "$root/dev" || mount --rbind /dev "$root/dev"
}

# Everything mounted under root $1, deepest first. A root is never deleted with a mount in it:
# rm would go on into the host's /dev and /sys.
unmount_all() {
  local root=$1 target
  [[ -d $root ]] || return 0
  while read -r target; do
    umount -l "$target" 2>/dev/null || true
  done < <(awk -v r="$root/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r)
}

# debian_root DIR SUITE SCRIPT PACKAGE...: a minimal Debian SUITE made in DIR (debootstrap with
# its SCRIPT, then apt inside it: debootstrap's --include fails on a systemd pre-dependency of
# the Ceph packages), the PACKAGEs installed, nothing mounted in it when it returns. Packages
# never start services in it. The caller stamps it and moves it in place.
debian_root() {
  local dir=$1 suite=$2 script=$3 mirror apt=(apt-get -qq -o Acquire::Check-Valid-Until=false)
  shift 3
  apt_ensure debootstrap
  mirror=$(host_mirror)
  unmount_all "$dir"
  rm -rf --one-file-system "$dir"
  mkdir -p "$(dirname "$dir")"
  trap 'unmount_all "'"$dir"'"' EXIT
  debootstrap --variant=minbase "$suite" "$dir" "$mirror" \
    "/usr/share/debootstrap/scripts/$script" >"$dir.log" 2>&1 ||
    die_with_log "debootstrap of $suite failed" "$dir.log"
  printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
  chmod +x "$dir/usr/sbin/policy-rc.d"
  mount_system "$dir"
  # The archive may be a dated snapshot, whose Release files are past their Valid-Until.
  chroot "$dir" "${apt[@]}" update >>"$dir.log" 2>&1 || die_with_log "apt-get update in the root failed" "$dir.log"
  chroot "$dir" env DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends \
    "$@" >>"$dir.log" 2>&1 || die_with_log "installing $* in the root failed" "$dir.log"
  chroot "$dir" apt-get clean
  unmount_all "$dir"
  trap - EXIT
  rm -f "$dir.log"
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Stop the process whose pid is in $1: TERM, wait, then KILL.
stop_pidfile() {
  local pidfile=$1 pid
  pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

# wait_for DESCRIPTION SECONDS LOGFILE -- COMMAND...: poll COMMAND until it succeeds.
wait_for() {
  local what=$1 secs=$2 logfile=$3; shift 4
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die_with_log "$what did not become ready within ${secs}s" "$logfile"
    sleep 0.5
  done
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# write_env FILE KEY=VALUE...: the connection details the fixtures read.
write_env() {
  local file=$1; shift
  : >"$file.tmp"
  for kv in "$@"; do printf '%s\n' "$kv" >>"$file.tmp"; done
  mv "$file.tmp" "$file"
}

# make_server_tls DIR CA_NAME [clients]: in DIR, a CA (ca.crt) and a server certificate for
# 127.0.0.1 and localhost signed by it (server.crt, server.key), new at each start of a
# service. With `clients`, the CA also signs a client certificate (client.crt, client.key,
# and the same key encrypted with the password in client-key.password as
# client-encrypted.key), for listeners that require one. The CA's key is deleted once it has
# signed: nothing else is ever signed with it.
make_server_tls() {
  local tls=$1 name=$2 clients=${3:-}
  command -v openssl >/dev/null || apt_ensure openssl
  mkdir -p "$tls"
  (
    umask 077
    cd "$tls"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=$name" \
      -keyout ca.key -out ca.crt -addext basicConstraints=critical,CA:TRUE \
      -addext keyUsage=critical,keyCertSign,cRLSign
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server.key -out server.csr
    printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" "extendedKeyUsage=serverAuth" \
      "basicConstraints=CA:FALSE" >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
      -extfile server.ext -out server.crt
    if [[ $clients == clients ]]; then
      openssl req -newkey rsa:2048 -nodes -subj "/CN=bucketnotify-delivery" \
        -keyout client.key -out client.csr
      printf '%s\n' "extendedKeyUsage=clientAuth" "basicConstraints=CA:FALSE" >client.ext
      openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
        -extfile client.ext -out client.crt
      od -An -tx1 -N12 /dev/urandom | tr -d ' \n' >client-key.password
      openssl pkey -in client.key -aes256 -passout file:client-key.password \
        -out client-encrypted.key
      rm -f client.csr client.ext
    fi
    rm -f ca.key ca.srl server.csr server.ext
  ) >"$tls.log" 2>&1 || die_with_log "making the TLS listener's certificates failed" "$tls.log"
  chmod 644 "$tls/ca.crt"
}

# go_tool NAME VERSION PACKAGE LDFLAGS install|path: a CLI built from its published Go module
# (no prebuilt download is reachable from CI) into $BN_CACHE/NAME/VERSION/NAME once; `path`
# prints where it is. The module cache is shared with the other Go builds; -p 2 because the
# machines have two cores and more parallel compiles only add memory pressure.
go_tool() {
  local name=$1 version=$2 package=$3 ldflags=$4 action=${5:-}
  local out="$BN_CACHE/$name/$version"
  local bin="$out/$name"
  [[ $action == install || $action == path ]] || die "usage: $0 install|path"
  if [[ ! -x $bin ]]; then
    command -v go >/dev/null || die "go is required to build $name"
    mkdir -p "$out"
    log "building $name $version (first run only; minutes on two cores)"
    GOBIN="$out" CGO_ENABLED=0 go install -p 2 -trimpath -ldflags "$ldflags" "$package@$version"
    "$bin" --help >/dev/null 2>&1 || die "the built $name does not run"
    log "built $name $version in $out"
  fi
  if [[ $action == path ]]; then echo "$bin"; fi
}
