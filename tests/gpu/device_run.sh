#!/usr/bin/env bash
# Stages of a GPU-machine session (docs/gpu.md), run from the repository root:
#   bash tests/gpu/device_run.sh install tests bench-sync      # first long call
#   bash tests/gpu/device_run.sh env bench-rollout grpo        # next call, machine still warm
# Stages: install (offline bundle staged in /root/stage + extra wheels in .device/x*/), env (only set up the
# environment), tests (tests/gpu, one process per module), bench-sync, bench-rollout, grpo (tests/gpu/*.yaml).
# Logs and JSON go to $OUT (the device tool brings back at most 8 files).
set -u
OUT=${OUT:-/tmp/kuberl-gpu-out}
mkdir -p "$OUT"
ROOT=$(pwd)
SITE=/root/site
export KUBERL_CACHE_DIR=/root/kuberl-cache
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

log() { echo "== $(date +%T) $*" | tee -a "$OUT/session.log"; }

install() {
  log "install: bundle"
  bash /root/stage/install.sh > "$OUT/install.log" 2>&1
  local rc=$?
  tail -5 "$OUT/install.log" | tee -a "$OUT/session.log"
  [ $rc -eq 0 ] || { log "install.sh failed: $rc"; return $rc; }
  # extra wheels: .device/x1 was staged into /root/extra-parts by an earlier call, .device/x2 travels with this one
  mkdir -p /root/extra /root/extra-parts
  cp .device/x*/* /root/extra-parts/ 2>/dev/null
  for part in /root/extra-parts/*.whl.part00; do
    [ -e "$part" ] || continue
    cat "${part%.part00}".part[0-9][0-9] > "/root/extra/$(basename "${part%.part00}")"
  done
  cp /root/extra-parts/*.whl /root/extra/ 2>/dev/null
  (cd /root/extra && sha256sum -c /root/extra-parts/EXTRA_SHA256SUMS) 2>&1 | tee -a "$OUT/session.log"
  ls -la /root/extra | tee -a "$OUT/session.log"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --upgrade /root/extra/*.whl \
    >> "$OUT/install.log" 2>&1 || { log "extra wheels failed"; return 1; }
  log "install: done"
}

quick_install() {
  # vLLM alone (no ray, no extra wheels) from chunks c2..c7 staged in /root/stage: enough for the tests and
  # benchmarks on random or tiny:// models when a machine must be staged again on little device time
  log "quick install: vllm without ray"
  (cd /root/stage && for part in *.whl.part00; do
     w=${part%.part00}; case $w in ray-*) continue ;; esac
     cat "$w".part[0-9][0-9] > "$w"
   done
   ls *.whl | grep -v -e '^ray-' -e '^llguidance-1.6.1' > /tmp/quick-wheels
   grep -F -f /tmp/quick-wheels SHA256SUMS | sha256sum -c --quiet) >> "$OUT/install.log" 2>&1 \
    || { log "quick install: sha256 check failed"; return 2; }
  (cd /root/stage && python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
     $(cat /tmp/quick-wheels)) >> "$OUT/install.log" 2>&1 || { log "quick install: pip failed"; return 1; }
  {
    echo "export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
    echo "export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1"
    echo 'if [ "${IN_PROCESS_ENGINE:-0}" = 1 ]; then export VLLM_ENABLE_V1_MULTIPROCESSING=0; fi'
  } > "$SITE/vllm_env.sh"
  log "quick install: done"
}

env_setup() {
  # shellcheck disable=SC1091
  IN_PROCESS_ENGINE=1 source "$SITE/vllm_env.sh"
  export PYTHONPATH="$ROOT/api:$ROOT/operator:$ROOT/trainer:$ROOT:$PYTHONPATH"
  export VLLM_ALLOW_INSECURE_SERIALIZATION=1
  python3 - <<'EOF' 2>&1 | tee -a "$OUT/session.log"
import time, torch
from importlib.metadata import version
print("gpu:", torch.cuda.get_device_name(0), "torch", torch.__version__, "vllm", version("vllm"), "ray", version("ray"))
t = time.perf_counter()
from kuberl.trainer.rollout.vllm import model_folder
print("smollm2 folder:", model_folder("smollm2"), f"({time.perf_counter() - t:.1f} s)")
EOF
}

run_tests() {
  for f in ${TEST_FILES:-tests/gpu/test_weight_buckets.py tests/gpu/test_vllm_rollout.py tests/gpu/test_fsdp_colocated.py}; do
    log "pytest $f"
    KUBERL_GPU_RESULTS="$OUT" timeout 300 python3 -m pytest -q -p no:cacheprovider -rA "$f" 2>&1 \
      | grep -v -e "^INFO" -e "^(EngineCore" -e "^WARNING" | tail -80 >> "$OUT/tests.log"
    log "pytest $f: exit ${PIPESTATUS[0]}"
    grep -E "passed|failed|error" "$OUT/tests.log" | tail -1 | tee -a "$OUT/session.log"
  done
}

bench_sync() {
  log "bench weight_sync"
  timeout 300 python3 bench/weight_sync.py --out "$OUT/weight_sync.json" --repeats 5 \
    --models ${WEIGHT_SYNC_MODELS:-smollm2 qwen2-0.5b} 2>&1 | grep -v -e "^INFO" -e "^WARNING" | tail -40 >> "$OUT/bench.log"
  log "bench weight_sync: exit ${PIPESTATUS[0]}"
}

bench_rollout() {
  log "bench rollout_vs_vllm"
  timeout 330 python3 bench/rollout_vs_vllm.py --out "$OUT/rollout_vs_vllm.json" --max-tokens 128 --repeats 3 2>&1 \
    | grep -v "^INFO\|^(EngineCore" | tail -40 >> "$OUT/bench.log"
  log "bench rollout_vs_vllm: exit ${PIPESTATUS[0]}"
}

grpo() {
  log "grpo: data"
  python3 -m kuberl.cli data gsm8k-synth --out /tmp/gsm8k-synth/train.parquet --n 2000 >> "$OUT/grpo.log" 2>&1
  python3 -m kuberl.cli data gsm8k-synth --out /tmp/gsm8k-synth/test.parquet --n 128 --seed 1 --split test \
    >> "$OUT/grpo.log" 2>&1
  # until workers.py reloads a level-2-sleeping engine before a rollout, patch this machine's copy (docs/gpu.md)
  if ! grep -q needs_weights trainer/kuberl/trainer/workers.py && [ -f .device/workers-vllm-v2.patch ]; then
    log "grpo: applying .device/workers-vllm-v2.patch to this machine's copy of workers.py"
    patch -p1 < .device/workers-vllm-v2.patch >> "$OUT/grpo.log" 2>&1
  fi
  log "grpo: run"
  timeout "${GRPO_TIMEOUT:-330}" python3 -m kuberl.cli run tests/gpu/smollm2-grpo-vllm.yaml \
    --run-dir /tmp/smollm2-grpo-vllm --no-progress >> "$OUT/grpo.log" 2>&1
  log "grpo: exit $?"
  cp /tmp/smollm2-grpo-vllm/metrics.jsonl "$OUT/grpo_metrics.jsonl" 2>/dev/null
  tail -25 "$OUT/grpo.log" | tee -a "$OUT/session.log"
}

for stage in "$@"; do
  case $stage in
    install) install || exit 1; env_setup ;;
    quick-install) quick_install || exit 1
                   # shellcheck disable=SC1091
                   IN_PROCESS_ENGINE=1 source "$SITE/vllm_env.sh"
                   export PYTHONPATH="$ROOT/api:$ROOT/operator:$ROOT/trainer:$ROOT:$PYTHONPATH"
                   export VLLM_ALLOW_INSECURE_SERIALIZATION=1 ;;
    env) env_setup ;;
    tests) run_tests ;;
    bench-sync) bench_sync ;;
    bench-rollout) bench_rollout ;;
    grpo) grpo ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
log "done"
tail -30 "$OUT/tests.log" 2>/dev/null
tail -25 "$OUT/bench.log" 2>/dev/null
