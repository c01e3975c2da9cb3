#!/bin/bash
# A throw-away single-node Kubernetes (v1.20.2) for the Kubernetes tier, beside Docker.
#
#   scripts/k8s/cluster.sh up      # start it (root); prints the KUBECONFIG to use
#   scripts/k8s/cluster.sh down    # stop it and leave the host as it was
#   scripts/k8s/cluster.sh status  # is it up? (exit 0 / 1)
#   scripts/k8s/cluster.sh load IMAGE...   # copy images from Docker into its containerd
#
# etcd + kube-apiserver + controller-manager + scheduler + a private containerd (own
# socket, root and state) + kubelet + a CNI bridge, all on 127.0.0.1 (the API server also
# on the bridge's gateway address, so pods reach it there: no kube-proxy routes the
# `kubernetes` Service; deploy/kubernetes-local points the in-cluster server at it), and
# a directory for the in-cluster server's shared volume ($RUN/shared, uid 1000); Docker's
# engine is never touched (no restart, no config change). Adapted from the reference bring-up in
# ../shared/k8s (its README lists the traps this script works around).
#
# Binaries: ../shared/k8s/bin/*.xz (or $K8S_SHARED) when present; otherwise built from
# Debian's `kubernetes` source package with build-k8s.sh (~10 min on 2 cores).
# etcd, containerd, runc and the CNI plugins come from Debian's packages.
#
# What the host gets back on `down`: the four sysctls the kubelet changes (restored as
# soon as the node is Ready, and again on down), the FORWARD rule for the pod bridge
# (added only if missing, removed only if added here), the bridge, the network
# namespaces, mounts and cgroups of the pods, the directories the kubelet created.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SHARED=${K8S_SHARED:-$REPO/../shared/k8s}
BASE=${K8S_BASE:-/tmp/kernel-sandbox-k8s}
IMAGES=${K8S_IMAGES:-kernel-sandbox:python kernel-sandbox:datascience kernel-sandbox:server}
BIN=$BASE/bin
CNIBIN=$BASE/pkgroot/usr/lib/cni
RUN=$BASE/run
PKI=$RUN/pki
SOCK=$RUN/containerd/containerd.sock
BRIDGE=${K8S_BRIDGE:-ksk8s0}
POD_CIDR=${K8S_POD_CIDR:-10.244.78.0/24}   # docker0=172.17/16, br-*=172.18+/16
POD_GATEWAY=${POD_CIDR%.*}.1   # the bridge's address: pods reach the API server there
NODE=localhost
ETCD_PORT=22379; ETCD_PEER=22380; API_PORT=26443; KUBELET_PORT=21250; KUBELET_HEALTH=21248
CM_PORT=20257; SCHED_PORT=20259
KUBECTL="$BIN/kubectl --kubeconfig $RUN/admin.kubeconfig"
FORWARD_RULE=(FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT)
SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops"
log() { echo "[k8s $(date +%T)] $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

gen_cert() { # name CN O kind(client|server) [sans]
  local n=$1 cn=$2 o=$3 kind=$4 sans=${5:-}
  local subj="/CN=$cn"; [ -n "$o" ] && subj="/O=$o/CN=$cn"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$n.key" -out "$PKI/$n.csr" -subj "$subj" 2>/dev/null
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [ "$kind" = server ]; then echo "extendedKeyUsage=serverAuth"; echo "subjectAltName=$sans";
    else echo "extendedKeyUsage=clientAuth"; fi; } > "$PKI/$n.ext"
  openssl x509 -req -in "$PKI/$n.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 30 -out "$PKI/$n.crt" -extfile "$PKI/$n.ext" 2>/dev/null
}
kubeconfig() { # file cert
  cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: ks, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: $PKI/ca.crt}}]
users: [{name: u, user: {client-certificate: $PKI/$2.crt, client-key: $PKI/$2.key}}]
contexts: [{name: ks, context: {cluster: ks, user: u}}]
current-context: ks
EOF
}

