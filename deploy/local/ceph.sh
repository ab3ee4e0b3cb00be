#!/usr/bin/env bash
# A real, minimal Ceph cluster for the integration tests: one monitor, one memstore OSD and
# one RADOS Gateway, all bound to 127.0.0.1 and run as plain processes (no systemd, no
# containers), with two S3 users of fixed keys. The tests read the endpoint and keys from
# $BN_RUN/ceph-$CEPH_RELEASE/env.
#
# CEPH_RELEASE picks the Ceph release (the one users run today by default):
#   tentacle  Ceph 20.2 (default)   Debian forky's packages    ports 18000 18443 16789 13300
#   reef      Ceph 18.2             Debian trixie's packages   ports 18100 18543 16889 13400
#   pacific   Ceph 16.2             this host's own packages   ports 18200 18643 16989 13500
# A release other than the host's runs from a Debian root of its own (debootstrap, built once
# under $BN_CACHE/ceph-roots/, its package versions pinned below), every daemon and tool
# through chroot: its keys and on-disk formats are not the host's. $BN_RUN/ceph-<release> is
# bind-mounted at the same path inside the root, so one ceph.conf path works inside and out.
# Several releases run side by side, each on its own ports; RADOSGW_ADMIN in the env file is the
# command line of the release's own radosgw-admin, CEPH_TOOLS_PREFIX what runs any other of its
# tools (ceph, rados).
#
#   deploy/local/ceph.sh install  install the packages or build the root (start does it too)
#   deploy/local/ceph.sh start    bring it up (a second call while it runs returns at once)
#   deploy/local/ceph.sh stop     kill every daemon it started and delete its state
#   deploy/local/ceph.sh status   exit 0 when it is running
#   deploy/local/ceph.sh gateway-stop|gateway-start
#                                 kill radosgw alone, or start it again on the same cluster:
#                                 the monitor and the OSD (and so every object, bucket, topic
#                                 and persistent queue) stay. For fault tests on a cluster of
#                                 their own; never run them against one that others use.
#
# Ports (loopback only) can be moved with CEPH_RGW_PORT (S3/SNS, default 18000),
# CEPH_RGW_TLS_PORT (the same over HTTPS, default 18443; RGW_TLS_ENDPOINT and the CA that
# signed its certificate, RGW_CA_PEM, in the env file), CEPH_MON_PORT (msgr v1, default
# 16789) and CEPH_MON_V2_PORT (msgr v2, default 13300); the
# defaults stay clear of Ceph's own 6789/3300 so a real cluster on the machine is left alone.
# No manager daemon runs: RGW and bucket notifications work without one, and it would cost
# memory and start time.
SERVICE=ceph
source "$(dirname "$0")/lib.sh"

CEPH_RELEASE=${CEPH_RELEASE:-tentacle}
# The packages each root installs, exactly: a rebuilt root is the gateway the tests measured.
case $CEPH_RELEASE in
  tentacle) SUITE=forky; BOOTSTRAP_SCRIPT=sid; CEPH_VERSION=20.2.4+ds-2; PORT_SHIFT=0 ;;
  reef) SUITE=trixie; BOOTSTRAP_SCRIPT=trixie; CEPH_VERSION=18.2.7+ds-1+deb13u1; PORT_SHIFT=100 ;;
  pacific) SUITE=""; PORT_SHIFT=200 ;;
  *) die "CEPH_RELEASE=$CEPH_RELEASE is not one of tentacle, reef, pacific" ;;
esac
CEPH_PACKAGES=(ceph-mon ceph-osd radosgw ceph-common)
ROOT=""
[[ -n $SUITE ]] && ROOT="$BN_CACHE/ceph-roots/$CEPH_RELEASE"
# "${IN_RELEASE[@]}" CMD...: a Ceph program of the release, inside its root or the host's own.
IN_RELEASE=()
[[ -n $ROOT ]] && IN_RELEASE=(chroot "$ROOT")

