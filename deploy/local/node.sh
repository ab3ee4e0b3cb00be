#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this machine, for the tests that install the chart with
# helm and run our pods: etcd, kube-apiserver, controller-manager, scheduler, containerd,
# kubelet and kube-proxy, all built or installed by the project, nothing pulled from a registry.
#
#   deploy/local/node.sh install   apt packages, the node binaries (Go, once), the pause image
#   deploy/local/node.sh start     start or reuse the cluster; writes $BN_RUN/node/env
#   deploy/local/node.sh stop      stop it and undo what it did to the host
#   deploy/local/node.sh purge     stop, and also drop the images imported into its containerd
#   deploy/local/node.sh status    "running" (exit 0) or "not running" (exit 1)
#   deploy/local/node.sh usage     the memory (RSS) of each node process
#
# $BN_RUN/node/env: NODE_KUBECONFIG (admin), NODE_ADDRESS, NODE_APISERVER, NODE_CA_CERT/KEY,
# NODE_CONTAINERD_SOCKET, SERVICE_CIDR, POD_CIDR, KUBECTL, CRICTL, NODE_AUDIT_LOG (requests of
# ServiceAccounts, as kube.sh's), NODE_LOG_DIR (one <component>.log each).
#
# It lives beside deploy/local/kube.sh (a bare apiserver on 127.0.0.1) with its own ports, dirs
# and PKI. Why each setting is there: the comment next to it (each was needed on these machines).
#
# Networking. Pods live on the bridge $NODE_BRIDGE; its address ($NODE_ADDRESS) is the host
# as the pods see it and the only non-loopback address anything here listens on (apiserver,
# kubelet). Services on the host's loopback (the Ceph gateway on 127.0.0.1, ...) are NOT
# reachable from pods: a test that needs one forwards a port on $NODE_ADDRESS to it. The host
# reaches pods and ClusterIPs (kube-proxy programs the host too). Nothing leaves the machine:
# pods get routes to the pod and Service ranges only, the forwarding of anything between the
# bridge and another interface is dropped, pods resolve nothing (there is no cluster DNS), and
# containerd's image pulls go to a proxy address that refuses, so a missing image fails at
# once instead of reaching out. Use imagePullPolicy: Never and images.sh to import images.
# stop leaves one thing behind on purpose: "unreachable" routes (metric 4242) for the pod and
# Service ranges, so that a client still holding such an address after stop gets an error at
# once instead of the default route. While the cluster runs, the bridge's routes win.
SERVICE=node
source "$(dirname "$0")/lib.sh"

KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
CRICTL_VERSION=${CRICTL_VERSION:-v1.34.0}
NODE_NAME=${NODE_NAME:-bucketnotify-node}
NODE_BRIDGE=${NODE_BRIDGE:-bnbr0}
# Ranges used by nothing on these machines (eth0 is 192.0.2.0/24, kube.sh's unrouted Service
# range 10.0.0.0/24, buildah builds with the host network).
POD_CIDR=${POD_CIDR:-10.244.0.0/16}
NODE_ADDRESS=${NODE_ADDRESS:-10.244.0.1}
SERVICE_CIDR=${SERVICE_CIDR:-10.96.0.0/16}
KUBERNETES_SERVICE_IP=${KUBERNETES_SERVICE_IP:-10.96.0.1}
NODE_APISERVER_PORT=${NODE_APISERVER_PORT:-17443}
NODE_ETCD_PORT=${NODE_ETCD_PORT:-12389}
NODE_ETCD_PEER_PORT=${NODE_ETCD_PEER_PORT:-12390}
KUBELET_PORT=${KUBELET_PORT:-10250}
KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT:-10248}
KUBE_PROXY_HEALTHZ_PORT=${KUBE_PROXY_HEALTHZ_PORT:-10256}
KUBE_PROXY_METRICS_PORT=${KUBE_PROXY_METRICS_PORT:-10249}
PAUSE_IMAGE=localhost/bucketnotify/pause:1