setup() { # binaries into $BIN (idempotent)
  [ -x "$BIN/kubelet" ] && [ -x "$BIN/etcd" ] && [ -x "$CNIBIN/bridge" ] && [ -x "$BASE/pause/pause" ] && return
  export DEBIAN_FRONTEND=noninteractive
  local need=()
  for c in containerd runc openssl curl xz iptables; do command -v "$c" >/dev/null || need+=("$c"); done
  [ ${#need[@]} -gt 0 ] && { apt-get update -qq; apt-get install -y -qq containerd runc openssl curl xz-utils iptables >/dev/null; }
  mkdir -p "$BASE/debs" "$BASE/pkgroot" "$BIN" "$BASE/pause"
  # unpacked only: installing etcd-server would start a system etcd
  (cd "$BASE/debs" && { apt-get download etcd-server containernetworking-plugins kubernetes-client 2>/dev/null \
     || { apt-get update -qq && apt-get download etcd-server containernetworking-plugins kubernetes-client; }; } >/dev/null)
  for d in "$BASE"/debs/*.deb; do dpkg-deb -x "$d" "$BASE/pkgroot"; done
  cp "$BASE/pkgroot/usr/bin/etcd" "$BASE/pkgroot/usr/bin/kubectl" "$BIN/"
  if [ -f "$SHARED/bin/kubelet.xz" ]; then
    for b in kube-apiserver kubelet kube-controller-manager kube-scheduler; do
      xz -dc "$SHARED/bin/$b.xz" > "$BIN/$b" && chmod 755 "$BIN/$b"
    done
  else
    log "no prebuilt binaries in $SHARED/bin: building them from Debian's source package (~10 min)"
    W=$BASE/build "$HERE/build-k8s.sh" >&2
    cp "$BASE"/build/kubernetes-1.20.2/_output/bin/{kube-apiserver,kubelet,kube-controller-manager,kube-scheduler} "$BIN/"
  fi
  if [ -x "$SHARED/pause/pause" ]; then cp "$SHARED/pause/pause" "$BASE/pause/pause"
  else gcc -Os -static -o "$BASE/pause/pause" "$HERE/pause/pause.c"; fi
  chmod 755 "$BASE/pause/pause"
}

prepare() {
  rm -rf "$RUN"
  mkdir -p "$PKI" "$RUN/containerd" "$RUN/cni/net.d" "$RUN/cni/ipam" "$RUN/kubelet" "$RUN/logs" "$RUN/opt"
  # the in-cluster server's shared volume (deploy/kubernetes-local: a hostPath PV), as
  # its pods' user (1000) owns it: a hostPath is mounted as the node has it
  install -d -o 1000 -g 1000 -m 0700 "$RUN/shared"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -days 30 -subj /CN=kernel-sandbox-ca 2>/dev/null
  gen_cert apiserver kube-apiserver "" server \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.96.0.1,IP:$POD_GATEWAY"
  gen_cert admin admin system:masters client
  gen_cert node system:node:$NODE system:nodes client
  gen_cert apiserver-kubelet kube-apiserver-kubelet-client system:masters client
  gen_cert controller-manager system:kube-controller-manager "" client
  gen_cert scheduler system:kube-scheduler "" client
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null; openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  for k in admin:admin kubelet:node controller-manager:controller-manager scheduler:scheduler; do
    kubeconfig "$RUN/${k%%:*}.kubeconfig" "${k##*:}"
  done
  cat > "$RUN/containerd/config.toml" <<EOF
version = 2
root = "$RUN/containerd/root"
state = "$RUN/containerd/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$RUN/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "kernel-sandbox.local/pause:3.2"
  # no CAP_SYS_RESOURCE in this VM's bounding set: nothing may lower oom_score_adj
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNIBIN"
    conf_dir = "$RUN/cni/net.d"
    max_conf_num = 1
EOF
  cat > "$RUN/cni/net.d/10-kernel-sandbox.conflist" <<EOF
{ "cniVersion": "0.4.0", "name": "kernel-sandbox",
  "plugins": [ { "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false,
                 "hairpinMode": false,
                 "ipam": { "type": "host-local", "dataDir": "$RUN/cni/ipam",
                           "ranges": [[{ "subnet": "$POD_CIDR" }]], "routes": [{ "dst": "0.0.0.0/0" }] } } ] }
EOF
  cat > "$RUN/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTH
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failSwapOn: false
makeIPTablesUtilChains: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
evictionHard: {memory.available: "100Mi", nodefs.available: "2%", imagefs.available: "2%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
serializeImagePulls: false
nodeStatusUpdateFrequency: 2s
containerLogMaxSize: 1Mi
containerLogMaxFiles: 2
podPidsLimit: 1024
featureGates: {SizeMemoryBackedVolumes: true}   # memory emptyDirs get sizeLimit as tmpfs size (ENOSPC, as on Docker)
EOF
  python3 "$HERE/pause/mkimage.py" "$RUN/pause-image.tar" kernel-sandbox.local/pause:3.2 "$BASE/pause/pause"
  sysctl -n $SYSCTLS > "$RUN/sysctl.saved"
  iptables-save > "$RUN/iptables.before"
  for d in /var/log/pods /var/log/containers; do [ -e $d ] || echo $d >> "$RUN/created-dirs"; done
  [ -e /run/netns ] || echo /run/netns > "$RUN/created-netns-dir"
}

wait_for() { # desc timeout cmd...
  local d=$1 t=$2; shift 2; local s; s=$(now)
  until "$@" >/dev/null 2>&1; do
    if awk -v x="$(since "$s")" -v t="$t" 'BEGIN{exit !(x>t)}'; then log "TIMEOUT waiting for $d"; return 1; fi
    sleep 0.2
  done
  log "$d after $(since "$s")s"
}
start() { # name cmd...
  local n=$1; shift; setsid "$@" > "$RUN/logs/$n.log" 2>&1 < /dev/null & echo $! > "$RUN/$n.pid"
}
restore_sysctls() {
  [ -f "$RUN/sysctl.saved" ] || return 0
  local a b c d; read -r a b c d <<< "$(tr '\n' ' ' < "$RUN/sysctl.saved")"
  sysctl -q -w vm.overcommit_memory="$a" vm.panic_on_oom="$b" kernel.panic="$c" kernel.panic_on_oops="$d"
}

load() { # images from Docker into our containerd; one loaded already (same id) is skipped
  local img t id stamp
  mkdir -p "$RUN/loaded"
  for img in "$@"; do
    t=$(now)
    if ! id=$(docker image inspect -f '{{.Id}}' "$img" 2>/dev/null); then
      log "image $img is not in Docker: skipped"; continue
    fi
    stamp="$RUN/loaded/$(printf '%s' "$img" | tr '/:' '__')"
    if [ "$(cat "$stamp" 2>/dev/null)" = "$id" ]; then log "image $img is loaded already"; continue; fi
    docker save "$img" | ctr -a "$SOCK" -n k8s.io images import - >/dev/null
    printf '%s\n' "$id" >"$stamp"
    log "image $img loaded in $(since "$t")s"
  done
}

up() {
  if status >/dev/null 2>&1; then log "already up"; echo "$RUN/admin.kubeconfig"; return; fi
  local T0; T0=$(now)
  if [ -d "$RUN" ]; then
    # an earlier cluster that was never taken down (its processes killed, its mounts,
    # bridge, rule and sysctls left): undo it first, as `down` would have
    log "leftovers of an earlier cluster in $RUN: taking them down first"
    ( down ) >&2
  fi
  setup; prepare
  start etcd "$BIN/etcd" --name ks --data-dir "$RUN/etcd" \
    --listen-client-urls http://127.0.0.1:$ETCD_PORT --advertise-client-urls http://127.0.0.1:$ETCD_PORT \
    --listen-peer-urls http://127.0.0.1:$ETCD_PEER --initial-advertise-peer-urls http://127.0.0.1:$ETCD_PEER \
    --initial-cluster ks=http://127.0.0.1:$ETCD_PEER --listen-metrics-urls ""
  start containerd containerd --config "$RUN/containerd/config.toml"
  wait_for etcd 60 curl -sf http://127.0.0.1:$ETCD_PORT/health
  start apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:$ETCD_PORT \
    --bind-address=0.0.0.0 --advertise-address=127.0.0.1 --secure-port=$API_PORT --insecure-port=0 \
    --client-ca-file="$PKI/ca.crt" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet.crt" --kubelet-client-key="$PKI/apiserver-kubelet.key" \
    --kubelet-preferred-address-types=Hostname,InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range=10.96.0.0/24 --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction,ResourceQuota --allow-privileged=false --profiling=false
  wait_for containerd 60 ctr -a "$SOCK" version
  ctr -a "$SOCK" -n k8s.io images import "$RUN/pause-image.tar" >/dev/null
  # shellcheck disable=SC2086
  ( load $IMAGES ) & local import_pid=$!
  wait_for apiserver 120 curl -sf --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    https://127.0.0.1:$API_PORT/readyz
  # the FORWARD policy is Docker's DROP: pod <-> pod traffic on our bridge needs a rule
  if ! iptables -C "${FORWARD_RULE[@]}" 2>/dev/null; then
    iptables -I "${FORWARD_RULE[0]}" 1 "${FORWARD_RULE[@]:1}" && touch "$RUN/forward-rule-added"
  fi
  start kubelet "$BIN/kubelet" --config="$RUN/kubelet/config.yaml" --kubeconfig="$RUN/kubelet.kubeconfig" \
    --root-dir="$RUN/kubelet" --cert-dir="$RUN/kubelet/pki" --hostname-override=$NODE \
    --container-runtime=remote --container-runtime-endpoint=unix://$SOCK \
    --image-service-endpoint=unix://$SOCK --runtime-request-timeout=5m --v=1
  start controller-manager "$BIN/kube-controller-manager" --kubeconfig="$RUN/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$RUN/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$RUN/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=$CM_PORT --port=0 --leader-elect=false \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --use-service-account-credentials=true --controllers='*,-nodeipam,-route,-service'
  start scheduler "$BIN/kube-scheduler" --kubeconfig="$RUN/scheduler.kubeconfig" \
    --authentication-kubeconfig="$RUN/scheduler.kubeconfig" --authorization-kubeconfig="$RUN/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=$SCHED_PORT --port=0 --leader-elect=false
  wait_for "node Ready" 180 sh -c "$KUBECTL get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  # the kubelet set its sysctls once at start; give the host its own values back now
  restore_sysctls
  wait_for "default service account" 60 sh -c "$KUBECTL get sa default -o name"
  wait "$import_pid"
  log "cluster up in $(since "$T0")s; KUBECONFIG=$RUN/admin.kubeconfig"
  echo "$RUN/admin.kubeconfig"
}

status() {
  [ -f "$RUN/apiserver.pid" ] && kill -0 "$(cat "$RUN/apiserver.pid")" 2>/dev/null && \
    $KUBECTL get node $NODE >/dev/null 2>&1
}

stop_pid() { # name; a pid is signalled only while its command line names $RUN (pids are reused)
  local f=$RUN/$1.pid p
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  if ! grep -qF -- "$RUN/" "/proc/$p/cmdline" 2>/dev/null; then rm -f "$f"; return 0; fi
  kill "$p" 2>/dev/null || { rm -f "$f"; return 0; }
  for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || { rm -f "$f"; return 0; }; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null; rm -f "$f"
}

down() {
  set +e
  [ -d "$RUN" ] || { log "nothing to stop"; return 0; }
  if status; then
    # pods of every namespace, so that the kubelet tears their sandboxes down (CNI DEL)
    $KUBECTL delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1
    for _ in $(seq 50); do
      [ -z "$(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null)" ] && break; sleep 0.2
    done
  fi
  for n in scheduler controller-manager kubelet; do stop_pid $n; done
  if [ -S "$SOCK" ]; then
    for c in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$SOCK" -n k8s.io tasks kill -s KILL "$c"; done
    sleep 1
    for c in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do ctr -a "$SOCK" -n k8s.io tasks delete -f "$c"; done
  fi
  stop_pid containerd
  for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK"); do kill "$p"; done
  stop_pid apiserver; stop_pid etcd
  findmnt -rn -o TARGET | grep -E "^$RUN/|^/run/netns/cni-" | sort -r | while read -r m; do umount -l "$m"; done
  for ns in /run/netns/cni-*; do [ -e "$ns" ] && rm -f "$ns"; done
  if [ -f "$RUN/created-netns-dir" ]; then mountpoint -q /run/netns && umount /run/netns; rmdir /run/netns; fi
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
  for s in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/k8s.io; do
    [ -d "$s" ] && find "$s" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  [ -f "$RUN/forward-rule-added" ] && iptables -D "${FORWARD_RULE[@]}"
  restore_sysctls
  if [ -f "$RUN/iptables.before" ]; then
    # report (never undo) differences: Docker changes its own rules while others work
    diff <(grep -vE '^[#:]' "$RUN/iptables.before" | grep -i -E 'ksk8s|kube|cni' ) \
         <(iptables-save | grep -vE '^[#:]' | grep -i -E 'ksk8s|kube|cni') >&2 \
      && log "iptables: no rule of ours is left"
  fi
  if [ -f "$RUN/created-dirs" ]; then
    while read -r d; do rm -rf -- "$d"; done < "$RUN/created-dirs"
  fi
  rm -rf "$RUN"
  log "down: sysctls $(sysctl -n $SYSCTLS | tr '\n' ' ')"
}

case "${1:-}" in
  setup) setup ;; up) up ;; down) down ;; status) status ;;
  load) shift; load "$@" ;;
  kubeconfig) echo "$RUN/admin.kubeconfig" ;;
  *) echo "usage: $0 up|down|status|load IMAGE...|kubeconfig|setup"; exit 2 ;;
esac
