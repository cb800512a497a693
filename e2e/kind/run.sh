#!/usr/bin/env bash
# The release acceptance suite: examples/tiny-cpu.yaml on a real Kubernetes (kind) with the real KubeRay operator,
# the kuberl chart and both images built from this checkout. Needs Docker; see docs/e2e.md.
#
#   bash e2e/kind/run.sh [--keep] [--reuse] [--skip-build] [--timeout SECONDS] [--artifacts DIR] [--name CLUSTER]
#
#   --keep        keep the kind cluster on exit (default: delete it, whether the run passed or failed)
#   --reuse       use an existing kind cluster of that name (e.g. one kept with --keep) instead of failing
#   --skip-build  use kuberl/operator:dev and kuberl/trainer:dev as they are in the local Docker
#   --timeout     seconds for the RLJob to reach Succeeded once applied (default 1200)
#   --artifacts   where the run's record and, on failure, the collected logs go (default runs/kind-e2e/<UTC time>)
#   --name        the kind cluster's name (default kuberl-e2e)
#
# Pinned versions: e2e/kind/versions.env (KIND_VERSION, KIND_NODE_IMAGE, KUBERAY_CHART_VERSION, KUBERAY_HELM_REPO);
# each is overridable from the environment, like the KUBERL_KIND_* defaults below and KUBECTL/HELM/DOCKER/KIND.
set -euo pipefail
# shellcheck source=SCRIPTDIR/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- settings -------------------------------------------------------------------------------------------------
CLUSTER=${KUBERL_KIND_CLUSTER:-kuberl-e2e}
TIMEOUT=${KUBERL_KIND_TIMEOUT:-1200}
ARTIFACTS=${KUBERL_KIND_ARTIFACTS:-$REPO_ROOT/runs/kind-e2e/$(date -u +%Y%m%dT%H%M%SZ)}
TEST_NS=kuberl-e2e          # where the RLJob runs: the chart's watchNamespaces and trainer namespace
OPERATOR_NS=kuberl-system   # the kuberl chart's release namespace
KUBERAY_NS=ray-system       # KubeRay's operator
OUTSIDER_NS=kuberl-e2e-outsider   # another tenant's namespace: its pods must not reach the RLJob's Ray cluster
RELEASE=kuberl              # the chart names its objects after a release name containing "kuberl"
OPERATOR_IMAGE=kuberl/operator:dev
TRAINER_IMAGE=kuberl/trainer:dev   # also named in tiny-cpu.patch.yaml
EXAMPLE=examples/tiny-cpu.yaml
PATCH=e2e/kind/tiny-cpu.patch.yaml
DATA_CONFIGMAP=tiny-cpu-data       # also named in tiny-cpu.patch.yaml
CHECKPOINT_CLAIM=tiny-cpu-checkpoints  # also named in tiny-cpu.patch.yaml (storage.claimName)

keep=false
reuse=false
build=true
while (($#)); do
  case $1 in
    --keep) keep=true; shift ;;
    --reuse) reuse=true; shift ;;
    --skip-build) build=false; shift ;;
    --timeout) TIMEOUT=${2:?--timeout needs a value}; shift 2 ;;
    --artifacts) ARTIFACTS=${2:?--artifacts needs a value}; shift 2 ;;
    --name) CLUSTER=${2:?--name needs a value}; shift 2 ;;
    -h | --help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (try --help)" ;;
  esac
done
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds, got $TIMEOUT"

mkdir -p "$ARTIFACTS"
ARTIFACTS=$(cd "$ARTIFACTS" && pwd)   # absolute, before the cd below
cd "$REPO_ROOT"
# the cluster's admin credentials stay out of the artifacts (CI uploads those)
export KUBECONFIG=${KUBERL_KIND_KUBECONFIG:-$REPO_ROOT/runs/kind-e2e/$CLUSTER.kubeconfig}
export KUBECTL HELM DOCKER

need "$KUBECTL" "$HELM" "$DOCKER"
resolve_kind
export KIND

# --- exit: logs on failure, then the cluster goes unless --keep ------------------------------------------------
cluster_preexisted=false
cluster_touched=false   # set once this run starts creating or using the cluster
started=$SECONDS