RGW_PORT=${CEPH_RGW_PORT:-$((18000 + PORT_SHIFT))}
# The same gateway over HTTPS (a CA made at each start): Ceph 16.2 takes a topic's broker
# credentials only over HTTPS (docs/operator.md).
RGW_TLS_PORT=${CEPH_RGW_TLS_PORT:-$((18443 + PORT_SHIFT))}
MON_PORT=${CEPH_MON_PORT:-$((16789 + PORT_SHIFT))}
MON_V2_PORT=${CEPH_MON_V2_PORT:-$((13300 + PORT_SHIFT))}
# memstore keeps every object in the OSD's memory; tests write small objects only.
MEMSTORE_BYTES=${CEPH_MEMSTORE_BYTES:-$((1024 * 1024 * 1024))}

DIR="$BN_RUN/ceph-$CEPH_RELEASE"
CONF="$DIR/ceph.conf"
KEYRING="$DIR/keyring"
RGW_NAME=client.rgw.local
MON_LOG="$DIR/mon.a.log"
OSD_LOG="$DIR/osd.0.log"
RGW_LOG="$DIR/$RGW_NAME.log"
DAEMONS=(rgw osd mon)

TEST_UID=bucketnotify-test
TEST_ACCESS=BNTESTACCESSKEY0001
TEST_SECRET=bntestsecretkey0000000000000000000000001
OTHER_UID=bucketnotify-other
OTHER_ACCESS=BNOTHERACCESSKEY001
OTHER_SECRET=bnothersecretkey00000000000000000000000002
# RGW creates the zonegroup "default" on first start; it is the region in SNS topic ARNs.
REGION=default

running() {
  ours "$DIR/mon.pid" && ours "$DIR/osd.pid" && ours "$DIR/rgw.pid" && port_open "$RGW_PORT" && [[ -f $DIR/env ]]
}

# Two test sessions starting (or one starting, one stopping) the cluster at once must not
# build it twice or tear it down half-built. The lock file lives outside $DIR, which stop deletes.
lock() {
  mkdir -p "$BN_RUN"
  exec 9>"$BN_RUN/.ceph-$CEPH_RELEASE.lock"
  flock 9
}

# A pid file that outlived its daemon (a reboot, say) may name somebody else's process now:
# only a process started with our config file is ours to kill.
ours() { pid_alive "$1" && grep -aqF -- "$CONF" "/proc/$(cat "$1")/cmdline" 2>/dev/null; }

kill_daemons() {
  local d
  # KILL rather than TERM: memstore has nothing worth flushing, and a clean shutdown takes
  # each daemon about 2 s.
  for d in "${DAEMONS[@]}"; do
    if ours "$DIR/$d.pid"; then kill -9 "$(cat "$DIR/$d.pid")" 2>/dev/null || true; fi
  done
  for d in "${DAEMONS[@]}"; do
    if ours "$DIR/$d.pid"; then stop_pidfile "$DIR/$d.pid"; fi
  done
}

stop_all() {
  kill_daemons
  root_unmount
  rm -rf "$DIR"
}


# The root stays mounted while a daemon or tool of another run ($BN_RUN) still works in it.
root_unmount() {
  [[ -n $ROOT ]] || return 0
  mountpoint -q "$ROOT$DIR" && umount -l "$ROOT$DIR"
  local p
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/root" 2>/dev/null) == "$ROOT" ]] && return 0
  done
  # Another run's state directory still bound in: that run has not stopped.
  awk -v r="$ROOT/" 'index($2, r) == 1 {split(substr($2, length(r) + 1), a, "/");
    if (a[1] != "proc" && a[1] != "sys" && a[1] != "dev") f = 1} END {exit !f}' /proc/mounts && return 0
  unmount_all "$ROOT"
}

root_mount() {
  mount_system "$ROOT"
  mkdir -p "$ROOT$DIR"
  mountpoint -q "$ROOT$DIR" || mount --bind "$DIR" "$ROOT$DIR"
}

# Build the release's root once (lib.sh's debian_root).
root_build() {
  grep -qP "^radosgw\t\Q$CEPH_VERSION\E$" "$ROOT/.bucketnotify-ceph" 2>/dev/null && return 0
  if [[ -d $ROOT ]]; then
    log "the root in $ROOT is not Ceph $CEPH_VERSION: building it again"
    unmount_all "$ROOT"
    rm -rf --one-file-system "$ROOT"
  fi
  log "building a Debian $SUITE root for Ceph $CEPH_VERSION in $ROOT (once; a few minutes)"
  debian_root "$ROOT.tmp" "$SUITE" "$BOOTSTRAP_SCRIPT" "${CEPH_PACKAGES[@]/%/=$CEPH_VERSION}"
  chroot "$ROOT.tmp" dpkg-query -W "${CEPH_PACKAGES[@]}" >"$ROOT.tmp/.bucketnotify-ceph"
  mv "$ROOT.tmp" "$ROOT"
}

