#!/usr/bin/env bash
# Start, stop or check the Kafka broker that the Kafka tests produce to.
#
#   deploy/local/kafka.sh start|stop|status   (and restart: same data, for reconnection tests)
#
# Apache Kafka has no Debian package and no download site is reachable here, so the broker's
# jars come from Maven Central (kafka/pom.xml) into $BN_CACHE/kafka/<version>/libs once, and
# later starts reuse them. It runs as one KRaft node (broker + controller, no ZooKeeper) on
# 127.0.0.1 with its state under $BN_RUN/kafka; each start is a fresh, empty cluster (stop
# deletes the state). Topics are auto-created with one partition.
#
# Four client listeners, all on 127.0.0.1:
#   PLAINTEXT       KAFKA_PORT       no TLS, no authentication
#   SASL_PLAINTEXT  KAFKA_SASL_PORT  SASL PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (one user,
#                                    $KAFKA_SCRAM_USER/$KAFKA_SCRAM_PASSWORD, for all three) and
#                                    OAUTHBEARER with the broker's default validator of
#                                    unsecured (unsigned) JWTs
#   SSL             KAFKA_SSL_PORT   TLS with a server certificate for 127.0.0.1/localhost signed
#                                    by a CA generated at each start; no client certificate
#   SASL_SSL        KAFKA_SASL_SSL_PORT  the SASL_PLAINTEXT mechanisms and user over the SSL
#                                    listener's TLS (what a production cluster runs)
#   MTLS (SSL)      KAFKA_MTLS_PORT  the SSL listener's TLS, and a client certificate signed by
#                                    the same CA required (KAFKA_CLIENT_CERT, _KEY,
#                                    _ENCRYPTED_KEY and KAFKA_CLIENT_KEY_PASSWORD: its files)
# The SCRAM credentials go into the metadata log when the storage is formatted
# (`StorageTool format --add-scram`), so they exist before the broker takes its first request.
# $BN_RUN/kafka/env holds KAFKA_BOOTSTRAP KAFKA_SASL_BOOTSTRAP KAFKA_SSL_BOOTSTRAP
# KAFKA_SASL_SSL_BOOTSTRAP KAFKA_CA_PEM (the CA that signed the TLS listeners' certificate) KAFKA_SCRAM_USER KAFKA_SCRAM_PASSWORD
# KAFKA_LOG KAFKA_VERSION KAFKA_LIBS.
#
# Overrides: KAFKA_VERSION (3.9.x; 4.x drops the log4j 1.x setup used here), KAFKA_PORT (19092),
# KAFKA_CONTROLLER_PORT (19093), KAFKA_SASL_PORT (19094), KAFKA_SSL_PORT (19095),
# KAFKA_SASL_SSL_PORT (19096), KAFKA_MTLS_PORT (19097),
# KAFKA_SCRAM_USER, KAFKA_SCRAM_PASSWORD, KAFKA_HEAP_OPTS (-Xmx512m), KAFKA_START_TIMEOUT (90).
SERVICE=kafka
source "$(dirname "$0")/lib.sh"

KAFKA_VERSION=${KAFKA_VERSION:-3.9.2}
KAFKA_PORT=${KAFKA_PORT:-19092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-19093}
KAFKA_SASL_PORT=${KAFKA_SASL_PORT:-19094}
KAFKA_SSL_PORT=${KAFKA_SSL_PORT:-19095}
KAFKA_SASL_SSL_PORT=${KAFKA_SASL_SSL_PORT:-19096}
KAFKA_MTLS_PORT=${KAFKA_MTLS_PORT:-19097}
# Test credentials (this broker listens on loopback only). They end up in a sed replacement and
# in a JAAS string, so they are restricted to characters that need no quoting in either.
KAFKA_SCRAM_USER=${KAFKA_SCRAM_USER:-bntest}
KAFKA_SCRAM_PASSWORD=${KAFKA_SCRAM_PASSWORD:-bntest-scram-secret-1}
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

check_credentials() {
  local v
  for v in "$KAFKA_SCRAM_USER" "$KAFKA_SCRAM_PASSWORD"; do
    [[ $v =~ ^[A-Za-z0-9._-]+$ ]] ||
      die "KAFKA_SCRAM_USER and KAFKA_SCRAM_PASSWORD may hold only letters, digits, '.', '_' and '-'"
  done
}

# The TLS listeners' CA and certificate (make_server_tls), the key and chain in a PKCS#12
# keystore for the broker.
make_tls() {
  make_server_tls "$dir/tls" "bucketnotify local Kafka CA" clients
  (
    umask 077
    cd "$dir/tls"
    od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >keystore.password
    openssl pkcs12 -export -name kafka -inkey server.key -in server.crt -certfile ca.crt \
      -passout file:keystore.password -out server.p12
    rm -f server.key
  ) >>"$dir/tls.log" 2>&1 || die_with_log "making the broker's keystore failed" "$dir/tls.log"
}