here=$(cd "$(dirname "$0")" && pwd)
bin="$BN_CACHE/kube/$KUBE_VERSION"
work="$BN_CACHE/kube/build-$KUBE_VERSION"
dir="$BN_RUN/node"
pki="$dir/pki"
# containerd's image store outlives stop, so that a warm start finds the images imported
# before (an import of our image takes half a minute); purge drops it.
ctr_root="$dir/containerd-root"
ctr_state="$dir/containerd"
ctr_sock="$ctr_state/containerd.sock"
kubelet_root="$dir/kubelet"
cni_conf_dir="$dir/cni/net.d"
CNI_NETWORK=bucketnotify
FORWARD_CHAIN=BN-NODE-FORWARD
kubeconfig="$dir/admin.kubeconfig"
kubectl=("$bin/kubectl" --kubeconfig "$kubeconfig" --request-timeout=5s)
crictl=("$bin/crictl" --runtime-endpoint "unix://$ctr_sock" --timeout 30s)
ctr=(ctr --address "$ctr_sock" --namespace k8s.io)
# The host settings that kubelet, the CNI bridge plugin and kube-proxy may change: saved
# before the first start, restored by stop.
HOST_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
  net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables
  net.bridge.bridge-nf-call-ip6tables net.netfilter.nf_conntrack_max)
NODE_COMPONENTS=(etcd kube-apiserver containerd kube-controller-manager kube-scheduler kubelet kube-proxy)

# ---------------------------------------------------------------------------------- install

