#!/usr/bin/env bash
# Builds the real Kubernetes components the e2e harness runs, into a cache outside the repo.
#
#   bash e2e/tools.sh install   build what is missing (prints what it reused), idempotent;
#                               `install "kuberay helm"` builds only those parts (k8s, helm, kuberay)
#   bash e2e/tools.sh env       print the tool paths as shell assignments
#   bash e2e/tools.sh clean     remove this version's cached binaries (forces a rebuild)
#
# Cache: ${KUBERL_TOOLS_DIR:-~/.cache/kuberl/tools}/kubernetes-<K8S_VERSION>/ holds
# kube-apiserver, kube-controller-manager, kubectl and etcd (all from e2e/tools/go.mod);
# .../helm-<HELM_VERSION>/helm; .../kuberay-<KUBERAY_VERSION>/ holds ray-operator (KubeRay's controller, built
# from the github.com/ray-project/kuberay/ray-operator module), crds/ (every CRD of the module's config/crd/bases)
# and rbac/role.yaml (the ClusterRole the operator's own manifests grant it). A stamp file records the inputs
# (go.mod, go.sum, versions, flags); when they change, the binaries are rebuilt. Go's module and build caches stay at their
# defaults (GOMODCACHE, GOCACHE), so a rebuild after a version bump is incremental.
set -euo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MOD_DIR=$E2E_DIR/tools
# shellcheck source=e2e/tools/versions.env
source "$MOD_DIR/versions.env"

TOOLS_ROOT=${KUBERL_TOOLS_DIR:-$HOME/.cache/kuberl/tools}
K8S_DIR=$TOOLS_ROOT/kubernetes-$K8S_VERSION
HELM_DIR=$TOOLS_ROOT/helm-$HELM_VERSION
KUBERAY_DIR=$TOOLS_ROOT/kuberay-$KUBERAY_VERSION
KUBERAY_MODULE=github.com/ray-project/kuberay/ray-operator
K8S_BINS=(kube-apiserver kube-controller-manager kubectl etcd)

# Static binaries, no cgo (nothing to compile in C, and nothing links against the host's libc).
export CGO_ENABLED=0
export GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
export GOTOOLCHAIN=local
BUILD_DATE=2000-01-01T00:00:00Z   # fixed so that builds are reproducible

k8s_ldflags() {
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local flags="-s -w" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$BUILD_DATE"
  done
  echo "$flags"
}

helm_ldflags() {
  echo "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
}

stamp_of() {  # the inputs of a build, hashed
  case $1 in
    k8s) { cat "$MOD_DIR/go.mod" "$MOD_DIR/go.sum" "$MOD_DIR/etcd/main.go"; k8s_ldflags; echo "$GOFLAGS $CGO_ENABLED"; go env GOVERSION; } | sha256sum | cut -d' ' -f1 ;;
    helm) { echo "$HELM_VERSION"; helm_ldflags; echo "$GOFLAGS $CGO_ENABLED"; go env GOVERSION; } | sha256sum | cut -d' ' -f1 ;;
    kuberay) { echo "$KUBERAY_VERSION"; echo "$GOFLAGS $CGO_ENABLED"; go env GOVERSION; } | sha256sum | cut -d' ' -f1 ;;
  esac
}

