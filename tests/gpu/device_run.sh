#!/usr/bin/env bash
# Stages of a GPU-machine session (docs/gpu.md), run from the repository root:
#   bash tests/gpu/device_run.sh install install-verl bench-verl  # first long call, after the staging calls
#   bash tests/gpu/device_run.sh env bench-trl                      # next call, machine still warm
# Stages: install (offline bundle staged in /root/stage, kuberl's and TRL's extra wheels in /root/extra and
# /root/extra-parts: tests/gpu/stage.sh, docs/gpu.md), install-verl (verl's site from the wheels staged in
# /root/verl-stage, checked against its SHA256SUMS, into /root/verl-site; VERL_TF59=1 also puts verl's pinned
# transformers from /root/verl-tf59 before it), env (only set up the environment), lite (no bundle: the carried
# .device/lite wheels, for bench-mfu and the tests not marked vllm), tests (tests/gpu, one process per module or
# TEST_FILES' node ids, TEST_TIMEOUT s each), bench-sync, bench-rollout, bench-mfu (MFU_ARGS), bench-trl (TRL_ARGS),
# verl-check (compose and validate verl's configuration of the rows, seconds), bench-verl (VERL_ARGS), grpo
# (GRPO_SPECS, tests/gpu/*.yaml), agent (tests/gpu/smollm2-agent-vllm.yaml), plan (bench/plan_accuracy.py on the
# kuberl side of the last bench-trl, whose TRL_ARGS must include --work-dir "$BENCH_DIR"). The 1.1B benchmark:
# TRL_ARGS="--model shape:llama-1.1b --work-dir /tmp/bench-1b ..." (the script writes the random-weight model).
# tests/gpu/stage.sh prepares the staged files and makes the staging calls (calls: each call's carry list).
# Logs and JSON go to $OUT (the device tool brings back at most 8 files); the benchmarks' JSON also stays in
# /root/results, where a later call's --merge-with (TRL_ARGS, VERL_ARGS) finds it: TRL_NAME and VERL_NAME name them.
# TRL_TIMEOUT and VERL_TIMEOUT bound a whole benchmark: give them the sides' --timeout plus a minute each (building a
# model comes first); at the limit the benchmark writes the side it was running with the steps it recorded.
set -u
OUT=${OUT:-/tmp/kuberl-gpu-out}
mkdir -p "$OUT"
ROOT=$(pwd)
SITE=/root/site
TRL_SITE=/root/trl-site  # TRL for bench-trl only (install)
RESULTS=/root/results  # benchmark JSON kept on the machine between calls (--merge-with), copied to $OUT
mkdir -p "$RESULTS"
export KUBERL_CACHE_DIR=/root/kuberl-cache
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

log() { echo "== $(date +%T) $*" | tee -a "$OUT/session.log"; }

