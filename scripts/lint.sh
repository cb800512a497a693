#!/usr/bin/env bash
# The project's static checks (scripts/test.sh and pre-commit run the same): ruff lint, ruff format,
# mypy over api/operator/sandbox/trainer, and the import-linter layer contracts. Every check runs; exit 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin

failed=()
run() {
  local name=$1
  shift
  echo "== $name"
  "$@" || failed+=("$name")
}
run "ruff check" "$bin/ruff" check .
run "ruff format" "$bin/ruff" format --check .
run "mypy" "$bin/mypy"
# kuberl is a namespace package spread over four folders; import-linter finds all of it only on sys.path.
run "import contracts" env PYTHONPATH=api:operator:sandbox:trainer "$bin/lint-imports"

if [ "${#failed[@]}" -gt 0 ]; then
  echo "lint failed: ${failed[*]}" >&2
  exit 1
fi
