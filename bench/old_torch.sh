#!/usr/bin/env bash
# doctor beside the oldest torch it claims (2.1): a fresh virtual environment with torch 2.1.2
# (the registry's build: about 4.7 GB with its CUDA libraries, downloaded once into $VENV), then
# doctor installed as the README says for a torch older than 2.3 (with "numpy<2"), then one
# sample job under doctor run. Prints the versions pip chose, what pip would have chosen without
# "numpy<2", and the verdict's bottleneck.
#
#     bash bench/old_torch.sh            # VENV=/tmp/venv-torch21 by default
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-/tmp/venv-torch21}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "torch==2.1.2" "numpy<2"
echo "without \"numpy<2\", pip would install:"
"$venv/bin/pip" install -q --dry-run --ignore-installed --report - "$root" 2>/dev/null \
  | "$venv/bin/python" -c 'import json, sys
chosen = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.load(sys.stdin)["install"]}
print("  numpy", chosen.get("numpy"), "pandas", chosen.get("pandas"))'
"$venv/bin/pip" install -q "$root" "numpy<2"
"$venv/bin/python" -c 'import numpy, pandas, torch
print(f"installed: torch {torch.__version__}, numpy {numpy.__version__}, pandas {pandas.__version__}")'
out=$(mktemp -d)
cd "$out"
"$venv/bin/doctor" run --quiet --out run "$root/sample_jobs/compute_bound.py" >/dev/null 2>&1
"$venv/bin/python" -c 'import json; v = json.load(open("run/verdict.json"))
print("doctor run under torch 2.1: bottleneck", v["bottleneck"], "steps", v["steps"]["count"])'
rm -rf "$out"
