#!/usr/bin/env bash
# A real `etcd` and `kube-apiserver` for the tests that run the controller against a real
# Kubernetes API server.
#
#   scripts/kube-tools.sh                      build (once per machine), link into .tools/kube/bin/
#   scripts/kube-tools.sh start DIR [FLAG...]  start etcd and the API server on 127.0.0.1, state in DIR
#   scripts/kube-tools.sh stop DIR             stop both
#   scripts/kube-tools.sh stop-apiserver DIR   stop the API server only (etcd keeps the data)
#   scripts/kube-tools.sh start-apiserver DIR  start it again, same port and flags
#
# `start` generates a service-account key pair and an admin token (openssl), runs the API server
# with RBAC, TLS (its own self-signed certificate), token and service-account authentication,
# waits for /readyz (at most 60 s; the log's tail otherwise) and writes DIR/kubeconfig (the admin,
# group system:masters), DIR/env (PORT, ETCD_PORT, ADMIN_TOKEN) and the logs DIR/*.log. FLAG...
# are extra kube-apiserver flags (e.g. --watch-cache=false). There is no kubelet, scheduler or
# controller-manager: pods stay Pending until their status is set through the status subresource.
#
# No registry these machines reach ships a kube-apiserver binary, so it is built from Debian's
# bookworm `kubernetes` source package (the full upstream v1.20.2 tree, with vendor/) with Debian's
# Go 1.19; etcd is Debian's `etcd-server`. Everything comes from Debian's archive through a private
# apt configuration (the system's sources and package lists are left alone).
#
# The build (about 8 minutes on 2 cores) lands in a cache outside the clone,
# ${WASM_EPP_CACHE:-~/.cache/wasm-epp}/kube-<version>/bin, so every later clone on the machine only
# links it. Safe to run concurrently (a lock serialises builds). Exit 0 when both binaries are in
# place; non-zero with one line saying which step failed otherwise.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
K8S_VERSION=1.20.2
# bookworm's source package holding the v1.20.2 tree (the "really" version is what it contains).
K8S_SOURCE_VERSION=1.20.5+really1.20.2-1.1+deb12u1
GO_VERSION=1.19
CACHE=${WASM_EPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/wasm-epp}/kube-$K8S_VERSION
BIN=$CACHE/bin
OUT=$ROOT/.tools/kube/bin

die() { printf 'kube-tools: %s\n' "$*" >&2; exit 1; }
say() { printf 'kube-tools: %s\n' "$*" >&2; }

# A free TCP port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts the API server of DIR (flags in DIR/apiserver.flags) and waits for /readyz.
start_apiserver() {
  local dir=$1 flags PORT ADMIN_TOKEN
  PORT=$(sed -n 's/^PORT=//p' "$dir/env")
  ADMIN_TOKEN=$(sed -n 's/^ADMIN_TOKEN=//p' "$dir/env")
  mapfile -t flags <"$dir/apiserver.flags"
  setsid "$OUT/kube-apiserver" "${flags[@]}" >>"$dir/apiserver.log" 2>&1 </dev/null &
  echo $! >"$dir/apiserver.pid"
  local deadline=$((SECONDS + 60))
  until curl -fsS --max-time 2 --cacert "$dir/certs/apiserver.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "https://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; do
    if ! kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null; then
      tail -20 "$dir/apiserver.log" >&2
      die "kube-apiserver exited during start-up"
    fi
    if ((SECONDS > deadline)); then
      tail -20 "$dir/apiserver.log" >&2
      die "kube-apiserver not ready within 60 s"
    fi
    sleep 0.2
  done
}

# Stops the process whose pid is in FILE (TERM, then KILL after 5 s).
stop_pid() {
  local file=$1 pid
  [[ -f $file ]] || return 0
  pid=$(cat "$file")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$file"
}

