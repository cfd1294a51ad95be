#!/usr/bin/env bash
# A mutation run (mutmut) over alloc_plan, sched_split, transfer and quants, with the
# tests that guard them ([tool.mutmut] in pyproject.toml). Not part of CI: every mutant
# re-runs those tests, hours on two cores. Narrow it to one module with ONLY, e.g.
#   ONLY=transfer scripts/mutation-run.sh
# Survivors are listed at the end; `.venv/bin/mutmut show NAME` prints one's diff.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
"$py" -m pip install -q "mutmut>=3.8"
ln -sfn core src            # mutmut resolves module names only under src/
trap 'rm -f src' EXIT
rm -rf mutants
mutmut="$(dirname "$py")/mutmut"
"$mutmut" run ${ONLY:+"tensorplug.${ONLY}*"} || true
"$mutmut" results | grep -v "not checked" || true
