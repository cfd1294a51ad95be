#!/usr/bin/env bash
# A mutation run (mutmut) over alloc_plan, sched_split, transfer and quants, with the
# tests that guard them ([tool.mutmut] in pyproject.toml). Not part of CI: every mutant
# re-runs those tests, hours on two cores. Narrow it with ONLY, e.g.
#   ONLY=transfer scripts/mutation-run.sh
# then read the survivors with `.venv/bin/mutmut results` (and `mutmut show NAME`).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
"$py" -m pip install -q "mutmut>=3.8"
ln -sfn core src            # mutmut resolves modules only under src/
trap 'rm -f src' EXIT
rm -rf mutants
if [ -n "${ONLY:-}" ]; then
  "$py" - "$ONLY" <<'PY'
import re, sys
p = "pyproject.toml"
s = open(p).read()
s = re.sub(r"only_mutate = \[[^\]]*\]", f'only_mutate = ["src/tensorplug/{sys.argv[1]}.py"]', s, count=1)
open("mutants.pyproject.toml", "w").write(s)
PY
  cp pyproject.toml pyproject.toml.orig && mv mutants.pyproject.toml pyproject.toml
  trap 'rm -f src; mv pyproject.toml.orig pyproject.toml' EXIT
fi
"$(dirname "$py")/mutmut" run || true
"$(dirname "$py")/mutmut" results