is_current() {  # is_current k8s|helm|kuberay DIR FILE...
  local what=$1 dir=$2; shift 2
  [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$(stamp_of "$what")" ]] || return 1
  local b; for b in "$@"; do [[ -e $dir/$b ]] || return 1; done
}

need_go() {
  command -v go >/dev/null || { echo "tools.sh: 'go' is not on PATH (Go >= 1.26 builds the tools)" >&2; exit 1; }
  local pinned; pinned=$(grep -oE '^\s*(require\s+)?k8s\.io/kubernetes v[^ ]+' "$MOD_DIR/go.mod" | awk '{print $NF}')
  [[ $pinned == "$K8S_VERSION" ]] || { echo "tools.sh: go.mod pins k8s.io/kubernetes $pinned but versions.env says $K8S_VERSION" >&2; exit 1; }
}

install_k8s() {
  if is_current k8s "$K8S_DIR" "${K8S_BINS[@]}"; then
    echo "reused  kubernetes $K8S_VERSION (${K8S_BINS[*]}) in $K8S_DIR"; return
  fi
  echo "build   kubernetes $K8S_VERSION (${K8S_BINS[*]}) -> $K8S_DIR"
  local tmp=$K8S_DIR.tmp.$$ t0=$SECONDS
  rm -rf "$tmp"; mkdir -p "$tmp"
  # One `go build` for all four so that the shared packages compile once, in parallel.
  (cd "$MOD_DIR" && go build -ldflags "$(k8s_ldflags)" -o "$tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kubectl ./etcd)
  stamp_of k8s > "$tmp/.stamp"
  rm -rf "$K8S_DIR"; mv "$tmp" "$K8S_DIR"
  echo "built   kubernetes $K8S_VERSION in $((SECONDS - t0)) s"
}

install_helm() {
  if is_current helm "$HELM_DIR" helm; then
    echo "reused  helm $HELM_VERSION in $HELM_DIR"; return
  fi
  echo "build   helm $HELM_VERSION -> $HELM_DIR"
  local tmp=$HELM_DIR.tmp.$$ t0=$SECONDS
  rm -rf "$tmp"; mkdir -p "$tmp"
  # `go install pkg@version` builds with helm's own go.mod and go.sum (checked against the checksum DB).
  GOBIN=$tmp GOFLAGS="-trimpath -buildvcs=false" go install -ldflags "$(helm_ldflags)" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
  stamp_of helm > "$tmp/.stamp"
  rm -rf "$HELM_DIR"; mv "$tmp" "$HELM_DIR"
  echo "built   helm $HELM_VERSION in $((SECONDS - t0)) s"
}

install_kuberay() {
  if is_current kuberay "$KUBERAY_DIR" ray-operator crds/ray.io_rayjobs.yaml rbac/role.yaml; then
    echo "reused  kuberay $KUBERAY_VERSION (ray-operator, CRDs, RBAC) in $KUBERAY_DIR"; return
  fi
  echo "build   kuberay $KUBERAY_VERSION (ray-operator, CRDs, RBAC) -> $KUBERAY_DIR"
  local tmp=$KUBERAY_DIR.tmp.$$ t0=$SECONDS src
  rm -rf "$tmp"; mkdir -p "$tmp/crds" "$tmp/rbac"
  # The binary and the manifests come from one module version (its go.sum checked against the checksum DB).
  GOBIN=$tmp GOFLAGS="-trimpath -buildvcs=false" go install -ldflags "-s -w" "$KUBERAY_MODULE@$KUBERAY_VERSION"
  src=$(GOFLAGS=-mod=mod go mod download -json "$KUBERAY_MODULE@$KUBERAY_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  [[ -d $src/config/crd/bases ]] || { echo "tools.sh: $KUBERAY_MODULE@$KUBERAY_VERSION has no config/crd/bases" >&2; exit 1; }
  cp "$src"/config/crd/bases/*.yaml "$tmp/crds/"
  cp "$src/config/rbac/role.yaml" "$tmp/rbac/role.yaml"
  chmod -R u+w "$tmp"   # the module cache is read-only; the copies need not be
  stamp_of kuberay > "$tmp/.stamp"
  rm -rf "$KUBERAY_DIR"; mv "$tmp" "$KUBERAY_DIR"
  echo "built   kuberay $KUBERAY_VERSION in $((SECONDS - t0)) s"
}

print_env() {
  echo "KUBERL_TOOLS_DIR=$TOOLS_ROOT"
  local b var
  for b in "${K8S_BINS[@]}"; do
    var=$(echo "KUBERL_${b//-/_}" | tr '[:lower:]' '[:upper:]')
    echo "$var=$K8S_DIR/$b"
  done
  echo "KUBERL_HELM=$HELM_DIR/helm"
  echo "KUBERL_RAY_OPERATOR=$KUBERAY_DIR/ray-operator"
  echo "KUBERL_KUBERAY_CRDS=$KUBERAY_DIR/crds"
}

case ${1:-} in
  install)
    need_go
    t0=$SECONDS
    for part in ${2:-k8s helm kuberay}; do "install_$part"; done
    echo "tools ready in $((SECONDS - t0)) s; paths: bash e2e/tools.sh env"
    ;;
  env) print_env ;;
  clean) rm -rf "$K8S_DIR" "$HELM_DIR" "$KUBERAY_DIR"; echo "removed $K8S_DIR $HELM_DIR $KUBERAY_DIR" ;;
  *) sed -n '2,7s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 2 ;;
esac
