#!/usr/bin/env bash
# A real Kubernetes control plane for tests and the demo: etcd and kube-apiserver on loopback,
# RBAC on, client-certificate authentication, and kubeconfigs for an admin and for a user with
# no rights at all. No kubelet, scheduler or controller-manager: nothing here runs pods, and
# namespace deletion or garbage collection (controller-manager jobs) never completes.
#
#   deploy/local/kube.sh install|start|stop|status
#   deploy/local/kube.sh apiserver-stop|apiserver-start
#       kill kube-apiserver alone, or start it again: etcd keeps every object, so clients see
#       what a restart of a real control plane looks like. For fault tests on a control plane
#       of their own; never run them against one that others use.
SERVICE=kube
source "$(dirname "$0")/lib.sh"

KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
KUBE_PORT=${KUBE_PORT:-16443}
ETCD_PORT=${ETCD_PORT:-12379}
ETCD_PEER_PORT=${ETCD_PEER_PORT:-12380}
bin="$BN_CACHE/kube/$KUBE_VERSION"
dir="$BN_RUN/kube"
pki="$dir/pki"

healthy() {
  [[ -f $dir/admin.kubeconfig ]] && [[ -f $dir/audit-policy.yaml ]] && "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" --request-timeout=2s get --raw /readyz >/dev/null 2>&1
}

# kubeconfig_for NAME CN [ORG]: a client certificate signed by our CA and a kubeconfig using it.
kubeconfig_for() {
  local name=$1 cn=$2 org=${3:-} subj
  subj="/CN=$cn"
  [[ -n $org ]] && subj="/O=$org/CN=$cn"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -out "$pki/$name.crt" 2>/dev/null
  cat >"$dir/$name.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$KUBE_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $name
  user:
    client-certificate: $pki/$name.crt
    client-key: $pki/$name.key
contexts:
- name: $name
  context: {cluster: local, user: $name, namespace: default}
current-context: $name
KC
}

make_pki() {
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=bucketnotify-local-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/apiserver.key" -subj "/CN=kube-apiserver" \
    -out "$pki/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1\n' >"$pki/apiserver.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  # Service-account token signing: needed for TokenRequest, which the install tests use to act
  # as the chart's own ServiceAccounts.
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  kubeconfig_for admin bucketnotify-admin system:masters
  kubeconfig_for nobody bucketnotify-nobody
}

# Requests of ServiceAccounts (the chart's operator and delivery service in the RBAC tests)
# go to an audit log: the test that every RBAC rule is used reads it. Nothing else is logged,
# so the log stays small however long the apiserver runs.
write_audit_policy() {
  cat >"$dir/audit-policy.yaml" <<'YAML'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
YAML
}

launch_apiserver() {
  setsid "$bin/kube-apiserver" \
    --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/audit.log" \
    --audit-log-maxsize 200 --audit-log-maxbackup 1 \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$KUBE_PORT" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --authorization-mode RBAC --anonymous-auth=false \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --disable-admission-plugins ServiceAccount \
    --allow-privileged=true --v=1 >>"$dir/apiserver.log" 2>&1 </dev/null &
  echo $! >"$dir/apiserver.pid"
  wait_for "kube-apiserver" 90 "$dir/apiserver.log" -- healthy
  # RBAC bootstrap roles are created by the apiserver itself right after /readyz; wait for
  # them so a test that relies on cluster-admin or view does not race the bootstrap.
  wait_for "RBAC bootstrap" 30 "$dir/apiserver.log" -- \
    "$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" get clusterrole view
}

start() {
  if healthy; then return 0; fi
  bash "$(dirname "$0")/kube-build.sh"
  apt_ensure openssl
  stop_quiet
  rm -rf "$dir"
  mkdir -p "$dir/etcd"
  make_pki
  write_audit_policy

  # etcd: loopback only, no fsync-heavy settings changed; its data is throwaway anyway.
  setsid "$bin/etcd" --name bucketnotify --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "bucketnotify=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --log-level warn >"$dir/etcd.log" 2>&1 </dev/null &
  echo $! >"$dir/etcd.pid"
  wait_for "etcd" 30 "$dir/etcd.log" -- curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

  launch_apiserver

  write_env "$dir/env" \
    "KUBECONFIG_ADMIN=$dir/admin.kubeconfig" \
    "KUBECONFIG_NOBODY=$dir/nobody.kubeconfig" \
    "KUBE_SERVER=https://127.0.0.1:$KUBE_PORT" \
    "KUBE_CA_CERT=$pki/ca.crt" \
    "KUBE_CA_KEY=$pki/ca.key" \
    "KUBECTL=$bin/kubectl" \
    "KUBE_VERSION=$KUBE_VERSION" \
    "KUBE_APISERVER_LOG=$dir/apiserver.log" \
    "KUBE_AUDIT_LOG=$dir/audit.log"
  log "kube-apiserver $KUBE_VERSION ready on https://127.0.0.1:$KUBE_PORT (KUBECONFIG=$dir/admin.kubeconfig)"
}

stop_quiet() {
  stop_pidfile "$dir/apiserver.pid"
  stop_pidfile "$dir/etcd.pid"
}

apiserver_stop() {
  [[ -f $dir/env ]] || die "not started: no apiserver to stop"
  # KILL, as a crash would: no graceful shutdown that lets clients drain first.
  pid_alive "$dir/apiserver.pid" && kill -9 "$(cat "$dir/apiserver.pid")" 2>/dev/null
  stop_pidfile "$dir/apiserver.pid"
}

apiserver_start() {
  [[ -f $dir/env ]] || die "not started: start the control plane first"
  pid_alive "$dir/etcd.pid" || die "etcd is gone: stop and start afresh"
  healthy && return 0
  launch_apiserver
}

case "${1:-}" in
  apiserver-stop) apiserver_stop ;;
  apiserver-start) apiserver_start ;;
  install) bash "$(dirname "$0")/kube-build.sh"; apt_ensure openssl ;;
  start) start ;;
  stop) stop_quiet; rm -rf "$dir" ;;
  status) healthy ;;
  *) die "usage: $0 install|start|stop|status|apiserver-stop|apiserver-start" ;;
esac