install() {
  if [[ -n $ROOT ]]; then
    root_build
  else
    apt_ensure "${CEPH_PACKAGES[@]}"
  fi
  # Asked once: start writes it into the env file too.
  INSTALLED_VERSION=$("${IN_RELEASE[@]}" radosgw --version 2>&1 | head -1)
  log "Ceph $CEPH_RELEASE: $INSTALLED_VERSION"
}

# spawn NAME LOGFILE CMD...: run a daemon in the foreground of its own session, so that a
# Ctrl-C in the terminal of the test run that started it does not take the cluster down too.
# Its own stderr goes to its log: errors before the log file is open must show up there too.
spawn() {
  local name=$1 logfile=$2; shift 2
  # 9>&-: a daemon that kept the start lock open would hold it for as long as it runs.
  setsid "$@" -f </dev/null >>"$logfile" 2>&1 9>&- &
  echo $! >"$DIR/$name.pid"
  # Not our job to report on: a failed start kills it, and bash would print "Killed".
  disown $!
}

write_conf() {
  local fsid=$1
  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$MON_V2_PORT,v1:127.0.0.1:$MON_PORT]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
keyring = $KEYRING
run dir = $DIR
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
# One OSD: pools of a single replica on it, placed without looking for other hosts.
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
# No manager runs, so nothing would act on the autoscaler; RGW's pools stay small instead.
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool delete = true
# Every pool RGW makes costs a few monitor writes, and a monitor batches writes for 1 s by
# default: with one monitor and nothing to batch, that wait was most of a cold start.
paxos propose interval = 0.05
# Only Ceph clients older than 2021 need the insecure reclaim; allowing it is a health warning.
auth allow insecure global id reclaim = false
# A monitor stops itself below 5 % free disk by default; a dev machine's /tmp may be that full,
# and what it stores here is a few MiB that are thrown away at stop.
mon data avail warn = 2
mon data avail crit = 1
# The CLI tools share this file: without these lines they would log and open admin sockets
# under /var/run/ceph and /var/log/ceph, and two radosgw-admin at once would fight over one.
log file =
admin socket =

[mon]
admin socket = $DIR/\$name.asok
mon data = $DIR/mon.\$id
log file = $DIR/\$name.log

[osd]
admin socket = $DIR/\$name.asok
osd data = $DIR/osd.\$id
osd objectstore = memstore
memstore device bytes = $MEMSTORE_BYTES
log file = $DIR/\$name.log

[$RGW_NAME]
admin socket = $DIR/\$name.asok
# tcp_nodelay: without it every LIST/GET waits ~40 ms on Nagle + delayed ACK.
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT ssl_endpoint=127.0.0.1:$RGW_TLS_PORT ssl_certificate=$DIR/tls/server.crt ssl_private_key=$DIR/tls/server.key tcp_nodelay=1
rgw data = $DIR/rgw
log file = $RGW_LOG
EOF
}

# Keys for every daemon and client in one keyring; the monitor imports them all at mkfs, so
# no `ceph auth add` round trip is needed once it runs.
write_keyring() {
  rm -f "$KEYRING"
  "${IN_RELEASE[@]}" ceph-authtool --create-keyring "$KEYRING" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  "${IN_RELEASE[@]}" ceph-authtool "$KEYRING" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
  "${IN_RELEASE[@]}" ceph-authtool "$KEYRING" --gen-key -n osd.0 \
    --cap mon 'allow profile osd' --cap osd 'allow *' --cap mgr 'allow profile osd' >/dev/null
  "${IN_RELEASE[@]}" ceph-authtool "$KEYRING" --gen-key -n "$RGW_NAME" \
    --cap mon 'allow rw' --cap osd 'allow rwx' --cap mgr 'allow rw' >/dev/null
  chmod 600 "$KEYRING"
}