# Starts etcd and the API server with their state in DIR; the rest of the arguments are extra
# API server flags.
start() {
  local dir=$1
  shift
  mkdir -p "$dir/certs"
  dir=$(cd "$dir" && pwd)
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null || die "openssl genrsa failed"
  openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null || die "openssl rsa failed"
  local token etcd_port peer_port port
  token=$(openssl rand -hex 16)
  echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"
  etcd_port=$(free_port)
  peer_port=$(free_port)
  port=$(free_port)
  printf 'PORT=%s\nETCD_PORT=%s\nADMIN_TOKEN=%s\n' "$port" "$etcd_port" "$token" >"$dir/env"
  setsid "$OUT/etcd" --data-dir="$dir/etcd" --listen-client-urls="http://127.0.0.1:$etcd_port" \
    --advertise-client-urls="http://127.0.0.1:$etcd_port" --listen-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-cluster="default=http://127.0.0.1:$peer_port" --log-level=error >"$dir/etcd.log" 2>&1 </dev/null &
  echo $! >"$dir/etcd.pid"
  local deadline=$((SECONDS + 30))
  until curl -fsS --max-time 2 "http://127.0.0.1:$etcd_port/health" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      tail -20 "$dir/etcd.log" >&2
      die "etcd not healthy within 30 s"
    fi
    sleep 0.1
  done
  printf '%s\n' "--etcd-servers=http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 "--secure-port=$port" --insecure-port=0 "--cert-dir=$dir/certs" \
    "--token-auth-file=$dir/tokens.csv" --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc "--service-account-key-file=$dir/sa.pub" \
    "--service-account-signing-key-file=$dir/sa.key" --service-cluster-ip-range=10.0.0.0/24 \
    --disable-admission-plugins=ServiceAccount "$@" >"$dir/apiserver.flags"
  start_apiserver "$dir"
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kube-tools
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $dir/certs/apiserver.crt
users:
- name: admin
  user:
    token: $token
contexts:
- name: kube-tools
  context: {cluster: kube-tools, user: admin, namespace: default}
current-context: kube-tools
EOF
  say "API server on https://127.0.0.1:$port (etcd on 127.0.0.1:$etcd_port); kubeconfig $dir/kubeconfig"
}

link_out() {
  mkdir -p "$OUT"
  ln -sfn "$BIN/etcd" "$OUT/etcd"
  ln -sfn "$BIN/kube-apiserver" "$OUT/kube-apiserver"
}

built() { [[ -x $BIN/etcd && -x $BIN/kube-apiserver ]]; }

case ${1:-build} in
  build) ;;
  start | stop | stop-apiserver | start-apiserver)
    [[ $# -ge 2 ]] || die "usage: $0 $1 DIR"
    command=$1
    shift
    case $command in
      start)
        "$0" build
        start "$@"
        ;;
      stop)
        stop_pid "$1/apiserver.pid"
        stop_pid "$1/etcd.pid"
        ;;
      stop-apiserver) stop_pid "$1/apiserver.pid" ;;
      start-apiserver) start_apiserver "$1" ;;
    esac
    exit 0
    ;;
  *) die "unknown command '$1' (build, start DIR, stop DIR, stop-apiserver DIR, start-apiserver DIR)" ;;
esac

if built; then link_out; exit 0; fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if built; then link_out; exit 0; fi

command -v apt-get >/dev/null || die "apt-get is needed to fetch Debian's packages"
command -v dpkg >/dev/null || die "dpkg is needed to unpack Debian's packages"

WORK=$CACHE/work
rm -rf "$WORK"
mkdir -p "$WORK/apt/sources" "$WORK/apt/lists/partial" "$WORK/apt/cache/archives/partial" "$WORK/debs" "$WORK/root"

# A private apt: bookworm main, binaries and sources, lists and cache under $WORK.
cat >"$WORK/apt/sources/bookworm.sources" <<'EOF'
Types: deb deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
APT=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$WORK/apt/sources"
  -o "Dir::State::Lists=$WORK/apt/lists" -o "Dir::Cache=$WORK/apt/cache" -o "APT::Sandbox::User=root")

say "fetching Debian's package lists (private apt configuration)"
apt-get "${APT[@]}" -qq update >"$WORK/apt.log" 2>&1 || die "apt-get update failed (see $WORK/apt.log)"

