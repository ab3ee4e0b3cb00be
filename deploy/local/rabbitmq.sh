#!/usr/bin/env bash
# Start, stop or check the RabbitMQ broker that the AMQP 0.9.1 tests publish to.
#
#   deploy/local/rabbitmq.sh start|restart|stop|status
#
# It runs the broker of the Debian rabbitmq-server package as an Erlang node of its own, never
# the package's system service: own node name, own epmd port, own cookie, own data, all under
# $BN_RUN/rabbitmq and all on 127.0.0.1, so it neither needs nor disturbs a system RabbitMQ on
# the default ports. Each start is a fresh broker (stop deletes the state), provisioned from
# rabbitmq/definitions.json.tmpl before its listener opens:
#   vhosts "/" and "bucketnotify"; users guest/guest (loopback only, RabbitMQ's default rule)
#   and $AMQP_USER/$AMQP_PASSWORD; both users have full permissions on both vhosts.
# Two listeners on 127.0.0.1: AMQP (plain) and AMQPS, TLS with a server certificate for
# 127.0.0.1/localhost signed by a CA made at each start (no client certificate asked for).
# $BN_RUN/rabbitmq/env holds AMQP_URL AMQP_HOST AMQP_PORT AMQPS_PORT AMQP_CA_PEM (the CA's
# certificate file) AMQP_USER AMQP_PASSWORD RABBITMQ_NODE RABBITMQ_LOG and RABBITMQCTL, a
# rabbitmqctl wrapper already pointed at this node (e.g. `$RABBITMQCTL list_queues -p
# bucketnotify`).
#
# With RABBITMQ_MTLS=1 (deploy/local/rabbitmq-mtls.sh) it is a second node beside the first,
# rabbitmq-mtls, whose AMQPS listener requires a client certificate signed by its CA (RabbitMQ
# has one set of TLS options for all its listeners, so one node cannot offer both): state in
# $BN_RUN/rabbitmq-mtls, ports 15675 and 15676, and in its env file also AMQP_CLIENT_CERT,
# AMQP_CLIENT_KEY, AMQP_CLIENT_ENCRYPTED_KEY and AMQP_CLIENT_KEY_PASSWORD (files).
#
# Overrides: RABBITMQ_PORT (AMQP, 15673), RABBITMQ_TLS_PORT (AMQPS, 15674),
# RABBITMQ_DIST_PORT (Erlang distribution, AMQP+10000),
# RABBITMQ_EPMD_PORT (14369), RABBITMQ_NODE, AMQP_USER, AMQP_PASSWORD, RABBITMQ_START_TIMEOUT.
MTLS=${RABBITMQ_MTLS:-}
SERVICE=rabbitmq${MTLS:+-mtls}
source "$(dirname "$0")/lib.sh"

if [[ -n $MTLS ]]; then
  AMQP_PORT=${RABBITMQ_PORT:-15675}
  AMQPS_PORT=${RABBITMQ_TLS_PORT:-15676}
  VERIFY=verify_peer
  FAIL_IF_NO_PEER_CERT=true
else
  AMQP_PORT=${RABBITMQ_PORT:-15673}
  AMQPS_PORT=${RABBITMQ_TLS_PORT:-15674}
  VERIFY=verify_none
  FAIL_IF_NO_PEER_CERT=false
fi
# Non-default distribution and epmd ports: a system RabbitMQ (25672, epmd 4369) and ours then
# share nothing, and the epmd we start is ours to stop.
DIST_PORT=${RABBITMQ_DIST_PORT:-$((AMQP_PORT + 10000))}
EPMD_PORT=${RABBITMQ_EPMD_PORT:-14369}
NODE=${RABBITMQ_NODE:-bucketnotify${MTLS:+-mtls}@localhost}
AMQP_USER=${AMQP_USER:-bntest}
AMQP_PASSWORD=${AMQP_PASSWORD:-bntest-secret-1}
START_TIMEOUT=${RABBITMQ_START_TIMEOUT:-60}

# Not /usr/sbin: those wrappers switch to the rabbitmq user with a clean environment, which
# would drop every setting below.
RMQ_BIN=/usr/lib/rabbitmq/bin
TEMPLATES=$(cd "$(dirname "$0")/rabbitmq" && pwd)
dir=$BN_RUN/$SERVICE
pidfile=$dir/pid
logfile=$dir/rabbitmq.log
envfile=$dir/env
ctl=$dir/rabbitmqctl

# Concurrent starts (parallel test workers) must not both launch a node. The broker must not
# inherit fd 9, or it would hold the lock for as long as it runs.
lock() {
  mkdir -p "$BN_RUN"
  exec 9>"$BN_RUN/.$SERVICE.lock"
  flock 9
}

