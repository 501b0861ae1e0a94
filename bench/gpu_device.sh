#!/usr/bin/env bash
# bench/gpu_check.sh on a lent GPU machine that has torch but not doctor and cannot reach a
# package index: installs doctor and the wheels carried in .whl/ (py-spy, msgspec, isal, fetched
# here for the machine's Python; see below) into /tmp/site, runs the GPU check and one CPU job
# beside an idle GPU, and packs every run directory into $OUT/gpu.tgz.* (15 MB parts).
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
#       -d .whl py-spy msgspec isal
#   pip install --no-deps --target .whl/tree .     # the fallback where the build fails there
#
# Then, on the device: bash bench/gpu_device.sh [JOB...]   (the jobs as bench/gpu_check.sh takes
# them, default all). Settings: SECONDS_PER_JOB, default 8; BUDGET_S, the seconds all of it may
# take, default 440 (the GPU check gets all but the last 80 s, which the CPU job, the drift and
# the mixed precision jobs take); OVERHEAD_PAIRS=N adds bench/overhead.py's alternating pairs on
# OVERHEAD_JOBS (default gpu_pageable_copy) with OVERHEAD_WINDOW (default off), OVERHEAD_S at most.
# Seen on an H100 (2026-12-05): all four jobs' sixteen runs at 8 s each took about 300 s (about
# 11 s a run beside the job's own), the memory jobs about 20 s each, the rest 65 s; the machine's
# start and the install about 90 s more, out of a session's 900.
set -u
export PYTHONUNBUFFERED=1
OUT="${OUT:?set OUT}"
WORK=/tmp/gpu-check
BUDGET_S="${BUDGET_S:-440}"
mkdir -p "$WORK"
export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"
# one pip for all (a second --target --upgrade would replace the first one's bin/)
if ! python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
        --no-cache-dir --target /tmp/site .whl/*.whl . >"$WORK/install.log" 2>&1; then
    echo "gpu_device: building doctor here failed (see install.log); the prebuilt tree instead"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
    cp -r .whl/tree/. /tmp/site/
fi
# the command, whichever way doctor came (run from the repo, python3 -m would find the sources)
if [ ! -x /tmp/site/bin/doctor ]; then
    printf '#!/usr/bin/env python3\nfrom doctor.cli import main\nmain()\n' >/tmp/site/bin/doctor
    chmod +x /tmp/site/bin/doctor
fi
REPO="$PWD"
cd /tmp || exit 3
python3 - <<'PY' 2>&1 | tee "$WORK/versions.txt"
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
for name in ("doctor.trace._scan", "doctor.trace._nest", "msgspec", "isal", "pynvml"):
    try:
        importlib.import_module(name)
        print(name, "ok")
    except Exception as exc:  # noqa: BLE001 - a report, not a fix
        print(name, "missing:", exc)
PY
py-spy --version 2>&1 | tee -a "$WORK/versions.txt"
start=$SECONDS
cd "$REPO" || exit 3
OUT="$WORK" PYTHON=python3 SECONDS_PER_JOB="${SECONDS_PER_JOB:-8}" timeout -k 10 "$((BUDGET_S - 80))" \
    bash bench/gpu_check.sh "$@" >"$WORK/summary.txt" 2>&1
echo "gpu_check: exit $? after $((SECONDS - start)) s"
# A CPU job beside an idle GPU: gpu.unused should name it
if [ $((SECONDS - start)) -lt $((BUDGET_S - 30)) ]; then
    timeout -k 5 60 doctor run --out "$WORK/cpu-beside-gpu" -- python3 sample_jobs/compute_bound.py \
        --steps 40 >"$WORK/cpu-beside-gpu.log" 2>&1
    echo "cpu-beside-gpu: exit $?"
fi
# A GPU job whose input slows down: a later CUDA window opens, CUPTI started again after the
# first window's teardown (asked on CUDA 12.6+); its trace, periods and cost are printed
if [ $((SECONDS - start)) -lt $((BUDGET_S - 45)) ]; then
    DOCTOR_REWINDOW=gap=0,budget=0.5,sustain_min=32,sustain_fraction=0 timeout -k 5 90 \
        doctor run --out "$WORK/drift-cuda" -- python3 sample_jobs/drift.py --device cuda \
        --seconds 15 --slow-after 10 --read-ms 1.5 >"$WORK/drift-cuda.log" 2>&1
    echo "drift-cuda: exit $?"
    python3 - "$WORK/drift-cuda" <<'PY'
import glob, json, sys
for meta in glob.glob(sys.argv[1] + "/rank-0/main-*/meta.json"):
    m = json.load(open(meta))
    print("first window", {k: m.get("window", {}).get(k) for k in ("cuda", "cupti_teardown")})
    for w in m.get("later_windows", []):
        print("later window", {k: w.get(k) for k in ("window", "state", "cuda", "start_step",
                                                      "cost_s", "reason")})
    print("later windows off:", m.get("later_windows_off"))
v = json.load(open(sys.argv[1] + "/verdict.json"))
for p in v.get("periods", []):
    print("period", p["first_step"], p["last_step"], p["bottleneck"], p["bottleneck_share"])
PY
    tail -c 600 "$WORK/drift-cuda.log"
fi
# Mixed precision on the GPU: a GradScaler's skipped iterations and the overflow watch, whose
# flags are read late behind CUDA events (met only a fake CUDA before): the finding should name
# the layer the job prints as overflow_layer, for a gradient and for a forward output
for how in grad output; do
    [ $((SECONDS - start)) -lt $((BUDGET_S - 20)) ] || break
    timeout -k 5 60 doctor run --out "$WORK/amp-$how" -- python3 sample_jobs/amp_skips.py \
        --device cuda --steps 300 --layers 3 --overflow-at 1 --overflow "$how" \
        >"$WORK/amp-$how.log" 2>&1
    echo "amp-$how: exit $?"
    grep -o '"overflow_layer": "[a-z0-9]*"' "$WORK/amp-$how.log"
    python3 - "$WORK/amp-$how" <<'PY'
import json, sys
v = json.load(open(sys.argv[1] + "/verdict.json"))
print("steps", {k: v.get("steps", {}).get(k) for k in ("count", "skipped", "micro_batches")})
for f in v["findings"]:
    if f["id"].startswith(("steps.skipped", "precision", "loss")):
        print(f["id"], "|", f["title"])
PY
done
cat "$WORK/summary.txt"
# doctor's cost on the GPU jobs, bare and under doctor in alternating pairs (OVERHEAD_PAIRS, off
# by default): the single runs above are no measure of it (on the H100 the same bare job's median
# moved 1.24x from one run to the next: gpu_launch_bound 15.4 and 19.2 ms)
if [ "${OVERHEAD_PAIRS:-0}" -gt 0 ]; then
    timeout -k 10 "${OVERHEAD_S:-300}" python3 bench/overhead.py --jobs "${OVERHEAD_JOBS:-gpu_pageable_copy}" \
        --pairs "$OVERHEAD_PAIRS" --steps 400 --window "${OVERHEAD_WINDOW:-off}" --no-micro \
        --job-args "--seconds 60" 2>&1 | tee "$WORK/overhead.txt"
fi
tar czf - -C /tmp gpu-check | split -b 15M - "$OUT/gpu.tgz."
ls -la "$OUT"