# kubelet, controller-manager, scheduler and kube-proxy from the very module kube-build.sh
# builds the apiserver from, in its module dir, so the versions and the Go caches are shared.
build_node_binaries() {
  local missing=() b
  for b in kubelet kube-controller-manager kube-scheduler kube-proxy; do
    [[ -x $bin/$b ]] || missing+=("$b")
  done
  ((${#missing[@]} > 0)) || return 0
  bash "$here/kube-build.sh"
  command -v go >/dev/null || die "go is required to build ${missing[*]}"
  log "building ${missing[*]} $KUBE_VERSION (first run only; several minutes)"
  # A build-tagged import list, so that kube-build.sh's `go mod tidy` keeps their
  # requirements if it ever regenerates go.mod.
  cat >"$work/node-tools.go" <<'GO'
//go:build tools

package kubebuild

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
  for b in "${missing[@]}"; do
    local started=$SECONDS
    # CGO off like upstream's release builds; -p 2: two cores, more only adds memory pressure.
    (cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -p 2 -trimpath -ldflags "$ldflags" \
      -o "$bin/$b.tmp" "k8s.io/kubernetes/cmd/$b")
    mv "$bin/$b.tmp" "$bin/$b"
    log "built $b in $((SECONDS - started)) s"
  done
}

# crictl talks CRI to containerd: stop uses it to tear pods down the way kubelet would (CNI
# DEL, netns, mounts), images.sh to read an imported image's ID. Its own module, like helm.
build_crictl() {
  [[ -x $bin/crictl ]] && return 0
  command -v go >/dev/null || die "go is required to build crictl"
  log "building crictl $CRICTL_VERSION (first run only)"
  mkdir -p "$bin"
  GOBIN="$bin" CGO_ENABLED=0 go install -p 2 -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
}

pause_archive() {
  local sum
  sum=$(sha256sum "$here/pause/pause.c" | cut -c1-12)
  echo "$BN_CACHE/node/pause-$sum.tar"
}

# The sandbox image: containerd cannot pull registry.k8s.io/pause, so a static binary alone in
# an image from scratch, kept as an OCI archive that start imports into containerd.
build_pause_image() {
  local archive tmp ctr_id
  archive=$(pause_archive)
  [[ -f $archive ]] && return 0
  log "building the pause image $PAUSE_IMAGE"
  mkdir -p "$(dirname "$archive")"
  tmp=$(mktemp -d)
  gcc -Os -static -s -Wall -Wextra -o "$tmp/pause" "$here/pause/pause.c"
  ctr_id=$(buildah from scratch)
  buildah copy --quiet "$ctr_id" "$tmp/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr_id"
  buildah commit --quiet --rm "$ctr_id" "$PAUSE_IMAGE" >/dev/null
  buildah push --quiet "$PAUSE_IMAGE" "oci-archive:$archive.tmp:$PAUSE_IMAGE"
  mv "$archive.tmp" "$archive"
  rm -rf "$tmp"
}

install() {
  apt_ensure containerd runc containernetworking-plugins conntrack iptables iproute2 buildah \
    gcc libc6-dev openssl curl
  build_node_binaries
  build_crictl
  build_pause_image
}

# ------------------------------------------------------------------------------------ start

# Every node process runs without the caller's proxy settings: the apiserver, kubelet and
# kube-proxy talk to addresses on this machine only, and containerd's registry clients get
# a proxy that refuses (port 9 on loopback) so that an image missing from its store fails to
# pull at once rather than go out.
launch() {
  local name=$1; shift
  setsid env -u http_proxy -u https_proxy -u HTTP_PROXY -u HTTPS_PROXY -u ALL_PROXY -u all_proxy \
    -u NO_PROXY -u no_proxy "$@" >>"$dir/$name.log" 2>&1 </dev/null &
  echo $! >"$dir/$name.pid"
}

# issue NAME CN [ORG] [SANS]: a key and a certificate signed by our CA; with SANS a serving one.
issue() {
  local name=$1 cn=$2 org=${3:-} san=${4:-} subj
  subj="/CN=$cn"
  [[ -n $org ]] && subj="/O=$org/CN=$cn"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    if [[ -n $san ]]; then
      echo "extendedKeyUsage=serverAuth"
      echo "subjectAltName=$san"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}

# write_kubeconfig NAME: a kubeconfig for the client certificate NAME.
write_kubeconfig() {
  local name=$1
  cat >"$dir/$name.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: node
  cluster:
    server: https://$NODE_ADDRESS:$NODE_APISERVER_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $name
  user:
    client-certificate: $pki/$name.crt
    client-key: $pki/$name.key
contexts:
- name: $name
  context: {cluster: node, user: $name, namespace: default}
current-context: $name
KC
}

# ECDSA keys: a dozen RSA keys would cost seconds of every start.
make_pki() {
  mkdir -p "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 \
    -subj "/CN=bucketnotify-node-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  issue apiserver kube-apiserver "" \
    "IP:$NODE_ADDRESS,IP:127.0.0.1,IP:$KUBERNETES_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  issue kubelet-serving "$NODE_NAME" "" "IP:$NODE_ADDRESS,DNS:$NODE_NAME"
  # The apiserver's client certificate at the kubelet (logs, exec, port-forward).
  issue apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  issue admin bucketnotify-admin system:masters
  issue kubelet "system:node:$NODE_NAME" system:nodes
  issue controller-manager system:kube-controller-manager
  issue scheduler system:kube-scheduler
  issue kube-proxy system:kube-proxy
  for name in admin kubelet controller-manager scheduler kube-proxy; do write_kubeconfig "$name"; done
  openssl ecparam -name prime256v1 -genkey -noout -out "$pki/sa.key" 2>/dev/null
  openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

save_host_sysctls() {
  # Saved once: a start after a crash must not take the cluster's values for the host's.
  [[ -f $BN_RUN/node-host-sysctls ]] && return 0
  local key
  for key in "${HOST_SYSCTLS[@]}"; do
    sysctl -n "$key" >/dev/null 2>&1 && printf '%s=%s\n' "$key" "$(sysctl -n "$key")"
  done >"$BN_RUN/node-host-sysctls.tmp"
  mv "$BN_RUN/node-host-sysctls.tmp" "$BN_RUN/node-host-sysctls"
}

restore_host_sysctls() {
  [[ -f $BN_RUN/node-host-sysctls ]] || return 0
  local kv
  while read -r kv; do
    sysctl -q -w "$kv" >/dev/null 2>&1 || log "could not restore $kv"
  done <"$BN_RUN/node-host-sysctls"
  rm -f "$BN_RUN/node-host-sysctls"
}

# The bridge exists before anything listens on it: the apiserver binds to its address, and
# pods cannot use an apiserver on 127.0.0.1.
setup_network() {
  ip link show "$NODE_BRIDGE" >/dev/null 2>&1 || ip link add "$NODE_BRIDGE" type bridge
  ip addr replace "$NODE_ADDRESS/${POD_CIDR#*/}" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  # A ClusterIP that kube-proxy has not programmed (yet) goes to the bridge and nowhere, not
  # to the default route.
  ip route replace "$SERVICE_CIDR" dev "$NODE_BRIDGE" src "$NODE_ADDRESS"
  # And once the bridge is gone (after stop), a client still holding a pod or Service address
  # gets "unreachable" at once instead of the default route: kept on purpose after stop.
  local cidr
  for cidr in "$POD_CIDR" "$SERVICE_CIDR"; do
    ip route replace unreachable "$cidr" metric 4242
  done
  # Pods talk to each other and to the host, never through the host to anything else (not
  # even to a Service whose endpoints someone pointed outside). In the mangle table, which
  # comes before filter: kube-proxy and kubelet put their ACCEPT rules first in filter FORWARD.
  local ipt=(iptables -t mangle)
  "${ipt[@]}" -N "$FORWARD_CHAIN" 2>/dev/null || "${ipt[@]}" -F "$FORWARD_CHAIN"
  "${ipt[@]}" -A "$FORWARD_CHAIN" -i "$NODE_BRIDGE" -o "$NODE_BRIDGE" -j RETURN
  "${ipt[@]}" -A "$FORWARD_CHAIN" -i "$NODE_BRIDGE" -j DROP
  "${ipt[@]}" -A "$FORWARD_CHAIN" -o "$NODE_BRIDGE" -j DROP
  "${ipt[@]}" -C FORWARD -j "$FORWARD_CHAIN" 2>/dev/null || "${ipt[@]}" -I FORWARD 1 -j "$FORWARD_CHAIN"
  printf 'nameserver 127.0.0.1\noptions ndots:1 timeout:1 attempts:1\n' >"$dir/resolv.conf"
}

write_cni_config() {
  mkdir -p "$cni_conf_dir" "$dir/cni/ipam"
  # No default route in pods: the Service range through the host, the pod range on the link,
  # anything else unreachable. No masquerading: nothing is to leave the machine.
  cat >"$cni_conf_dir/10-bucketnotify.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$NODE_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$dir/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_ADDRESS"}]],
        "routes": [{"dst": "$SERVICE_CIDR", "gw": "$NODE_ADDRESS"}]
      }
    }
  ]
}
JSON
}