finish() {
  local rc=$?
  trap - EXIT
  set +e
  if ((rc != 0)) && $cluster_touched && [[ -s $KUBECONFIG ]] && cluster_exists "$CLUSTER"; then
    log "FAILED (exit status $rc): collecting logs"
    bash "$KIND_DIR/collect-logs.sh" --out "$ARTIFACTS/logs" --cluster "$CLUSTER" \
      --namespace "$TEST_NS" --namespace "$OPERATOR_NS" --namespace "$KUBERAY_NS"
  fi
  if cluster_exists "$CLUSTER"; then
    if $keep || $cluster_preexisted; then
      log "kept kind cluster $CLUSTER: export KUBECONFIG=$KUBECONFIG"
      log "delete it with: $KIND delete cluster --name $CLUSTER"
    else
      log "deleting kind cluster $CLUSTER"
      "$KIND" delete cluster --name "$CLUSTER"
    fi
  fi
  if ((rc == 0)); then
    log "PASSED in $((SECONDS - started)) s; record in $ARTIFACTS"
  else
    log "FAILED in $((SECONDS - started)) s; artifacts in $ARTIFACTS"
  fi
  echo "exit status $rc after $((SECONDS - started)) s" >"$ARTIFACTS/result.txt"
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

k() { "$KUBECTL" --request-timeout=60s "$@"; }

# --- steps ----------------------------------------------------------------------------------------------------
build_images() {
  if ! $build; then
    "$DOCKER" image inspect "$OPERATOR_IMAGE" "$TRAINER_IMAGE" >/dev/null \
      || die "--skip-build: $OPERATOR_IMAGE and $TRAINER_IMAGE must exist in the local Docker"
    log "using the existing $OPERATOR_IMAGE and $TRAINER_IMAGE"
    return 0
  fi
  log "building $OPERATOR_IMAGE (log: $ARTIFACTS/build-operator.log)"
  "$DOCKER" build -f images/operator.Dockerfile -t "$OPERATOR_IMAGE" . 2>&1 | tee "$ARTIFACTS/build-operator.log"
  log "building $TRAINER_IMAGE (CUDA base + torch + vLLM: the long step; log: $ARTIFACTS/build-trainer.log)"
  "$DOCKER" build -f images/trainer.Dockerfile -t "$TRAINER_IMAGE" . 2>&1 | tee "$ARTIFACTS/build-trainer.log"
}

preflight() {
  "$DOCKER" info >/dev/null 2>&1 || die "cannot reach the Docker daemon ($DOCKER info failed)"
  if cluster_exists "$CLUSTER"; then
    cluster_preexisted=true   # never deleted by this run
    $reuse || die "kind cluster $CLUSTER already exists: pass --reuse, or delete it" \
      "($KIND delete cluster --name $CLUSTER)"
  fi
}

create_cluster() {
  cluster_touched=true
  bash "$KIND_DIR/create-cluster.sh" --name "$CLUSTER" --kubeconfig "$KUBECONFIG" --reuse
}

load_images() {
  log "loading $OPERATOR_IMAGE and $TRAINER_IMAGE into the kind node"
  "$KIND" load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$TRAINER_IMAGE"
}

install_kuberay() {
  log "installing KubeRay's operator, chart $KUBERAY_CHART_VERSION from $KUBERAY_HELM_REPO"
  "$HELM" upgrade --install kuberay-operator kuberay-operator --repo "$KUBERAY_HELM_REPO" \
    --version "$KUBERAY_CHART_VERSION" --namespace "$KUBERAY_NS" --create-namespace
  k wait --for=condition=Established crd/rayjobs.ray.io crd/rayclusters.ray.io --timeout=120s
  k -n "$KUBERAY_NS" wait --for=condition=Available deployment --all --timeout=300s
}

install_kuberl() {
  log "installing charts/kuberl (operator $OPERATOR_IMAGE, watching $TEST_NS)"
  k create namespace "$TEST_NS" --dry-run=client -o yaml | k apply -f -
  "$HELM" upgrade --install "$RELEASE" charts/kuberl --namespace "$OPERATOR_NS" --create-namespace \
    --set operator.image.repository="${OPERATOR_IMAGE%:*}" \
    --set operator.image.tag="${OPERATOR_IMAGE##*:}" \
    --set operator.image.pullPolicy=Never \
    --set "watchNamespaces={$TEST_NS}" \
    --set security.kuberayNamespace="$KUBERAY_NS"
  k wait --for=condition=Established crd/rljobs.kuberl.io --timeout=120s
  k -n "$OPERATOR_NS" wait --for=condition=Available deployment --all --timeout=300s
}

patched() {  # the example with the patch applied (offline: --local), in the output format given
  "$KUBECTL" patch --local -f "$EXAMPLE" --type merge --patch-file "$PATCH" "$@"
}

apply_job() {
  log "applying $EXAMPLE patched with $PATCH (as $ARTIFACTS/tiny-cpu.yaml)"
  k -n "$TEST_NS" create configmap "$DATA_CONFIGMAP" --from-file=examples/data/digits-train.parquet \
    --from-file=examples/data/digits-val.parquet --dry-run=client -o yaml \
    | k apply --server-side --force-conflicts -f -
  # kind's local-path provisioner offers ReadWriteOnce only; on its one node every Ray pod can mount it
  k -n "$TEST_NS" apply -f - <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $CHECKPOINT_CLAIM}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
YAML
  patched -o yaml >"$ARTIFACTS/tiny-cpu.yaml"
  JOB=$(patched -o jsonpath='{.metadata.name}')
  TOTAL=$(patched -o jsonpath='{.spec.trainer.totalSteps}')
  # a finished RLJob is never reopened: on a reused cluster start from a fresh one
  k -n "$TEST_NS" delete rljob "$JOB" --ignore-not-found --wait=true --timeout=120s
  wait_gone 180 "the previous RayJob $JOB" k -n "$TEST_NS" get rayjobs --field-selector "metadata.name=$JOB" -o name
  k -n "$TEST_NS" apply -f "$ARTIFACTS/tiny-cpu.yaml"
}

