#!/usr/bin/env bash
# The TRL adapter (credo.integrations.trl) on each TRL version of its tested range: tests/test_trl.py (its
# GRPO advantages equal to TRL's own, two training steps, the Probe's prompts as TRL renders them, ...) once per
# version, each with that version alone installed into a throwaway directory put first on PYTHONPATH (pip
# --no-deps --target: every other package, torch/transformers/accelerate included, is the base environment's,
# never upgraded). The fast suite tests the pinned version only; this is the CI matrix job, run by hand or CI.
#
#   .ci/trl_matrix.sh                 every version in credo.integrations.trl_versions.TESTED_TRL
#   .ci/trl_matrix.sh 1.17.0          another version (e.g. before adding it to TESTED_TRL)
#   PYTHON=/path/to/python .ci/trl_matrix.sh   the base environment (default: .venv/bin/python, `make test`'s)
#
# Prints one line per version (trl version, pytest's result) and exits non-zero if any version failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PYTHON=${PYTHON:-.venv/bin/python}
if [ "$#" -gt 0 ]; then
  versions=("$@")
else  # read from the adapter's source: importing it would import (and check) the base environment's trl
  read -r -a versions <<< "$("$PYTHON" - <<'PY'
import ast
tree = ast.parse(open("src/credo/integrations/trl_versions.py").read())
for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TESTED_TRL":
        print(" ".join(ast.literal_eval(node.value)))
PY
)"
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/credo-trl-matrix.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
results=()
failed=0
for version in "${versions[@]}"; do
  target="$work/trl-$version"
  echo "== trl $version" >&2
  if ! "$PYTHON" -m pip install -q --disable-pip-version-check --no-deps --target "$target" "trl==$version" >&2; then
    results+=("trl $version: could not be installed"); failed=1; continue
  fi
  export PYTHONPATH="$target:$PWD/src"
  found=$("$PYTHON" -c "import trl; print(trl.__version__)" 2>/dev/null)
  if [ "$found" != "$version" ]; then
    results+=("trl $version: the throwaway install did not shadow the base's trl (imported $found)"); failed=1; continue
  fi
  log="$work/pytest-$version.log"
  "$PYTHON" -m pytest -q -p no:cacheprovider -rfEp tests/test_trl.py >"$log" 2>&1
  code=$?
  grep -E '^(PASSED|FAILED|ERROR) ' "$log" >&2
  equal=no
  grep -q '^PASSED tests/test_trl.py::test_grpo_credit_equals_trls_own_advantages' "$log" && equal=yes
  results+=("trl $version: $(grep -E '(passed|failed|error)' "$log" | tail -n 1); grpo advantages equal TRL's own: $equal")
  [ "$code" -eq 0 ] || failed=1
done
unset PYTHONPATH
printf '%s\n' "${results[@]}"
exit "$failed"