write_containerd_config() {
  mkdir -p "$ctr_root" "$ctr_state"
  cat >"$dir/containerd.toml" <<TOML
version = 2
root = "$ctr_root"
state = "$ctr_state"
# Nothing here needs them, and "opt" would write to /opt.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$ctr_sock"
[ttrpc]
  address = "$ctr_state/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # runc cannot lower oom_score_adj in these VMs (no CAP_SYS_RESOURCE): every pod failed.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # Its own runc state, apart from any other containerd's /run/containerd/runc.
        Root = "$ctr_state/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$cni_conf_dir"
    max_conf_num = 1
TOML
}

write_kubelet_config() {
  cat >"$dir/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_ADDRESS
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
# The apiserver authenticates with a client certificate of our CA (kubectl logs/exec);
# anything else is asked of the apiserver.
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
containerRuntimeEndpoint: unix://$ctr_sock
# cgroup v1 without systemd on these machines.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# Imported images cannot be pulled again: never collect them, and evict nothing for a disk
# that is merely full-ish.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
# No cluster DNS: pods resolve nothing rather than ask the host's resolver.
resolvConf: $dir/resolv.conf
clusterDomain: cluster.local
podLogsDir: $dir/pod-logs
volumePluginDir: $kubelet_root/volume-plugins
serializeImagePulls: false
maxPods: 110
YAML
}