wait_for_success() {
  local deadline=$((SECONDS + TIMEOUT)) phase last="" progress
  log "waiting up to $TIMEOUT s for RLJob $TEST_NS/$JOB to be Succeeded"
  while true; do
    phase=$(k -n "$TEST_NS" get rljob "$JOB" -o jsonpath='{.status.phase}' 2>/dev/null) || phase=""
    progress=$(k -n "$TEST_NS" get rljob "$JOB" -o jsonpath='{.status.progress.step}/{.status.progress.totalSteps}' \
      2>/dev/null) || progress=""
    if [[ "$phase $progress" != "$last" ]]; then
      log "RLJob $JOB: phase ${phase:-<none yet>}, step ${progress:-/}"
      last="$phase $progress"
    fi
    case $phase in
      Succeeded) return 0 ;;
      Failed)
        log "RLJob $JOB failed: $(k -n "$TEST_NS" get rljob "$JOB" -o jsonpath='{.status.message}' 2>/dev/null)"
        return 1
        ;;
    esac
    if ((SECONDS >= deadline)); then
      log "timed out after $TIMEOUT s waiting for RLJob $JOB to be Succeeded (phase ${phase:-<none>})"
      return 1
    fi
    sleep 5
  done
}

lease_holder() { k -n "$OPERATOR_NS" get lease "$RELEASE-leader" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true; }

# refusal RC OUTPUT PATTERN: "refused" when a probe failed for the expected reason (PATTERN in its output, or no
# answer at all: 124), else what happened instead
refusal() {
  if (($1 == 124)) || { (($1 != 0)) && grep -qiE "$3" <<<"$2"; }; then
    echo refused
  else
    echo "exit status $1, not a refusal (output in $ARTIFACTS)"
  fi
}