install() {
  log "install: bundle"
  bash /root/stage/install.sh > "$OUT/install.log" 2>&1
  local rc=$?
  tail -5 "$OUT/install.log" | tee -a "$OUT/session.log"
  [ $rc -eq 0 ] || { log "install.sh failed: $rc"; return $rc; }
  # extra wheels (docs/gpu.md): put in /root/extra by the staging calls (tests/gpu/stage.sh), the split ones
  # (NAME.whl.partNN) in /root/extra-parts, joined here; all checked against EXTRA_SHA256SUMS
  mkdir -p /root/extra
  for part in /root/extra-parts/*.whl.part00; do
    [ -e "$part" ] || continue
    cat "${part%.part00}".part[0-9][0-9] > "/root/extra/$(basename "${part%.part00}")"
  done
  (cd /root/extra && sha256sum -c EXTRA_SHA256SUMS) 2>&1 | tee -a "$OUT/session.log" \
    | grep -q -e FAILED -e "No such file" && { log "extra wheels: sha256 mismatch or missing"; return 2; }
  # TRL and its datasets go to a site of their own, on the PYTHONPATH of bench-trl only: verl imports trl's value-head
  # model whenever trl is importable (verl/models/transformers/monkey_patch.py) and fails on TRL 1.16
  local trl_wheels=(/root/extra/trl-*.whl /root/extra/datasets-*.whl /root/extra/multiprocess-*.whl) wheel others=()
  for wheel in /root/extra/*.whl; do
    [[ " ${trl_wheels[*]} " == *" $wheel "* ]] || others+=("$wheel")
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --upgrade "${others[@]}" \
    >> "$OUT/install.log" 2>&1 || { log "extra wheels failed"; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$TRL_SITE" --upgrade "${trl_wheels[@]}" \
    >> "$OUT/install.log" 2>&1 || { log "TRL wheels failed"; return 1; }
  log "install: done"
}

install_verl() {
  # verl 0.9.1 and what it imports that the image and the bundle lack, in a site of its own (bench/grpo_vs_verl.py
  # puts it before /root/site on verl's PYTHONPATH, never on kuberl's)
  log "install-verl"
  (cd /root/verl-stage && sha256sum -c SHA256SUMS) 2>&1 | tee -a "$OUT/session.log" \
    | grep -q -e FAILED -e "No such file" && { log "verl wheels: sha256 mismatch or missing"; return 2; }
  # verl's dataset reads parquet through Hugging Face datasets: the copy staged with TRL's wheels (install)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /root/verl-site /root/verl-stage/*.whl \
    /root/extra/datasets-*.whl /root/extra/multiprocess-*.whl \
    >> "$OUT/install.log" 2>&1 || { log "verl wheels failed"; return 1; }
  VERL_SITE=/root/verl-site
  if [ "${VERL_TF59:-0}" = 1 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /root/verl-tf59-site /root/verl-tf59/*.whl \
      >> "$OUT/install.log" 2>&1 || { log "verl's transformers failed"; return 1; }
    VERL_SITE=/root/verl-tf59-site:/root/verl-site
  fi
  export VERL_SITE VLLM_SITE=$SITE
  env -u VLLM_ENABLE_V1_MULTIPROCESSING PYTHONPATH="$VERL_SITE:$SITE" python3 -c "
import importlib.metadata as m, transformers, vllm, verl.trainer.main_ppo, verl.workers.engine_workers, transfer_queue
import verl.workers.rollout.vllm_rollout.vllm_async_server, verl.workers.engine.fsdp.transformer_impl
print('verl', m.version('verl'), 'vllm', vllm.__version__, 'transformers', transformers.__version__,
      'tensordict', m.version('tensordict'), 'imports OK')" 2>&1 | tail -3 | tee -a "$OUT/session.log"
  log "install-verl: exit ${PIPESTATUS[0]}"
}

env_setup() {
  # shellcheck disable=SC1091
  IN_PROCESS_ENGINE=1 source "$SITE/vllm_env.sh"
  export PYTHONPATH="$ROOT/api:$ROOT/operator:$ROOT/sandbox:$ROOT/trainer:$ROOT:$PYTHONPATH"
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

lite() {
  # one transfer, no bundle: kuberl's pure-Python dependencies that the image lacks (docs/gpu.md), for the stages that
  # need neither vLLM nor Ray
  log "lite: trainer wheels"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /root/site-lite .device/lite/*.whl \
    >> "$OUT/install.log" 2>&1 || { log "lite wheels failed"; return 1; }
  export PYTHONPATH="$ROOT/api:$ROOT/operator:$ROOT/sandbox:$ROOT/trainer:$ROOT:/root/site-lite"
  python3 -c "import torch, transformers, kuberl.trainer.workers.actor; print('gpu:', torch.cuda.get_device_name(0), \
'torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -1 | tee -a "$OUT/session.log"
}

run_tests() {
  for f in ${TEST_FILES:-tests/gpu/test_weight_buckets.py tests/gpu/test_vllm_rollout.py tests/gpu/test_fsdp_colocated.py}; do
    log "pytest $f"
    KUBERL_GPU_RESULTS="$OUT" timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -rA "$f" 2>&1 \
      | grep -v -e "^INFO" -e "^(EngineCore" -e "^WARNING" | tail -80 >> "$OUT/tests.log"
    log "pytest $f: exit ${PIPESTATUS[0]}"
    grep -E "passed|failed|error" "$OUT/tests.log" | tail -1 | tee -a "$OUT/session.log"
  done
}

bench_sync() {
  log "bench weight_sync"
  # shellcheck disable=SC2086  # WEIGHT_SYNC_MODELS is a list of models
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

bench_mfu() {
  log "bench actor_mfu"
  # shellcheck disable=SC2086
  timeout 300 python3 bench/actor_mfu.py --out "$OUT/actor_mfu.json" --trainer-mfu "${TRAINER_MFU:-0.04}" ${MFU_ARGS:-} 2>&1 \
    | grep -v -e "^INFO" -e "^WARNING" -e "^{" -e "FutureWarning" -e "warnings.warn" | tail -40 >> "$OUT/bench.log"
  log "bench actor_mfu: exit ${PIPESTATUS[0]}"
}

grpo() {
  # GRPO_SPECS: RLJob files to run one after the other (default tests/gpu/smollm2-grpo-vllm.yaml); their data
  # comes from `kuberl data gsm8k-synth` with GRPO_DATA_ARGS (e.g. "--max-operand 10 --steps 1 1")
  log "grpo: data"
  # shellcheck disable=SC2086
  python3 -m kuberl.cli data gsm8k-synth --output-file /tmp/gsm8k-synth/train.parquet --n 2000 ${GRPO_DATA_ARGS:-} \
    >> "$OUT/grpo.log" 2>&1
  # shellcheck disable=SC2086
  python3 -m kuberl.cli data gsm8k-synth --output-file /tmp/gsm8k-synth/test.parquet --n 128 --seed 1 --split test \
    ${GRPO_DATA_ARGS:-} >> "$OUT/grpo.log" 2>&1
  for spec in ${GRPO_SPECS:-tests/gpu/smollm2-grpo-vllm.yaml}; do
    local name
    name=$(basename "$spec" .yaml)
    log "grpo: run $spec"
    timeout "${GRPO_TIMEOUT:-330}" python3 -m kuberl.cli run "$spec" --run-dir "/tmp/$name" --no-progress \
      >> "$OUT/grpo.log" 2>&1
    log "grpo: $spec exit $?"
    cp "/tmp/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
    grep -e "^step" -e "rollout:" "$OUT/grpo.log" | tail -4 | tee -a "$OUT/session.log"
  done
}

agent() {
  log "agent: data"
  for split in train test; do
    python3 -m kuberl.cli data arithmetic --output-file "/tmp/arithmetic/$split.parquet" --seed 0 --split "$split" \
      --n "$([ "$split" = train ] && echo 2048 || echo 64)" >> "$OUT/agent.log" 2>&1
  done
  log "agent: run tests/gpu/smollm2-agent-vllm.yaml"
  timeout "${AGENT_TIMEOUT:-400}" python3 -m kuberl.cli run tests/gpu/smollm2-agent-vllm.yaml \
    --run-dir /tmp/smollm2-agent-vllm --no-progress >> "$OUT/agent.log" 2>&1
  log "agent: exit $?"
  cp /tmp/smollm2-agent-vllm/metrics.jsonl "$OUT/smollm2-agent-vllm.metrics.jsonl" 2>/dev/null
  grep -e "^step" "$OUT/agent.log" | tail -3 | tee -a "$OUT/session.log"
}

plan_accuracy() {
  log "plan accuracy ${PLAN_TAG:-smollm2}"
  python3 bench/plan_accuracy.py --spec "$BENCH_DIR/kuberl-rljob.yaml" --metrics "$BENCH_DIR/kuberl-run/metrics.jsonl" \
    --gpu H200 --out "$OUT/plan_accuracy_${PLAN_TAG:-smollm2}.json" 2>&1 | tail -3 | tee -a "$OUT/session.log"
}

bench_trl() {
  log "bench grpo_vs_trl"
  # shellcheck disable=SC2086
  PYTHONPATH="$TRL_SITE:$PYTHONPATH" timeout "${TRL_TIMEOUT:-590}" python3 bench/grpo_vs_trl.py --out "$RESULTS/${TRL_NAME:-grpo_vs_trl}.json" \
    ${TRL_ARGS:-} 2>&1 | grep -v -e "^INFO" -e "^(EngineCore" -e "^WARNING" | tail -40 >> "$OUT/bench.log"
  log "bench grpo_vs_trl: exit ${PIPESTATUS[0]}"
  cp "$RESULTS"/*.json "$OUT/" 2>/dev/null
  grep -e "tokens/s" "$OUT/bench.log" | tail -8 | tee -a "$OUT/session.log"
}

verl_check() {
  log "verl-check"
  # shellcheck disable=SC2086
  timeout 300 python3 bench/grpo_vs_verl.py ${VERL_ARGS:-} --verl-check-only --overlap both \
    --out "$OUT/verl_check.json" 2>&1 | grep -v -e "^INFO" -e "^WARNING" | tail -12 | tee -a "$OUT/session.log"
}

bench_verl() {
  log "bench grpo_vs_verl"
  # shellcheck disable=SC2086
  timeout "${VERL_TIMEOUT:-590}" python3 bench/grpo_vs_verl.py --out "$RESULTS/${VERL_NAME:-grpo_vs_verl}.json" \
    ${VERL_ARGS:-} 2>&1 | grep -v -e "^INFO" -e "^(EngineCore" -e "^WARNING" -e "^(WorkerDict" | tail -40 \
    >> "$OUT/bench.log"
  log "bench grpo_vs_verl: exit ${PIPESTATUS[0]}"
  cp "$RESULTS"/*.json "$OUT/" 2>/dev/null
  grep -e "tokens/s" -e "seconds per step" "$OUT/bench.log" | tail -8 | tee -a "$OUT/session.log"
}

clear_card() {
  # a call the device tool stopped at its time limit leaves its processes behind (a benchmark side and its Ray
  # workers: 2026-12-07, a verl run's two held 33 GiB when the next call's kuberl side began); every call starts on an
  # idle card, and the benchmarks refuse a side on a busy one (bench/grpo_bench.py busy_card)
  local pids
  pids=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ' | tr '\n' ' ')
  pkill -9 -f -e 'raylet|gcs_server|ray::|ray/dashboard' >> "$OUT/session.log" 2>&1
  [ -n "${pids// /}" ] || return 0
  log "clear the card of an earlier call's processes: $pids"
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null
  sleep 3
  nvidia-smi --query-gpu=memory.used --format=csv,noheader | tee -a "$OUT/session.log"
}

clear_card
for stage in "$@"; do
  case $stage in
    install) install || exit 1; env_setup ;;
    install-verl) install_verl || exit 1 ;;
    verl-check) verl_check ;;
    bench-verl) bench_verl ;;
    env) env_setup ;;
    lite) lite || exit 1 ;;
    tests) run_tests ;;
    bench-sync) bench_sync ;;
    bench-rollout) bench_rollout ;;
    bench-mfu) bench_mfu ;;
    bench-trl) bench_trl ;;
    grpo) grpo ;;
    agent) agent ;;
    plan) plan_accuracy ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
log "done"
tail -30 "$OUT/tests.log" 2>/dev/null
tail -25 "$OUT/bench.log" 2>/dev/null