write_config() {
  mkdir -p "$dir/data"
  local listeners="PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT"
  local clients="SASL_PLAINTEXT://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_SSL_PORT"
  clients+=",SASL_SSL://127.0.0.1:$KAFKA_SASL_SSL_PORT,MTLS://127.0.0.1:$KAFKA_MTLS_PORT"
  listeners+=",$clients"
  local advertised="PLAINTEXT://127.0.0.1:$KAFKA_PORT,$clients"
  local protocol_map="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  protocol_map+=",SASL_PLAINTEXT:SASL_PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,MTLS:SSL"
  # The file holds the PLAIN password and the keystore password: readable by us only.
  (
    umask 077
    sed -e "s|@LISTENERS@|$listeners|" \
      -e "s|@ADVERTISED_LISTENERS@|$advertised|" \
      -e "s|@PROTOCOL_MAP@|$protocol_map|" \
      -e "s|@CONTROLLER_PORT@|$KAFKA_CONTROLLER_PORT|" \
      -e "s|@DATA_DIR@|$dir/data|" \
      -e "s|@SASL_USER@|$KAFKA_SCRAM_USER|g" \
      -e "s|@SASL_PASSWORD@|$KAFKA_SCRAM_PASSWORD|g" \
      -e "s|@KEYSTORE@|$dir/tls/server.p12|" \
      -e "s|@TRUSTSTORE@|$dir/tls/ca.crt|" \
      -e "s|@KEYSTORE_PASSWORD@|$(cat "$dir/tls/keystore.password")|g" \
      "$TEMPLATES/server.properties.tmpl" >"$dir/server.properties"
  )
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

jvm_command() {
  local heap
  read -ra heap <<<"$KAFKA_HEAP_OPTS"
  JVM=(java "${heap[@]}" -Djava.awt.headless=true
    "-Dlog4j.configuration=file:$TEMPLATES/log4j.properties" -cp "$libs/*")
}

# Run the broker on the formatted storage in $dir and wait until it takes requests.
launch() {
  # Only what this launch logs counts: a restart appends to the log of the earlier run.
  local from
  from=$(($(stat -c %s "$logfile" 2>/dev/null || echo 0) + 1))
  (
    cd "$dir"
    setsid nohup "${JVM[@]}" kafka.Kafka "$dir/server.properties" >>"$logfile" 2>&1 </dev/null 9>&- &
    echo $! >"$pidfile"
  )
  # KafkaRaftServer logs this only once the broker has caught up with the metadata log and is
  # unfenced, i.e. it can take produce and metadata requests.
  local deadline=$((SECONDS + START_TIMEOUT))
  until tail -c "+$from" "$logfile" | grep -q 'Kafka Server started' && port_open "$KAFKA_PORT" &&
    port_open "$KAFKA_SASL_PORT" && port_open "$KAFKA_SSL_PORT" &&
    port_open "$KAFKA_SASL_SSL_PORT" && port_open "$KAFKA_MTLS_PORT"; do
    pid_alive "$pidfile" || fail "Kafka exited during startup"
    ((SECONDS < deadline)) || fail "Kafka did not become ready within ${START_TIMEOUT}s"
    sleep 0.3
  done
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
  check_credentials
  ensure_libs
  local port
  for port in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SASL_PORT" "$KAFKA_SSL_PORT" \
    "$KAFKA_SASL_SSL_PORT" "$KAFKA_MTLS_PORT"; do
    port_open "$port" && die "port $port is already in use (ss -ltnp 'sport = :$port')"
  done

  mkdir -p "$dir"
  make_tls
  write_config
  jvm_command
  local began=$SECONDS
  log "starting Kafka $KAFKA_VERSION (KRaft) on 127.0.0.1:$KAFKA_PORT"
  local scram="name=$KAFKA_SCRAM_USER,password=$KAFKA_SCRAM_PASSWORD"
  "${JVM[@]}" kafka.tools.StorageTool format -t "$(cluster_id)" -c "$dir/server.properties" \
    --add-scram "SCRAM-SHA-256=[$scram]" --add-scram "SCRAM-SHA-512=[$scram]" \
    >"$logfile" 2>&1 || die_with_log "formatting the Kafka storage failed" "$logfile"
  launch
  write_env "$envfile" \
    "KAFKA_BOOTSTRAP=127.0.0.1:$KAFKA_PORT" \
    "KAFKA_SASL_BOOTSTRAP=127.0.0.1:$KAFKA_SASL_PORT" \
    "KAFKA_SSL_BOOTSTRAP=127.0.0.1:$KAFKA_SSL_PORT" \
    "KAFKA_SASL_SSL_BOOTSTRAP=127.0.0.1:$KAFKA_SASL_SSL_PORT" \
    "KAFKA_CA_PEM=$dir/tls/ca.crt" \
    "KAFKA_MTLS_BOOTSTRAP=127.0.0.1:$KAFKA_MTLS_PORT" \
    "KAFKA_CLIENT_CERT=$dir/tls/client.crt" \
    "KAFKA_CLIENT_KEY=$dir/tls/client.key" \
    "KAFKA_CLIENT_ENCRYPTED_KEY=$dir/tls/client-encrypted.key" \
    "KAFKA_CLIENT_KEY_PASSWORD=$dir/tls/client-key.password" \
    "KAFKA_SCRAM_USER=$KAFKA_SCRAM_USER" \
    "KAFKA_SCRAM_PASSWORD=$KAFKA_SCRAM_PASSWORD" \
    "KAFKA_LOG=$logfile" \
    "KAFKA_VERSION=$KAFKA_VERSION" \
    "KAFKA_LIBS=$libs"
  log "ready on 127.0.0.1:$KAFKA_PORT after $((SECONDS - began))s (details in $envfile)"
}

# Stop the broker cleanly and start it again on the same data, ports and certificates: what a
# test of reconnection after a real broker restart needs (start/stop always begin afresh).
# Never run it against a broker that others are using.
restart() {
  lock
  [[ -f $dir/server.properties && -f $envfile ]] || die "not started: nothing to restart"
  local began=$SECONDS
  stop_pidfile "$pidfile"
  jvm_command
  log "restarting Kafka on 127.0.0.1:$KAFKA_PORT with its data"
  launch
  log "ready again after $((SECONDS - began))s"
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
  restart) restart ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 install|start|restart|stop|status" ;;
esac