ensure_installed() {
  local fresh=0
  dpkg-query -W -f='${Status}' rabbitmq-server 2>/dev/null | grep -q "install ok installed" || fresh=1
  apt_ensure rabbitmq-server
  if ((fresh)); then
    # The package's postinst starts the system broker on 0.0.0.0:5672. We installed the package
    # only for its binaries; a second, world-reachable broker is just a liability.
    log "stopping the system rabbitmq-server service that the package install started"
    service rabbitmq-server stop >/dev/null 2>&1 || true
  fi
}

hex_bytes() {
  local hex=$1 fmt="" i
  for ((i = 0; i < ${#hex}; i += 2)); do fmt+="\\x${hex:i:2}"; done
  # shellcheck disable=SC2059 # the format is nothing but \xHH escapes built from hex digits
  printf "$fmt"
}

# rabbit_password_hashing_sha256, the format definitions files carry: a 4-byte salt followed by
# sha256(salt ++ password), base64. Computed here so that only hashes land in the state dir.
password_hash() {
  local salt digest
  salt=$(od -An -tx1 -N4 /dev/urandom | tr -d ' \n')
  digest=$({ hex_bytes "$salt"; printf '%s' "$1"; } | sha256sum | cut -c1-64)
  hex_bytes "$salt$digest" | base64 -w0
}

write_config() {
  mkdir -p "$dir/home" "$dir/mnesia" "$dir/log"
  # The cookie is read from $HOME by both the node and rabbitmqctl; a random one per start keeps
  # any other Erlang node on this machine from talking to ours.
  od -An -tx1 -N20 /dev/urandom | tr -d ' \n' >"$dir/home/.erlang.cookie"
  chmod 400 "$dir/home/.erlang.cookie"
  echo '[].' >"$dir/enabled_plugins"
  make_server_tls "$dir/tls" "bucketnotify local RabbitMQ CA" "${MTLS:+clients}"
  sed -e "s|@AMQP_PORT@|$AMQP_PORT|" -e "s|@AMQPS_PORT@|$AMQPS_PORT|" \
    -e "s|@VERIFY@|$VERIFY|" -e "s|@FAIL_IF_NO_PEER_CERT@|$FAIL_IF_NO_PEER_CERT|" \
    -e "s|@TLS@|$dir/tls|g" -e "s|@DEFINITIONS@|$dir/definitions.json|" \
    "$TEMPLATES/rabbitmq.conf.tmpl" >"$dir/rabbitmq.conf"
  sed -e "s|@GUEST_HASH@|$(password_hash guest)|" \
    -e "s|@AMQP_USER_HASH@|$(password_hash "$AMQP_PASSWORD")|" \
    -e "s|@AMQP_USER@|$AMQP_USER|g" \
    "$TEMPLATES/definitions.json.tmpl" >"$dir/definitions.json"
  # One settings file read by both rabbitmq-server and rabbitmqctl (RABBITMQ_CONF_ENV_FILE also
  # keeps /etc/rabbitmq/rabbitmq-env.conf out of the picture). inet_dist_use_interface keeps
  # the distribution listeners of the node and of every rabbitmqctl call on loopback.
  cat >"$dir/rabbitmq-env.conf" <<EOF
NODENAME=$NODE
MNESIA_BASE=$dir/mnesia
LOG_BASE=$dir/log
CONFIG_FILE=$dir/rabbitmq.conf
ENABLED_PLUGINS_FILE=$dir/enabled_plugins
PID_FILE=$dir/beam.pid
DIST_PORT=$DIST_PORT
ERL_EPMD_PORT=$EPMD_PORT
ERL_EPMD_ADDRESS=127.0.0.1
SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
EOF
  cat >"$ctl" <<EOF
#!/bin/sh
# rabbitmqctl for the bucketnotify test node (written by deploy/local/rabbitmq.sh).
HOME=$dir/home RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf exec $RMQ_BIN/rabbitmqctl -n $NODE "\$@"
EOF
  chmod +x "$ctl"
}

# Kill what start launched: the process group of rabbitmq-server (setsid made it the leader),
# then our epmd once no node is registered with it any more.
kill_processes() {
  if [[ -f $pidfile ]]; then
    local pid
    pid=$(cat "$pidfile")
    stop_pidfile "$pidfile"
    if pgrep -g "$pid" >/dev/null 2>&1; then
      kill -TERM -- "-$pid" 2>/dev/null || true
      sleep 1
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
  fi
  if ERL_EPMD_PORT=$EPMD_PORT epmd -names >/dev/null 2>&1 &&
    ! ERL_EPMD_PORT=$EPMD_PORT epmd -names 2>/dev/null | grep -q '^name '; then
    ERL_EPMD_PORT=$EPMD_PORT epmd -kill >/dev/null 2>&1 || true
  fi
}

# Leave the state dir for inspection (the next start cleans it up) but no processes behind.
fail() {
  kill_processes
  # A boot failure ends in a long crash report; the cause is in the first error lines.
  if grep -q ' \[error\] ' "$logfile" 2>/dev/null; then
    log "first errors in $logfile:"
    grep -m 6 ' \[error\] ' "$logfile" >&2 || true
  fi
  die_with_log "$1" "$logfile"
}

stop_broker() {
  if pid_alive "$pidfile" && [[ -x $ctl ]]; then
    # A clean stop takes a couple of seconds; TERM alone works too but logs a crash report.
    timeout 30 "$ctl" -q stop >/dev/null 2>&1 || true
  fi
  kill_processes
  rm -rf "$dir"
}

# Start the node on what write_config wrote and wait until it has booted.
launch() {
  local version
  version=$(dpkg-query -W -f='${Version}' rabbitmq-server)
  log "starting RabbitMQ $version as $NODE on 127.0.0.1:$AMQP_PORT (AMQPS :$AMQPS_PORT)"
  (
    cd "$dir"
    HOME=$dir/home RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf \
      setsid nohup "$RMQ_BIN/rabbitmq-server" >>"$logfile" 2>&1 </dev/null 9>&- &
    echo $! >"$pidfile"
  )

  # Poll the port first: each rabbitmqctl call is a whole Erlang VM (~1s of CPU) that would
  # compete with the booting node on a 2-core machine. The AMQP listener opens after the
  # definitions are loaded, and await_startup then confirms the boot really completed.
  local deadline=$((SECONDS + START_TIMEOUT))
  until port_open "$AMQP_PORT" && port_open "$AMQPS_PORT"; do
    pid_alive "$pidfile" || fail "RabbitMQ exited during startup"
    ((SECONDS < deadline)) || fail "RabbitMQ did not become ready within ${START_TIMEOUT}s"
    sleep 0.2
  done
  "$ctl" -q await_startup --timeout $((deadline - SECONDS > 5 ? deadline - SECONDS : 5)) >/dev/null 2>&1 ||
    fail "RabbitMQ opened its port but did not finish booting (rabbitmqctl await_startup)"
}

start() {
  lock
  if pid_alive "$pidfile" && [[ -f $envfile ]]; then
    exit 0
  fi
  if [[ -e $dir ]]; then
    log "cleaning up after an earlier start that did not finish"
    stop_broker
  fi
  ensure_installed
  local port
  for port in "$AMQP_PORT" "$AMQPS_PORT" "$DIST_PORT"; do
    port_open "$port" && die "port $port is already in use (ss -ltnp 'sport = :$port')"
  done

  write_config
  local began=$SECONDS
  launch
  write_env "$envfile" \
    "AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/" \
    "AMQP_HOST=127.0.0.1" \
    "AMQP_PORT=$AMQP_PORT" \
    "AMQPS_PORT=$AMQPS_PORT" \
    "AMQP_CA_PEM=$dir/tls/ca.crt" \
    "AMQP_USER=$AMQP_USER" \
    "AMQP_PASSWORD=$AMQP_PASSWORD" \
    "RABBITMQ_NODE=$NODE" \
    "RABBITMQ_LOG=$logfile" \
    "RABBITMQCTL=$ctl" \
    ${MTLS:+"AMQP_CLIENT_CERT=$dir/tls/client.crt"} \
    ${MTLS:+"AMQP_CLIENT_KEY=$dir/tls/client.key"} \
    ${MTLS:+"AMQP_CLIENT_ENCRYPTED_KEY=$dir/tls/client-encrypted.key"} \
    ${MTLS:+"AMQP_CLIENT_KEY_PASSWORD=$dir/tls/client-key.password"}
  log "ready on 127.0.0.1:$AMQP_PORT after $((SECONDS - began))s (details in $envfile)"
}

stop() {
  lock
  [[ -e $dir ]] || return 0
  stop_broker
  log "stopped"
}

# Stop the node and boot it again on the same data (durable queues and the persistent
# messages in them stay), ports and cookie: what a test of a broker restart needs, where
# start/stop always begin afresh. Never run it against a broker that others are using.
restart() {
  lock
  [[ -f $envfile && -f $dir/rabbitmq-env.conf ]] || die "not started: nothing to restart"
  local began=$SECONDS
  if pid_alive "$pidfile"; then
    timeout 30 "$ctl" -q stop >/dev/null 2>&1 || true
  fi
  kill_processes
  log "restarting RabbitMQ as $NODE on 127.0.0.1:$AMQP_PORT with its data"
  launch
  log "ready again after $((SECONDS - began))s"
}

status() {
  if pid_alive "$pidfile" && [[ -f $envfile ]] && port_open "$AMQP_PORT"; then
    echo "$SERVICE: running as $NODE on 127.0.0.1:$AMQP_PORT (pid $(cat "$pidfile"), $envfile)"
  else
    echo "$SERVICE: not running"
    return 1
  fi
}

case ${1:-} in
  install) ensure_installed ;;
  start) start ;;
  restart) restart ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 install|start|restart|stop|status" ;;
esac
