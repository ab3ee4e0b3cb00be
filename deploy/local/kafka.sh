#!/usr/bin/env bash
# Start, stop or check the Kafka broker that the Kafka tests produce to.
#
#   deploy/local/kafka.sh start|stop|status
#
# Apache Kafka has no Debian package and no download site is reachable here, so the broker's
# jars come from Maven Central (kafka/pom.xml) into $BN_CACHE/kafka/<version>/libs once, and
# later starts reuse them. It runs as one KRaft node (broker + controller, no ZooKeeper) on
# 127.0.0.1 with its state under $BN_RUN/kafka; each start is a fresh, empty cluster (stop
# deletes the state). Topics are auto-created with one partition.
# $BN_RUN/kafka/env holds KAFKA_BOOTSTRAP KAFKA_LOG KAFKA_VERSION KAFKA_LIBS.
#
# Overrides: KAFKA_VERSION (3.9.x; 4.x drops the log4j 1.x setup used here), KAFKA_PORT (19092),
# KAFKA_CONTROLLER_PORT (19093), KAFKA_HEAP_OPTS (-Xmx512m), KAFKA_START_TIMEOUT (90).
SERVICE=kafka
source "$(dirname "$0")/lib.sh"

KAFKA_VERSION=${KAFKA_VERSION:-3.9.2}
KAFKA_PORT=${KAFKA_PORT:-19092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-19093}
# ---- Reserved for a later issue, not started yet --------------------------------------------
# SASL_PLAINTEXT on KAFKA_SASL_PORT (19094) and SSL on KAFKA_SSL_PORT (19095): they will be
# appended to LISTENERS/ADVERTISED_LISTENERS/PROTOCOL_MAP in write_config, get their settings
# in the reserved block of kafka/server.properties.tmpl, and their own keys in the env file
# (e.g. KAFKA_SASL_BOOTSTRAP, KAFKA_SSL_BOOTSTRAP, KAFKA_SSL_CAFILE).
# ---------------------------------------------------------------------------------------------
KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xmx512m -Xms128m}
START_TIMEOUT=${KAFKA_START_TIMEOUT:-90}

TEMPLATES=$(cd "$(dirname "$0")/kafka" && pwd)
libs=$BN_CACHE/kafka/$KAFKA_VERSION/libs
dir=$BN_RUN/kafka
pidfile=$dir/pid
logfile=$dir/kafka.log
envfile=$dir/env

# Concurrent starts (parallel test workers) must not both launch a broker. The broker must not
# inherit fd 9, or it would hold the lock for as long as it runs.
lock() {
  mkdir -p "$BN_RUN"
  exec 9>"$BN_RUN/.kafka.lock"
  flock 9
}