say "downloading etcd-server, golang-$GO_VERSION and reflect2 1.0.2"
(cd "$WORK/debs" && apt-get "${APT[@]}" -qq download etcd-server "golang-$GO_VERSION-go" "golang-$GO_VERSION-src" \
  golang-github-modern-go-reflect2-dev) >>"$WORK/apt.log" 2>&1 || die "apt-get download failed (see $WORK/apt.log)"
for deb in "$WORK"/debs/*.deb; do dpkg -x "$deb" "$WORK/root"; done

say "downloading the kubernetes $K8S_SOURCE_VERSION source package"
(cd "$WORK" && apt-get "${APT[@]}" -qq source --download-only "kubernetes=$K8S_SOURCE_VERSION") >>"$WORK/apt.log" 2>&1 \
  || die "apt-get source failed (see $WORK/apt.log)"
orig=$(find "$WORK" -maxdepth 1 -name 'kubernetes_*.orig.tar.*' | head -1)
[[ -n $orig ]] || die "the kubernetes source package has no orig tarball"

GOPATH=$WORK/gopath
SRC=$GOPATH/src/k8s.io/kubernetes
mkdir -p "$SRC"
say "unpacking $(basename "$orig")"
tar -xf "$orig" -C "$SRC" --strip-components=1
[[ -d $SRC/cmd/kube-apiserver && -d $SRC/vendor ]] || die "the source tree lacks cmd/kube-apiserver or vendor/"

# The vendored reflect2 1.0.1 does not build with Go >= 1.18; Debian's 1.0.2 does.
rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
cp -r "$WORK/root/usr/share/gocode/src/github.com/modern-go/reflect2" "$SRC/vendor/github.com/modern-go/reflect2"

export GOROOT=$WORK/root/usr/lib/go-$GO_VERSION GOPATH GO111MODULE=off CGO_ENABLED=0
export GOCACHE=$WORK/go-build GOFLAGS='' PATH=$GOROOT/bin:$PATH
go version >/dev/null || die "Debian's Go $GO_VERSION does not run"

# The tree ships without its generated OpenAPI definitions; the vendored generator makes them for
# every package that asks for them with a `+k8s:openapi-gen=` tag.
say "generating OpenAPI definitions"
cd "$SRC"
go build -o "$WORK/openapi-gen" k8s.io/kubernetes/vendor/k8s.io/kube-openapi/cmd/openapi-gen \
  || die "building openapi-gen failed"
inputs=$(grep -rl --include='*.go' '+k8s:openapi-gen=' pkg staging/src/k8s.io vendor/k8s.io/kube-openapi 2>/dev/null \
  | grep -v '_test\.go$' | xargs -n1 dirname | sort -u \
  | sed -e 's#^staging/src/#k8s.io/kubernetes/vendor/#' -e 's#^pkg/#k8s.io/kubernetes/pkg/#' \
        -e 's#^vendor/#k8s.io/kubernetes/vendor/#' | paste -sd, -)
[[ -n $inputs ]] || die "no package carries a +k8s:openapi-gen tag"
"$WORK/openapi-gen" --logtostderr=false -i "$inputs" -p k8s.io/kubernetes/pkg/generated/openapi \
  -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
  --report-filename "$WORK/openapi-violations.txt" >"$WORK/openapi-gen.log" 2>&1 \
  || die "openapi-gen failed (see $WORK/openapi-gen.log)"

say "building kube-apiserver v$K8S_VERSION (about 8 minutes on 2 cores)"
mkdir -p "$BIN"
ver=k8s.io/kubernetes/vendor/k8s.io
ldflags="-s -w"
for pkg in component-base/version client-go/pkg/version; do
  ldflags+=" -X $ver/$pkg.gitVersion=v$K8S_VERSION -X $ver/$pkg.gitMajor=1 -X $ver/$pkg.gitMinor=20"
done
go build -ldflags "$ldflags" -o "$BIN/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver \
  || die "building kube-apiserver failed"
cp "$WORK/root/usr/bin/etcd" "$BIN/etcd"
mv "$BIN/kube-apiserver.tmp" "$BIN/kube-apiserver"
cd "$ROOT"
rm -rf "$WORK"
link_out
say "etcd and kube-apiserver are in $OUT (cached in $BIN)"