# What only a real cluster shows about the two operator replicas: the Lease is held by one pod (POD_NAME), and
# after that pod is deleted without grace (as on a lost node) the other takes over while the RLJob runs; the job
# must still succeed with no restart (check_result).
failover_leader() {
  local leader holder deadline t0
  k -n "$OPERATOR_NS" wait --for=condition=Ready pod -l app.kubernetes.io/component=operator --timeout=120s
  leader=$(lease_holder)
  [[ -n $leader ]] || die "no operator replica holds the Lease $OPERATOR_NS/$RELEASE-leader"
  log "operator leader: $leader; deleting it without grace while RLJob $JOB runs"
  t0=$SECONDS
  k -n "$OPERATOR_NS" delete pod "$leader" --grace-period=0 --force --wait=false
  deadline=$((SECONDS + 60))
  until holder=$(lease_holder) && [[ -n $holder && $holder != "$leader" ]]; do
    ((SECONDS < deadline)) || die "no other replica took the Lease within 60 s (holder: ${holder:-none})"
    sleep 1
  done
  log "ok: $holder took the Lease $((SECONDS - t0)) s after $leader was deleted"
  printf 'leader failover: %s -> %s in %d s\n' "$leader" "$holder" $((SECONDS - t0)) >>"$ARTIFACTS/versions.txt"
}

# What only a real cluster shows about a suspend: KubeRay deletes the Ray cluster, and the kubelet runs the pods'
# preStop hooks and sends SIGTERM within their grace period; the head's hook stops the Ray job, so the driver saves
# a checkpoint at the step it was on (not at the last saveFreq step) before its pod goes. Resumed, the job continues
# from that step and ends Succeeded with no restart (check_result).
suspend_resume() {
  local step deadline checkpoint
  deadline=$((SECONDS + TIMEOUT))
  until step=$(jp rljob "$JOB" '{.status.progress.step}') && ((${step:-0} >= 2)); do
    ((SECONDS < deadline)) || die "RLJob $JOB did not reach step 2 within $TIMEOUT s"
    sleep 2
  done
  log "suspending RLJob $JOB at step $step (saveFreq $(patched -o jsonpath='{.spec.trainer.saveFreq}'))"
  k -n "$TEST_NS" patch rljob "$JOB" --type merge -p '{"spec":{"runPolicy":{"suspend":true}}}'
  wait_gone 300 "the Ray pods of the suspended $JOB" k -n "$TEST_NS" get pods -l "kuberl.io/rljob=$JOB" -o name
  expect "RLJob status.phase while suspended" "$(jp rljob "$JOB" '{.status.phase}')" Suspended
  step=$(jp rljob "$JOB" '{.status.progress.step}')
  checkpoint=$(jp rljob "$JOB" '{.status.progress.lastCheckpoint}')
  expect "checkpoint saved on suspend" "${checkpoint##*/}" "global_step_$step"
  printf 'suspended at step %s, checkpoint %s\n' "$step" "$checkpoint" >>"$ARTIFACTS/versions.txt"
  k -n "$TEST_NS" patch rljob "$JOB" --type merge -p '{"spec":{"runPolicy":{"suspend":false}}}'
}

# ray_probe NAMESPACE LABELS TOKEN RAY-ARGS...: run `ray RAY-ARGS` against the RLJob's dashboard from a throwaway pod
# of the trainer image in NAMESPACE with pod LABELS (may be empty), authenticated with TOKEN (may be empty); prints
# the output, returns the exit status (124: no answer within 45 s). The address comes from the RLJob's status.
ray_probe() {
  local namespace=$1 labels=$2 token=$3 address pod
  shift 3
  address=http://$(k -n "$TEST_NS" get rljob "$JOB" -o jsonpath='{.status.dashboardURL}')
  pod=ray-probe-$RANDOM
  local run=(run "$pod" -n "$namespace" --image="$TRAINER_IMAGE" --image-pull-policy=Never --restart=Never
    --rm -i --quiet --pod-running-timeout=120s --env=RAY_ADDRESS="$address")
  [[ -z $labels ]] || run+=(--labels="$labels")
  [[ -z $token ]] || run+=(--env=RAY_AUTH_MODE=token --env=RAY_AUTH_TOKEN="$token")
  k "${run[@]}" --command -- timeout 45 ray "$@" 2>&1
}