ensure_libs() {
  [[ -f $libs/.complete ]] && return 0
  command -v java >/dev/null || apt_ensure default-jre-headless
  command -v mvn >/dev/null || apt_ensure maven
  local cache=${libs%/libs} began=$SECONDS
  mkdir -p "$cache"
  rm -rf "$libs.partial"
  log "resolving Kafka $KAFKA_VERSION from Maven Central (first run only)"
  # Into a scratch directory first: an interrupted copy must not pass for a complete one.
  mvn -B -q -f "$TEMPLATES/pom.xml" dependency:copy-dependencies \
    -Dkafka.version="$KAFKA_VERSION" -DoutputDirectory="$libs.partial" >"$cache/maven.log" 2>&1 ||
    die_with_log "Maven could not resolve Kafka $KAFKA_VERSION" "$cache/maven.log"
  [[ -f $libs.partial/kafka_2.13-$KAFKA_VERSION.jar ]] ||
    die_with_log "Maven finished but kafka_2.13-$KAFKA_VERSION.jar is missing" "$cache/maven.log"
  rm -rf "$libs"
  mv "$libs.partial" "$libs"
  touch "$libs/.complete"
  local jars=("$libs"/*.jar)
  log "resolved ${#jars[@]} jars into $libs in $((SECONDS - began))s"
}

write_config() {
  mkdir -p "$dir/data"
  local listeners="PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT"
  local advertised="PLAINTEXT://127.0.0.1:$KAFKA_PORT"
  local protocol_map="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  # (SASL_PLAINTEXT and SSL listeners get appended here; see the reserved block at the top.)
  sed -e "s|@LISTENERS@|$listeners|" \
    -e "s|@ADVERTISED_LISTENERS@|$advertised|" \
    -e "s|@PROTOCOL_MAP@|$protocol_map|" \
    -e "s|@CONTROLLER_PORT@|$KAFKA_CONTROLLER_PORT|" \
    -e "s|@DATA_DIR@|$dir/data|" \
    "$TEMPLATES/server.properties.tmpl" >"$dir/server.properties"
}

# A cluster id is 16 random bytes in unpadded URL-safe base64, which is what
# `StorageTool random-uuid` prints; made here to save a JVM start. One that begins with '-'
# would be read as an option, so Kafka never hands those out and neither do we.
cluster_id() {
  local id
  while :; do
    id=$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
    [[ $id == -* ]] || break
  done
  echo "$id"
}

stop_broker() {
  # TERM makes the broker shut down cleanly (a few seconds); stop_pidfile KILLs after 10 s.
  stop_pidfile "$pidfile"
  rm -rf "$dir"
}

fail() {
  stop_pidfile "$pidfile"
  die_with_log "$1" "$logfile"
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
  ensure_libs
  local port
  for port in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
    port_open "$port" && die "port $port is already in use (ss -ltnp 'sport = :$port')"
  done

  write_config
  local began=$SECONDS heap
  read -ra heap <<<"$KAFKA_HEAP_OPTS"
  local -a jvm=(java "${heap[@]}" -Djava.awt.headless=true
    "-Dlog4j.configuration=file:$TEMPLATES/log4j.properties" -cp "$libs/*")
  log "starting Kafka $KAFKA_VERSION (KRaft) on 127.0.0.1:$KAFKA_PORT"
  "${jvm[@]}" kafka.tools.StorageTool format -t "$(cluster_id)" -c "$dir/server.properties" \
    >"$logfile" 2>&1 || die_with_log "formatting the Kafka storage failed" "$logfile"
  (
    cd "$dir"
    setsid nohup "${jvm[@]}" kafka.Kafka "$dir/server.properties" >>"$logfile" 2>&1 </dev/null 9>&- &
    echo $! >"$pidfile"
  )

  # KafkaRaftServer logs this only once the broker has caught up with the metadata log and is
  # unfenced, i.e. it can take produce and metadata requests.
  local deadline=$((SECONDS + START_TIMEOUT))
  until grep -q 'Kafka Server started' "$logfile" && port_open "$KAFKA_PORT"; do
    pid_alive "$pidfile" || fail "Kafka exited during startup"
    ((SECONDS < deadline)) || fail "Kafka did not become ready within ${START_TIMEOUT}s"
    sleep 0.3
  done

  write_env "$envfile" \
    "KAFKA_BOOTSTRAP=127.0.0.1:$KAFKA_PORT" \
    "KAFKA_LOG=$logfile" \
    "KAFKA_VERSION=$KAFKA_VERSION" \
    "KAFKA_LIBS=$libs"
  log "ready on 127.0.0.1:$KAFKA_PORT after $((SECONDS - began))s (details in $envfile)"
}

stop() {
  lock
  [[ -e $dir ]] || return 0
  stop_broker
  log "stopped"
}

status() {
  if pid_alive "$pidfile" && [[ -f $envfile ]] && port_open "$KAFKA_PORT"; then
    echo "kafka: running on 127.0.0.1:$KAFKA_PORT (pid $(cat "$pidfile"), $envfile)"
  else
    echo "kafka: not running"
    return 1
  fi
}

case ${1:-} in
  install) ensure_libs ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 install|start|stop|status" ;;
esac