osd_active() { grep -q 'state: booting -> active' "$OSD_LOG"; }

# await NAME SECONDS LOGFILE -- CMD...: wait for CMD, but give up at once when the daemon has
# exited: a crash at startup should fail the run with its log now, not after the timeout.
await() {
  local name=$1 secs=$2 logfile=$3; shift 4
  wait_for "$name" "$secs" "$logfile" -- up_or_gone "$name" "$@"
  ours "$DIR/$name.pid" || die_with_log "$name exited while starting" "$logfile"
}
up_or_gone() { local name=$1; shift; ! ours "$DIR/$name.pid" || "$@"; }

create_user() {
  local uid=$1 name=$2 access=$3 secret=$4 out
  if ! out=$("${IN_RELEASE[@]}" radosgw-admin -c "$CONF" user create --uid="$uid" --display-name="$name" \
    --access-key="$access" --secret-key="$secret" 2>&1); then
    # Only these users are ever made with these keys, so one that exists is the one we want.
    grep -q 'exists' <<<"$out" || die "could not create RGW user $uid: $out"
  fi
}

start() {
  install
  lock
  running && return 0
  # A daemon that dies while the cluster is made fails this attempt (seen once in a full
  # run: 16.2's monitor gone at its start without a line in its log, never again in a
  # dozen starts). One more from scratch, the first attempt's state kept for whoever looks.
  # Not in a condition: errexit must hold inside the attempt.
  set +e
  (start_cluster)
  local rc=$?
  set -e
  ((rc == 0)) && return 0
  local kept=$BN_RUN/ceph-$CEPH_RELEASE.failed-start
  rm -rf "$kept"
  cp -r "$DIR" "$kept" 2>/dev/null || true
  log "the cluster did not start (its state and logs: $kept); starting it once more"
  start_cluster
}

