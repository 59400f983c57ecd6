#!/usr/bin/env bash
# The accelerator measurement on one NVIDIA H100 or H200, in one call that
# installs nothing: accelerator.py three times (the Qwen2.5-0.5B shape, and
# the Qwen2.5-7B decode and 7B-width train step), then a profile of a few
# decode steps of each model (decode_profile.py). Everything lands under
# $OUT (default ./accelerator_out): the card, each run's log and JSON line,
# each profile's summary, and summary.json gathering them.
#
#   OUT=/some/dir bash benchmarks/accelerator_gpu.sh [--small]
#
# RUNS (3) and BUDGET_S (540: seconds for everything) may be set.
#
# --small runs every command at CPU stand-in sizes (a check of the script
# itself, on any machine). Each command has its own time limit and a
# failure is recorded, not fatal, so one case cannot cost the rest.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$PWD/accelerator_out}"
mkdir -p "$OUT"
: > "$OUT/rc.txt"

SMALL=()
RUNS="${RUNS:-3}"
PROFILE_ROWS=64 PROFILE_CONTEXT=512 PROFILE_STEPS=16
if [[ "${1:-}" == "--small" ]]; then
  SMALL=(--small)
  PROFILE_ROWS=4 PROFILE_CONTEXT=64 PROFILE_STEPS=8
elif [[ $# -gt 0 ]]; then
  echo "error: unknown argument $1 (only --small)" >&2
  exit 2
fi

# JAX takes 75% of the GPU's memory by default; the 7B cases want more.
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
# Runs 2 and 3 load the programs run 1 compiled instead of compiling.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cc}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1

(nvidia-smi -L || echo "no nvidia-smi") > "$OUT/card.txt" 2>&1
python -c "import jax; d = jax.devices()[0]; print(jax.__version__,
d.platform, d.device_kind)" >> "$OUT/card.txt" 2>&1

# The whole script fits one device call (10 min): each command's limit is
# cut to what is left of BUDGET_S, and a command with under 30 s left is
# skipped (and recorded). Run 1 and the profiles go first.
BUDGET_S="${BUDGET_S:-540}"

run() {  # run NAME LIMIT_S COMMAND...: log, last line as NAME.json, rc.
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET_S - SECONDS))
  if ((left < 30)); then
    echo "{\"skipped\": \"out of time: ${left}s left\"}" > "$OUT/$name.json"
    echo "$name skipped" | tee -a "$OUT/rc.txt"
    return
  fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 1 "$OUT/$name.log" > "$OUT/$name.json"
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/rc.txt"
}

accelerator() {
  run "accelerator_run$1" 360 python benchmarks/accelerator.py \
    --models=qwen2_5_0_5b "${SMALL[@]}"
}
accelerator 1
for model in qwen2_5_0_5b qwen2_5_7b; do
  run "profile_$model" 150 python benchmarks/decode_profile.py \
    --model="$model" --rows="$PROFILE_ROWS" --context="$PROFILE_CONTEXT" \
    --steps="$PROFILE_STEPS" --trace_dir="/tmp/trace_$model" \
    "${SMALL[@]}"
done
for i in $(seq 2 "$RUNS"); do
  accelerator "$i"
done

# One file with every JSON line (a line that is not JSON is kept as text).
python - "$OUT" <<'EOF'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def read(p):
  text = p.read_text().strip()
  try:
    return json.loads(text)
  except ValueError:
    return {"not_json": text[-2000:]}
summary = {p.stem: read(p) for p in sorted(out.glob("*.json"))
           if p.name != "summary.json"}
summary["card"] = (out / "card.txt").read_text()
summary["rc"] = (out / "rc.txt").read_text()
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps({k: v.get("wall_s") if isinstance(v, dict) else v
                  for k, v in summary.items()}))
EOF
