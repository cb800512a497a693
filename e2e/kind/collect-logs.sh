#!/usr/bin/env bash
# Collects what explains a failed run of the kind suite into a folder (best effort: a command that fails leaves
# its error message in its file and the collection goes on).
#
#   KUBECONFIG=FILE e2e/kind/collect-logs.sh --out DIR [--namespace NS]... [--cluster NAME]
#
# DIR/cluster/   nodes, `kubectl describe nodes`, every object and every event of the cluster, helm releases
# DIR/<ns>/      for each namespace (default: kuberl-e2e kuberl-system ray-system): RLJob/RayJob/RayCluster/Job/
#                Pod/ConfigMap YAML, `kubectl describe` of each kind, events, pods/<pod>.log (and
#                <pod>.previous.log after a restart), ray/<pod>/logs/ (Ray's session logs: driver, raylet,
#                worker-*.out/err of the trainer's actors) from every Ray pod still running
# DIR/kind/      `kind export logs` (kubelet, containerd, the node's journal) when --cluster is given
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

out=""
cluster=""
namespaces=()
while (($#)); do
  case $1 in
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --namespace) namespaces+=("${2:?--namespace needs a value}"); shift 2 ;;
    --cluster) cluster=${2:?--cluster needs a value}; shift 2 ;;
    -h | --help) sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (try --help)" ;;
  esac
done
[[ -n $out ]] || die "--out DIR is required"
((${#namespaces[@]})) || namespaces=(kuberl-e2e kuberl-system ray-system)
mkdir -p "$out"
K=("$KUBECTL" --request-timeout=30s)
STEP_TIMEOUT=${KUBERL_KIND_COLLECT_TIMEOUT:-120}

# capture FILE COMMAND...: the command's stdout and stderr into FILE; a failure is noted in FILE, never fatal
capture() {
  local file=$1
  shift
  mkdir -p "$(dirname "$file")"
  with_timeout "$STEP_TIMEOUT" "$@" >"$file" 2>&1 || printf '\n(exit status %s: %s)\n' "$?" "$*" >>"$file"
}

names() {  # names NAMESPACE KIND [SELECTOR]: the names of the objects, one a line (nothing on error)
  "${K[@]}" get "$2" -n "$1" ${3:+-l "$3"} -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' \
    2>/dev/null || true
}

log "collecting logs into $out"
capture "$out/cluster/version.txt" "${K[@]}" version
capture "$out/cluster/nodes.txt" "${K[@]}" get nodes -o wide
capture "$out/cluster/describe-nodes.txt" "${K[@]}" describe nodes
capture "$out/cluster/all.txt" "${K[@]}" get all,rljobs,rayjobs,rayclusters -A -o wide
capture "$out/cluster/events.txt" "${K[@]}" get events -A --sort-by=.metadata.creationTimestamp
capture "$out/cluster/crds.txt" "${K[@]}" get crds
capture "$out/cluster/helm-releases.txt" "$HELM" list -A

for ns in "${namespaces[@]}"; do
  dir=$out/$ns
  for kind in rljobs rayjobs rayclusters jobs pods configmaps serviceaccounts roles rolebindings; do
    capture "$dir/$kind.yaml" "${K[@]}" get "$kind" -n "$ns" -o yaml
  done
  for kind in rljobs rayjobs rayclusters jobs pods deployments; do
    capture "$dir/describe-$kind.txt" "${K[@]}" describe "$kind" -n "$ns"
  done
  capture "$dir/events.txt" "${K[@]}" get events -n "$ns" --sort-by=.metadata.creationTimestamp -o wide

  while read -r pod; do
    [[ -n $pod ]] || continue
    capture "$dir/pods/$pod.log" "${K[@]}" logs -n "$ns" "$pod" --all-containers --prefix --timestamps
    if ! "${K[@]}" logs -n "$ns" "$pod" --all-containers --prefix --timestamps --previous \
      >"$dir/pods/$pod.previous.log" 2>/dev/null; then
      rm -f "$dir/pods/$pod.previous.log"
    fi
  done < <(names "$ns" pods)

  # Ray's own log files (the driver's job-driver-*.log, raylet, gcs, each actor's worker-*.out/err)
  while read -r pod; do
    [[ -n $pod ]] || continue
    mkdir -p "$dir/ray/$pod"
    if ! with_timeout "$STEP_TIMEOUT" "${K[@]}" exec -n "$ns" "$pod" -- tar -C /tmp/ray/session_latest -czf - logs \
      2>"$dir/ray/$pod/exec-error.txt" | tar -xzf - -C "$dir/ray/$pod" 2>>"$dir/ray/$pod/exec-error.txt"; then
      log "could not copy Ray's logs from $ns/$pod (see $dir/ray/$pod/exec-error.txt)"
    fi
    [[ -s $dir/ray/$pod/exec-error.txt ]] || rm -f "$dir/ray/$pod/exec-error.txt"
  done < <(names "$ns" pods ray.io/node-type)
done

if [[ -n $cluster ]]; then
  resolve_kind
  capture "$out/kind/export.txt" "$KIND" export logs "$out/kind" --name "$cluster"
fi
log "logs collected in $out"