start_cluster() {
  # Leftovers of a cluster that died: memstore lost its data with it, so start from scratch.
  stop_all
  # A start that fails leaves no daemon behind, but keeps the logs for whoever looks next.
  trap '(($? == 0)) || kill_daemons' EXIT
  port_open "$RGW_PORT" && die "port $RGW_PORT is taken by another process (set CEPH_RGW_PORT)"
  port_open "$RGW_TLS_PORT" && die "port $RGW_TLS_PORT is taken by another process (set CEPH_RGW_TLS_PORT)"
  port_open "$MON_PORT" && die "port $MON_PORT is taken by another process (set CEPH_MON_PORT)"
  port_open "$MON_V2_PORT" && die "port $MON_V2_PORT is taken by another process (set CEPH_MON_V2_PORT)"

  log "starting a Ceph $CEPH_RELEASE cluster (mon, memstore osd, radosgw on 127.0.0.1:$RGW_PORT)"
  mkdir -p "$DIR/mon.a" "$DIR/osd.0" "$DIR/rgw"
  [[ -n $ROOT ]] && root_mount
  local fsid osd_uuid
  fsid=$(cat /proc/sys/kernel/random/uuid)
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  write_conf "$fsid"
  write_keyring
  make_server_tls "$DIR/tls" "bucketnotify local RGW CA"

  # The initial osdmap already holds osd.0, so the OSD can be made and started alongside the
  # monitor instead of waiting for it to answer an `osd new`.
  "${IN_RELEASE[@]}" monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$MON_V2_PORT,v1:127.0.0.1:$MON_PORT]" \
    "$DIR/monmap" >/dev/null
  "${IN_RELEASE[@]}" osdmaptool -c "$CONF" --createsimple 1 --clobber "$DIR/osdmap" >>"$MON_LOG" 2>&1 ||
    die_with_log "osdmaptool failed" "$MON_LOG"
  "${IN_RELEASE[@]}" ceph-mon -c "$CONF" -i a --mkfs --monmap "$DIR/monmap" --osdmap "$DIR/osdmap" \
    --keyring "$KEYRING" >>"$MON_LOG" 2>&1 || die_with_log "ceph-mon --mkfs failed" "$MON_LOG"
  "${IN_RELEASE[@]}" ceph-osd -c "$CONF" -i 0 --mkfs --no-mon-config --osd-uuid "$osd_uuid" >>"$OSD_LOG" 2>&1 ||
    die_with_log "ceph-osd --mkfs failed" "$OSD_LOG"

  spawn mon "$MON_LOG" "${IN_RELEASE[@]}" ceph-mon -c "$CONF" -i a
  spawn osd "$OSD_LOG" "${IN_RELEASE[@]}" ceph-osd -c "$CONF" -i 0
  await mon 30 "$MON_LOG" -- port_open "$MON_PORT"
  await osd 60 "$OSD_LOG" -- osd_active
  # Not earlier: a gateway that makes its first pool before the OSD is up leaves its writes
  # parked until its next 5 s tick, which doubled the start time.
  spawn rgw "$RGW_LOG" "${IN_RELEASE[@]}" radosgw -c "$CONF" -n "$RGW_NAME"
  await rgw 60 "$RGW_LOG" -- port_open "$RGW_PORT"

  local pids=()
  create_user "$TEST_UID" "bucketnotify test" "$TEST_ACCESS" "$TEST_SECRET" & pids+=($!)
  create_user "$OTHER_UID" "bucketnotify other" "$OTHER_ACCESS" "$OTHER_SECRET" & pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || exit 1; done

  write_env "$DIR/env" \
    "RGW_ENDPOINT=http://127.0.0.1:$RGW_PORT" \
    "RGW_TLS_ENDPOINT=https://127.0.0.1:$RGW_TLS_PORT" \
    "RGW_CA_PEM=$DIR/tls/ca.crt" \
    "RGW_REGION=$REGION" \
    "RGW_USER=$TEST_UID" \
    "RGW_ACCESS_KEY=$TEST_ACCESS" \
    "RGW_SECRET_KEY=$TEST_SECRET" \
    "RGW_OTHER_USER=$OTHER_UID" \
    "RGW_OTHER_ACCESS_KEY=$OTHER_ACCESS" \
    "RGW_OTHER_SECRET_KEY=$OTHER_SECRET" \
    "CEPH_RELEASE=$CEPH_RELEASE" \
    "CEPH_VERSION=$(awk '{print $3}' <<<"$INSTALLED_VERSION")" \
    "RADOSGW_ADMIN=${ROOT:+chroot $ROOT }radosgw-admin" \
    "CEPH_TOOLS_PREFIX=${ROOT:+chroot $ROOT}" \
    "CEPH_CONF=$CONF" \
    "CEPH_KEYRING=$KEYRING" \
    "CEPH_LOG=$RGW_LOG"
  trap - EXIT
  log "ready: RGW at http://127.0.0.1:$RGW_PORT, connection details in $DIR/env"
}

gateway_stop() {
  lock
  [[ -f $DIR/env ]] || die "not started: no gateway to stop"
  if ours "$DIR/rgw.pid"; then
    # KILL, as a crash would: whatever it had not committed is lost, which is the point.
    kill -9 "$(cat "$DIR/rgw.pid")" 2>/dev/null || true
    stop_pidfile "$DIR/rgw.pid"
  fi
  local deadline=$((SECONDS + 10))
  while port_open "$RGW_PORT"; do
    ((SECONDS < deadline)) || die "port $RGW_PORT still open after radosgw was killed"
    sleep 0.1
  done
}

gateway_start() {
  lock
  [[ -f $DIR/env ]] || die "not started: start the cluster first"
  ours "$DIR/mon.pid" && ours "$DIR/osd.pid" || die "the monitor or the OSD is gone: stop and start afresh"
  ours "$DIR/rgw.pid" && return 0
  [[ -n $ROOT ]] && root_mount
  spawn rgw "$RGW_LOG" "${IN_RELEASE[@]}" radosgw -c "$CONF" -n "$RGW_NAME"
  await rgw 60 "$RGW_LOG" -- port_open "$RGW_PORT"
}

case ${1:-} in
  install) install ;;
  start) start ;;
  gateway-stop) gateway_stop ;;
  gateway-start) gateway_start ;;
  stop)
    lock
    stop_all
    ;;
  status)
    if running; then
      log "running: Ceph $CEPH_RELEASE, RGW at http://127.0.0.1:$RGW_PORT"
    else
      log "not running"
      exit 1
    fi
    ;;
  *) die "usage: $0 install|start|stop|status|gateway-stop|gateway-start" ;;
esac