# What only a real cluster (a CNI that enforces NetworkPolicy: kindnet does) shows about the RLJob's Ray cluster:
# another namespace cannot reach it even holding the token (NetworkPolicy), a pod the policy admits cannot use it
# without the token (Ray's token authentication), and with both the same probe gets in (so the refusals are real).
check_isolation() {
  local head="" url="" cluster token out rc deadline=$((SECONDS + 300))
  log "waiting for the Ray head of $JOB and its dashboard URL in the RLJob's status"
  until [[ -n $head && -n $url ]]; do
    ((SECONDS < deadline)) || die "no Ray head pod or status.dashboardURL of $JOB after 300 s"
    sleep 3
    head=$(k -n "$TEST_NS" get pods -l "kuberl.io/rljob=$JOB,ray.io/node-type=head" -o name 2>/dev/null) || head=""
    url=$(jp rljob "$JOB" '{.status.dashboardURL}')
  done
  k -n "$TEST_NS" wait --for=condition=Ready "$head" --timeout=300s
  # KubeRay's token Secret (the RayJob's authOptions) is named after the Ray cluster
  cluster=$(jp rayjob "$JOB" '{.status.rayClusterName}')
  token=$(k -n "$TEST_NS" get secret "$cluster" -o jsonpath='{.data.auth_token}' | base64 -d)
  [[ -n $token ]] || die "KubeRay's token Secret $cluster of $JOB holds no auth_token"
  k create namespace "$OUTSIDER_NS" --dry-run=client -o yaml | k apply -f -
  until k -n "$OUTSIDER_NS" get serviceaccount default >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "namespace $OUTSIDER_NS got no default ServiceAccount"
    sleep 1
  done

  rc=0; out=$(ray_probe "$TEST_NS" "kuberl.io/rljob=$JOB" "$token" job list) || rc=$?
  printf '%s\n' "$out" >"$ARTIFACTS/ray-probe-allowed.txt"
  expect "ray job list from $JOB's pods with the token (exit status)" "$rc" 0

  rc=0; out=$(ray_probe "$TEST_NS" "kuberl.io/rljob=$JOB" "" job submit --no-wait -- echo pwned) || rc=$?
  printf '%s\n' "$out" >"$ARTIFACTS/ray-probe-no-token.txt"
  expect "ray job submit without the token" "$(refusal "$rc" "$out" 'unauthori[sz]ed|401|403|authenticat|token')" \
    refused

  rc=0; out=$(ray_probe "$OUTSIDER_NS" "" "$token" job submit --no-wait -- echo pwned) || rc=$?
  printf '%s\n' "$out" >"$ARTIFACTS/ray-probe-other-namespace.txt"
  expect "ray job submit from namespace $OUTSIDER_NS, token and all" \
    "$(refusal "$rc" "$out" 'connect|timed out|timeout')" refused
  k delete namespace "$OUTSIDER_NS" --wait=false
  ((failures == 0)) || die "$failures isolation check(s) failed"
}

failures=0
expect() {  # expect WHAT ACTUAL EXPECTED
  if [[ $2 == "$3" ]]; then
    log "ok: $1 = $2"
  else
    log "FAIL: $1 = '$2', expected '$3'"
    failures=$((failures + 1))
  fi
}
expect_set() {  # expect_set WHAT ACTUAL
  if [[ -n $2 ]]; then
    log "ok: $1 = $2"
  else
    log "FAIL: $1 is empty"
    failures=$((failures + 1))
  fi
}
jp() { k -n "$TEST_NS" get "$1" "$2" -o jsonpath="$3" 2>&1 || true; }

