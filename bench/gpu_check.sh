#!/usr/bin/env bash
# GPU check: run each GPU sample job (gpu_*.py) without doctor (its own median, for doctor's
# overhead), then bare-bottlenecked, --fixed, and with the profiler window off under
# `doctor run`, and the memory sample jobs with --device cuda (the allocator's side of the
# breakdown), and keep the run directories, their verdicts and NVML
# samples. Meant for a machine with a CUDA GPU:
#
#   OUT=/tmp/gpu-check bash bench/gpu_check.sh            # all jobs, ~8 minutes
#   OUT=/tmp/gpu-check bash bench/gpu_check.sh launch_bound
#
# Writes $OUT/<job>[-fixed|-nowindow]/ (run directories: gpu.npz and gpus.json are NVML's
# samples and what each GPU is), $OUT/<name>.verdict.json, the jobs' own timing lines in
# $OUT/<name>.log, nvidia-smi's view of the machine in $OUT/nvidia-smi.txt, and prints one
# summary line per run at the end (with what NVML saw of the job's GPU).
set -u
OUT="${OUT:-./gpu-check-out}"
SECONDS_PER_JOB="${SECONDS_PER_JOB:-20}"
# A job that hangs (or a doctor that does) is stopped after this long, and the next one runs
JOB_TIMEOUT="${JOB_TIMEOUT:-$((SECONDS_PER_JOB * 4 + 90))}"
PYTHON="${PYTHON:-python}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$HERE"
mkdir -p "$OUT"

if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch sees no CUDA device here; nothing to check" >&2
    exit 2
fi
nvidia-smi -q >"$OUT/nvidia-smi.txt" 2>&1 || true
DOCTOR=(doctor)
command -v doctor >/dev/null 2>&1 || DOCTOR=("$PYTHON" -m doctor.cli)

jobs=("$@")
[ ${#jobs[@]} -eq 0 ] && jobs=(pageable_copy fragmenting launch_bound conv_layout)

for job in "${jobs[@]}"; do
    for variant in "bare" "" "--fixed" "nowindow"; do
        case "$variant" in
            bare) name="$job-bare"
                  echo "== $name (no doctor: the job's own median, for doctor's overhead)" >&2
                  timeout -k 10 "$JOB_TIMEOUT" "$PYTHON" "sample_jobs/gpu_$job.py" \
                      --seconds "$SECONDS_PER_JOB" >"$OUT/$name.log" 2>&1
                  echo "   exit $?" >&2
                  continue ;;
            "") name="$job"; flags=(); window=() ;;
            --fixed) name="$job-fixed"; flags=(--fixed); window=() ;;
            nowindow) name="$job-nowindow"; flags=(); window=(--window off) ;;
        esac
        rm -rf "${OUT:?}/$name"
        echo "== $name" >&2
        timeout -k 10 "$JOB_TIMEOUT" "${DOCTOR[@]}" run "${window[@]}" --out "$OUT/$name" -- \
            "$PYTHON" "sample_jobs/gpu_$job.py" --seconds "$SECONDS_PER_JOB" "${flags[@]}" \
            >"$OUT/$name.log" 2>&1
        echo "   exit $?" >&2
        if [ -f "$OUT/$name/verdict.json" ]; then
            cp "$OUT/$name/verdict.json" "$OUT/$name.verdict.json"
        else
            echo "   no verdict.json (see $OUT/$name.log)" >&2
        fi
    done
done

# The memory jobs on the GPU (all jobs run, or none named): the allocator's side of the breakdown
if [ $# -eq 0 ]; then
    for mem in "activation_heavy" "optimizer_state_heavy" "memory_creep --steps 600"; do
        script="${mem%% *}"
        name="memory-$script"
        rm -rf "${OUT:?}/$name"
        echo "== $name" >&2
        # shellcheck disable=SC2086
        timeout -k 10 "$JOB_TIMEOUT" "${DOCTOR[@]}" run --out "$OUT/$name" -- "$PYTHON" "sample_jobs/$script.py" \
            ${mem#"$script"} --device cuda >"$OUT/$name.log" 2>&1
        echo "   exit $?" >&2
        [ -f "$OUT/$name/verdict.json" ] && cp "$OUT/$name/verdict.json" "$OUT/$name.verdict.json"
    done
fi

"$PYTHON" - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for path in sorted(out.glob("*.verdict.json")):
    v = json.loads(path.read_text())
    shares = ", ".join(f"{k} {x:.0%}" for k, x in v["shares"].items() if x >= 0.01)
    found = ", ".join(f"{f['id']} x{f.get('estimated_speedup') or 0:.2f}" for f in v["findings"])
    gpus = "; ".join(f"gpu{g['index']} busy {g.get('util', float('nan')):.0%} "
                     f"mem {g.get('memory_used_max_bytes', 0) / 2**30:.1f} GiB"
                     f"{' gpm' if 'gpm_sm_active' in g else ''}"
                     for g in v.get("gpus", []) if g.get("ranks"))
    print(f"{path.name.removesuffix('.verdict.json'):24s} {v['bottleneck']:13s} [{shares}] {found}"
          f" | {gpus or 'no GPU counters'}")


def median(log):
    """The job's own median step from its timing line (None: no such line)."""
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if line.startswith('{"median_step_s"'):
            return json.loads(line)["median_step_s"]
    return None


for bare_log in sorted(out.glob("*-bare.log")):
    job = bare_log.name.removesuffix("-bare.log")
    bare = median(bare_log)
    said = []
    for name in (job, f"{job}-nowindow"):
        m = median(out / f"{name}.log")
        if bare and m:
            said.append(f"{name} {m / bare:.3f}x")
    print(f"{job:24s} the job's median under doctor / bare ({bare}): {', '.join(said)}")
PY
