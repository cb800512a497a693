#!/usr/bin/env bash
# Creates the kind cluster of the acceptance suite and writes its kubeconfig to a file of its own (the user's
# ~/.kube/config is left alone). With --reuse, an existing cluster of that name is used as it is.
#
#   e2e/kind/create-cluster.sh [--name NAME] [--kubeconfig FILE] [--reuse]
#
# Defaults: --name kuberl-e2e, --kubeconfig runs/kind-e2e/NAME.kubeconfig. Versions: e2e/kind/versions.env
# (KIND_VERSION, KIND_NODE_IMAGE). Exit status 3: the cluster already existed and --reuse was not given.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

name=${KUBERL_KIND_CLUSTER:-kuberl-e2e}
kubeconfig=""
reuse=false
while (($#)); do
  case $1 in
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --kubeconfig) kubeconfig=${2:?--kubeconfig needs a value}; shift 2 ;;
    --reuse) reuse=true; shift ;;
    -h | --help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (try --help)" ;;
  esac
done
kubeconfig=${kubeconfig:-$REPO_ROOT/runs/kind-e2e/$name.kubeconfig}

need "$DOCKER"
"$DOCKER" info >/dev/null 2>&1 || die "cannot reach the Docker daemon ($DOCKER info failed)"
resolve_kind

if cluster_exists "$name"; then
  if ! $reuse; then
    log "kind cluster $name already exists: pass --reuse, or delete it ($KIND delete cluster --name $name)"
    exit 3
  fi
  log "reusing kind cluster $name"
else
  log "creating kind cluster $name ($KIND_NODE_IMAGE, kind $KIND_VERSION)"
  mkdir -p "$(dirname "$kubeconfig")"
  "$KIND" create cluster --name "$name" --image "$KIND_NODE_IMAGE" --wait 300s --kubeconfig "$kubeconfig"
fi

mkdir -p "$(dirname "$kubeconfig")"
(umask 077 && "$KIND" get kubeconfig --name "$name" >"$kubeconfig")
KUBECONFIG=$kubeconfig "$KUBECTL" wait --for=condition=Ready nodes --all --timeout=300s >/dev/null
log "cluster $name is ready; kubeconfig: $kubeconfig"