write_kube_proxy_config() {
  cat >"$dir/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $dir/kube-proxy.kubeconfig
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: $NODE_ADDRESS
healthzBindAddress: 127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$KUBE_PROXY_METRICS_PORT
nodePortAddresses: ["$NODE_ADDRESS/32"]
iptables:
  # A pod that reaches a Service whose endpoint is on the same bridge gets its replies
  # through the host, so masquerade all Service traffic. No NodePorts on 127.0.0.1: that
  # would need route_localnet on the host.
  masqueradeAll: true
  localhostNodePorts: false
  # Program a Service as soon as its endpoints change (default: at most once a second), so
  # that a client right after "rollout status" or "helm install --wait" finds it.
  minSyncPeriod: 0s
# 0: leave the host's conntrack settings as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
YAML
}

write_audit_policy() {
  # As kube.sh: requests of ServiceAccounts (the chart's operator and delivery service) only.
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

node_ready() {
  [[ $("${kubectl[@]}" get node "$NODE_NAME" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

healthy() {
  [[ -f $dir/env ]] || return 1
  local c
  for c in "${NODE_COMPONENTS[@]}"; do pid_alive "$dir/$c.pid" || return 1; done
  "${kubectl[@]}" get --raw /readyz >/dev/null 2>&1 && node_ready
}

import_pause_image() {
  "${ctr[@]}" images ls -q "name==$PAUSE_IMAGE" | grep -q . && return 0
  "${ctr[@]}" images import "$(pause_archive)" >/dev/null
}

start() {
  if healthy; then
    log "reusing the running cluster (KUBECONFIG=$kubeconfig)"
    return 0
  fi
  local started=$SECONDS
  install
  stop_quiet
  mkdir -p "$dir"
  find "$dir" -mindepth 1 -maxdepth 1 ! -name containerd-root -exec rm -rf {} +
  mkdir -p "$dir/etcd" "$kubelet_root" "$dir/pod-logs"
  save_host_sysctls
  setup_network
  make_pki
  write_audit_policy
  write_cni_config
  write_containerd_config
  write_kubelet_config
  write_kube_proxy_config

  launch etcd "$bin/etcd" --name bucketnotify-node --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$NODE_ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$NODE_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$NODE_ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$NODE_ETCD_PEER_PORT" \
    --initial-cluster "bucketnotify-node=http://127.0.0.1:$NODE_ETCD_PEER_PORT" \
    --unsafe-no-fsync --log-level warn
  # containerd starts meanwhile: it needs nothing from the control plane.
  launch containerd HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 \
    containerd --config "$dir/containerd.toml"
  wait_for "etcd" 30 "$dir/etcd.log" -- curl -fsS "http://127.0.0.1:$NODE_ETCD_PORT/health"

  launch kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$NODE_ETCD_PORT" \
    --bind-address "$NODE_ADDRESS" --advertise-address "$NODE_ADDRESS" \
    --secure-port "$NODE_APISERVER_PORT" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$pki/ca.crt" \
    --kubelet-preferred-address-types InternalIP \
    --authorization-mode Node,RBAC --anonymous-auth=false \
    --enable-admission-plugins NodeRestriction \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/audit.log" \
    --audit-log-maxsize 200 --audit-log-maxbackup 1 \
    --allow-privileged=true --profiling=false --v=1
  wait_for "containerd" 30 "$dir/containerd.log" -- "${ctr[@]}" version
  import_pause_image
  wait_for "kube-apiserver" 90 "$dir/kube-apiserver.log" -- "${kubectl[@]}" get --raw /readyz
  # The bootstrap roles the other components are authorised by.
  wait_for "RBAC bootstrap" 30 "$dir/kube-apiserver.log" -- \
    "${kubectl[@]}" get clusterrolebinding system:node-proxier system:kube-controller-manager

  # Secure ports 0: nothing of theirs needs to be served, so they listen nowhere.
  launch kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$dir/controller-manager.kubeconfig" \
    --secure-port 0 --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --cluster-cidr "$POD_CIDR" \
    --flex-volume-plugin-dir "$dir/flexvolume" --v=1
  launch kube-scheduler "$bin/kube-scheduler" --kubeconfig "$dir/scheduler.kubeconfig" \
    --secure-port 0 --leader-elect=false --v=1
  launch kubelet "$bin/kubelet" --config "$dir/kubelet.yaml" \
    --kubeconfig "$dir/kubelet.kubeconfig" --root-dir "$kubelet_root" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_ADDRESS" --v=1
  launch kube-proxy "$bin/kube-proxy" --config "$dir/kube-proxy.yaml" --v=1

  wait_for "node $NODE_NAME Ready" 120 "$dir/kubelet.log" -- node_ready
  # Pods of a new namespace need its default ServiceAccount (controller-manager makes it).
  wait_for "default ServiceAccount" 60 "$dir/kube-controller-manager.log" -- \
    "${kubectl[@]}" get serviceaccount default -n default

  write_env "$dir/env" \
    "NODE_KUBECONFIG=$kubeconfig" \
    "NODE_ADDRESS=$NODE_ADDRESS" \
    "NODE_NAME=$NODE_NAME" \
    "NODE_BRIDGE=$NODE_BRIDGE" \
    "NODE_APISERVER=https://$NODE_ADDRESS:$NODE_APISERVER_PORT" \
    "NODE_CA_CERT=$pki/ca.crt" \
    "NODE_CA_KEY=$pki/ca.key" \
    "NODE_CONTAINERD_SOCKET=$ctr_sock" \
    "NODE_CONTAINERD_NAMESPACE=k8s.io" \
    "NODE_AUDIT_LOG=$dir/audit.log" \
    "NODE_LOG_DIR=$dir" \
    "SERVICE_CIDR=$SERVICE_CIDR" \
    "POD_CIDR=$POD_CIDR" \
    "KUBECTL=$bin/kubectl" \
    "CRICTL=$bin/crictl" \
    "KUBE_VERSION=$KUBE_VERSION"
  log "node $NODE_NAME Ready in $((SECONDS - started)) s: https://$NODE_ADDRESS:$NODE_APISERVER_PORT (KUBECONFIG=$kubeconfig)"
}

# ------------------------------------------------------------------------------------- stop

# Remove every chain kubelet and kube-proxy made (KUBE-*) and ours, with the jumps to them,
# in one iptables-restore per table so that quoted comments in rules need no re-parsing.
remove_chains() {
  local ipt table rules chains=()
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for table in filter nat mangle raw; do
      rules=$("$ipt-save" -t "$table" 2>/dev/null) || continue
      mapfile -t chains < <(sed -nE "s/^:((KUBE-|$FORWARD_CHAIN)[^ ]*) .*/\1/p" <<<"$rules")
      ((${#chains[@]} > 0)) || continue
      {
        echo "*$table"
        grep -E "^-A [^ ]+ .*-j (KUBE-|$FORWARD_CHAIN)" <<<"$rules" | grep -vE "^-A (KUBE-|$FORWARD_CHAIN)" |
          sed 's/^-A /-D /' || true
        printf -- '-F %s\n' "${chains[@]}"
        printf -- '-X %s\n' "${chains[@]}"
        echo COMMIT
      } | "$ipt-restore" --noflush || log "could not remove the $ipt $table chains"
    done
  done
}

# Processes of ours that containerd left behind: shims serving our socket, and whatever is
# still in the pods' cgroups (all started by this cluster).
kill_leftovers() {
  local pid cmdline procs
  for cmdline in $(grep -laF -- "$ctr_sock" /proc/[0-9]*/cmdline 2>/dev/null || true); do
    pid=${cmdline#/proc/}
    pid=${pid%/cmdline}
    if [[ $(tr '\0' ' ' <"$cmdline" 2>/dev/null) == *containerd-shim*" -address $ctr_sock"* ]]; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  for procs in /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
    /sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs; do
    [[ -f $procs ]] || continue
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done <"$procs"
  done
  sleep 0.2
  # Empty pod cgroups, deepest first; kubelet made them.
  find /sys/fs/cgroup/*/kubepods -depth -type d -exec rmdir {} + 2>/dev/null || true
}

unmount_under() {
  local root=$1 mnt
  # Deepest first; lazily when something still holds one.
  awk '{print $5}' /proc/self/mountinfo | { grep -F "$root/" || true; } | sort -r | while read -r mnt; do
    umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || log "could not unmount $mnt"
  done
}

# A process that has exited but not yet been reaped by init counts as gone: init here reaps
# only every couple of seconds.
pid_running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# end_pidfile SIGNAL PIDFILE: signal the process, wait up to 10 s for it to exit, then KILL.
end_pidfile() {
  local sig=$1 pidfile=$2 pid
  if pid_alive "$pidfile"; then
    pid=$(cat "$pidfile")
    kill "-$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do pid_running "$pid" || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

stop_quiet() {
  local c
  # KILL, not TERM: stop throws all their state away, and a graceful shutdown of the
  # apiserver or the scheduler costs seconds each.
  for c in kube-proxy kube-scheduler kube-controller-manager kubelet; do end_pidfile KILL "$dir/$c.pid"; done
  # Tear the pods down through CRI as kubelet would: CNI DEL frees their addresses and
  # deletes their netns, containerd unmounts their filesystems and ends their shims.
  if pid_alive "$dir/containerd.pid" && [[ -x $bin/crictl ]]; then
    timeout 60 "${crictl[@]}" rmp --all --force >/dev/null 2>&1 || log "crictl rmp did not finish"
  fi
  # containerd alone gets TERM: its image store outlives the cluster.
  end_pidfile TERM "$dir/containerd.pid"
  for c in kube-apiserver etcd; do end_pidfile KILL "$dir/$c.pid"; done
  kill_leftovers
  unmount_under "$dir"
  remove_chains
  if ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then ip link delete "$NODE_BRIDGE"; fi
  # CNI results of our network that a failed teardown left (libcni keeps them in /var/lib/cni).
  rm -f /var/lib/cni/results/"$CNI_NETWORK"-* 2>/dev/null || true
  rmdir /var/lib/cni/results /var/lib/cni 2>/dev/null || true
  # Kubelet links every container log into /var/log/containers, whatever its podLogsDir.
  find /var/log/containers -maxdepth 1 -type l -lname "$dir/*" -delete 2>/dev/null || true
  # Paths that kubelet and containerd hardcode whatever their root dirs: kubelet's device
  # plugin socket, containerd's shim sockets and netns, kubelet's log links. The dirs go when
  # empty, that is when nothing else uses them.
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet /run/containerd/s /run/containerd \
    /var/run/netns /var/log/containers 2>/dev/null || true
  restore_host_sysctls
  rm -f "$dir/env"
}

stop() {
  stop_quiet
  # Everything but containerd's image store (see ctr_root).
  if [[ -d $dir ]]; then
    find "$dir" -mindepth 1 -maxdepth 1 ! -name containerd-root -exec rm -rf {} +
  fi
}

status() {
  if healthy; then echo running; else echo "not running"; return 1; fi
}

# RSS of each node process, for the record.
usage() {
  local c total=0 rss
  for c in "${NODE_COMPONENTS[@]}"; do
    pid_alive "$dir/$c.pid" || continue
    rss=$(awk '/^VmRSS/{print $2}' "/proc/$(cat "$dir/$c.pid")/status")
    total=$((total + rss))
    printf '%-24s %6d MiB\n' "$c" $((rss / 1024))
  done
  printf '%-24s %6d MiB\n' total $((total / 1024))
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  purge) stop; rm -rf "$dir" ;;
  status) status ;;
  usage) usage ;;
  *) die "usage: $0 install|start|stop|purge|status|usage" ;;
esac
