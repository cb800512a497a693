# shellcheck shell=bash
# Helpers shared by the kind suite's scripts (sourced, not run).

KIND_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC2034  # used by the scripts that source this file
REPO_ROOT=$(cd "$KIND_DIR/../.." && pwd)
# shellcheck source=SCRIPTDIR/versions.env
source "$KIND_DIR/versions.env"

KUBECTL=${KUBECTL:-kubectl}
HELM=${HELM:-helm}
DOCKER=${DOCKER:-docker}

log() { printf '[kind-e2e %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found on PATH (see docs/e2e.md, prerequisites)"
  done
}

# Sets KIND to a kind binary of exactly KIND_VERSION: $KIND if set, else `kind` on PATH when its version
# matches, else the pinned release downloaded once into ~/.cache/kuberl/kind/<version>/ (checksum verified).
resolve_kind() {
  if [[ -n ${KIND:-} ]]; then
    return 0
  fi
  if command -v kind >/dev/null 2>&1 && [[ $(kind version 2>/dev/null | awk '{print $2}') == "$KIND_VERSION" ]]; then
    KIND=kind
    return 0
  fi
  local cache=${XDG_CACHE_HOME:-$HOME/.cache}/kuberl/kind/$KIND_VERSION
  KIND=$cache/kind
  if [[ -x $KIND ]]; then
    return 0
  fi
  local os arch url
  os=$(uname -s | tr '[:upper:]' '[:lower:]')
  case $(uname -m) in
    x86_64 | amd64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) die "no kind release binary for $(uname -m); install kind $KIND_VERSION and set KIND=/path/to/kind" ;;
  esac
  need curl
  url=https://github.com/kubernetes-sigs/kind/releases/download/$KIND_VERSION/kind-$os-$arch
  log "downloading kind $KIND_VERSION ($url)"
  mkdir -p "$cache"
  curl -fsSL --retry 3 -o "$cache/kind.download" "$url"
  curl -fsSL --retry 3 -o "$cache/kind.sha256sum" "$url.sha256sum"
  local want got
  want=$(awk '{print $1}' "$cache/kind.sha256sum")
  if command -v sha256sum >/dev/null 2>&1; then
    got=$(sha256sum "$cache/kind.download" | awk '{print $1}')
  else
    got=$(shasum -a 256 "$cache/kind.download" | awk '{print $1}')
  fi
  [[ -n $want && $got == "$want" ]] || die "checksum mismatch for $url: expected $want, got $got"
  chmod +x "$cache/kind.download"
  mv "$cache/kind.download" "$KIND"
}

cluster_exists() {
  "$KIND" get clusters 2>/dev/null | grep -qx -- "$1"
}

# `timeout SECONDS cmd...` where coreutils' timeout exists (macOS has none by default), else plain `cmd...`.
with_timeout() {
  local seconds=$1
  shift
  if command -v timeout >/dev/null 2>&1; then
    timeout "$seconds" "$@"
  else
    "$@"
  fi
}