check_result() {
  k -n "$TEST_NS" get rljob "$JOB" -o yaml >"$ARTIFACTS/rljob.yaml"
  k -n "$TEST_NS" get rayjob "$JOB" -o yaml >"$ARTIFACTS/rayjob.yaml"
  expect "RLJob status.progress.step" "$(jp rljob "$JOB" '{.status.progress.step}')" "$TOTAL"
  expect "RLJob status.progress.totalSteps" "$(jp rljob "$JOB" '{.status.progress.totalSteps}')" "$TOTAL"
  expect_set "RLJob status.progress.rewardMean" "$(jp rljob "$JOB" '{.status.progress.rewardMean}')"
  expect_set "RLJob status.progress.lastCheckpoint" "$(jp rljob "$JOB" '{.status.progress.lastCheckpoint}')"
  expect "RLJob status.progress.percentComplete" "$(jp rljob "$JOB" '{.status.progress.percentComplete}')" 100
  expect "RLJob condition Succeeded" "$(jp rljob "$JOB" '{.status.conditions[?(@.type=="Succeeded")].status}')" True
  expect "RLJob condition Failed" "$(jp rljob "$JOB" '{.status.conditions[?(@.type=="Failed")].status}')" False
  local restarts
  restarts=$(jp rljob "$JOB" '{.status.restarts}')
  expect "RLJob status.restarts" "${restarts:-0}" 0
  expect "RayJob status.jobStatus" "$(jp rayjob "$JOB" '{.status.jobStatus}')" SUCCEEDED
  expect "RayJob status.jobDeploymentStatus" "$(jp rayjob "$JOB" '{.status.jobDeploymentStatus}')" Complete
  # the operator's /metrics through the API server's service proxy (the chart's <release>-metrics Service)
  local metrics series='kuberl_operator_rljobs{phase="Succeeded"}'
  metrics=$(k get --raw "/api/v1/namespaces/$OPERATOR_NS/services/$RELEASE-metrics:metrics/proxy/metrics" 2>&1) \
    || true
  printf '%s\n' "$metrics" >"$ARTIFACTS/operator-metrics.txt"
  expect "operator metric $series" \
    "$(printf '%s\n' "$metrics" | awk -v s="$series" '$1 == s {print ($2 >= 1) ? ">= 1" : $2}')" ">= 1"
  ((failures == 0)) || die "$failures check(s) failed"
}

# wait_gone SECONDS WHAT COMMAND...: until COMMAND succeeds and prints nothing (the objects are gone)
wait_gone() {
  local seconds=$1 what=$2 listed
  local deadline=$((SECONDS + seconds))
  shift 2
  until listed=$("$@" 2>/dev/null) && [[ -z $listed ]]; do
    ((SECONDS < deadline)) || die "$what still there after $seconds s: $listed"
    sleep 3
  done
  log "ok: $what gone"
}

check_cleanup() {
  log "deleting RLJob $JOB: the garbage collector removes its RayJob and ConfigMap, KubeRay its Ray cluster"
  k -n "$TEST_NS" delete rljob "$JOB" --wait=true --timeout=120s
  wait_gone 180 "RayJob $JOB" k -n "$TEST_NS" get rayjobs --field-selector "metadata.name=$JOB" -o name
  wait_gone 180 "ConfigMap $JOB-spec" \
    k -n "$TEST_NS" get configmaps --field-selector "metadata.name=$JOB-spec" -o name
  wait_gone 300 "the Ray pods of $JOB" k -n "$TEST_NS" get pods -l "kuberl.io/rljob=$JOB" -o name
}

step() {  # step NAME: run it and log its wall time
  local t0=$SECONDS
  "$@"
  log "step $1 done in $((SECONDS - t0)) s"
}

{
  echo "kind $KIND_VERSION, node image $KIND_NODE_IMAGE"
  echo "KubeRay chart $KUBERAY_CHART_VERSION ($KUBERAY_HELM_REPO)"
  commit=$(git -C "$REPO_ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
  git -C "$REPO_ROOT" diff --quiet HEAD 2>/dev/null || commit+=" (with local changes)"
  echo "commit $commit"
  "$KUBECTL" version --client 2>/dev/null | head -1
  "$HELM" version --short 2>/dev/null
  "$DOCKER" version --format 'docker {{.Server.Version}}' 2>/dev/null
} >"$ARTIFACTS/versions.txt" || true

step preflight
step build_images
step create_cluster
step load_images
step install_kuberay
step install_kuberl
step apply_job
step check_isolation
step failover_leader
step suspend_resume
step wait_for_success
step check_result
step check_cleanup
