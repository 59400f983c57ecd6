#!/usr/bin/env bash
# Multi-node GPU runs of swirl_jax under SLURM: writes an sbatch script that
# starts one process per node with srun, and submits it. --dry-run prints
# the script and the commands ("+ " and the command, one a line) and runs
# nothing.
set -euo pipefail

CHECKOUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly CHECKOUT
readonly JOB_FILE=swirl_jax.sbatch

usage() {
  cat <<'EOF'
usage: launch/gpu_slurm.sh COMMAND [options] [-- args for main]

Commands:
  script   print the sbatch script
  submit   write it to WORKDIR/swirl_jax.sbatch and sbatch it
  install  make --venv here and pip install jax[cuda12] and this checkout

Options ([environment variable] that sets the default):
  --config FILE[:ARGS]  config, relative to the checkout [CONFIG]
  --workdir DIR         output directory, on a file system all nodes share
                        [WORKDIR]
  --nodes N             nodes, one process each (default 1) [NODES]
  --port P              jax.distributed coordinator port on the first node
                        (default 8476) [COORDINATOR_PORT]
  --gpus-per-node G     GPUs per node (default 8) [GPUS_PER_NODE]
  --partition P         SLURM partition [PARTITION]
  --time T              time limit, e.g. 24:00:00 [TIME_LIMIT]
  --job-name NAME       job name (default swirl_jax)
  --venv DIR            virtual environment (default ~/venvs/swirl_jax)
                        [VENV]
  --sbatch OPT          extra #SBATCH option, e.g. --account=abc (repeatable)
  --setup CMD           shell line run before srun, e.g. 'module load
                        cuda' (repeatable)
  --env KEY=VALUE       exported for main (repeatable)
  -n, --dry-run         print the script and the commands, run nothing
                        [DRY_RUN=1]
  -h, --help            this help

Example:
  launch/gpu_slurm.sh submit --dry-run --nodes=2 --gpus-per-node=8 \
      --config=configs/swirl_gsm8k.py --workdir=$HOME/runs/swirl_gsm8k
EOF
}

# die, quote, quote_words, require, check_command, run_cmd, parse_args.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Options and the variables they set (see common.sh); no switches here.
readonly -a OPTIONS=(--config=CONFIG --workdir=WORKDIR --nodes=NODES
  --port=COORDINATOR_PORT --gpus-per-node=GPUS_PER_NODE
  --partition=PARTITION --time=TIME_LIMIT --job-name=JOB_NAME --venv=VENV
  --sbatch=SBATCH_OPTS+ --setup=SETUP+ --env=ENVS+)
readonly -a SWITCHES=()
# Options whose value may start with "-": --sbatch takes "--account=abc".
readonly DASH_VALUES=--sbatch

positive_int() {
  [[ $1 =~ ^[1-9][0-9]*$ ]] || die "$2 wants a positive integer, got '$1'"
}

absolute() {
  if [[ $1 == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi
}

check_job_options() {
  require CONFIG --config
  require WORKDIR --workdir
  positive_int "$NODES" --nodes
  positive_int "$GPUS_PER_NODE" --gpus-per-node
  positive_int "$COORDINATOR_PORT" --port
  [[ -f $CHECKOUT/${CONFIG%%:*} ]] || die "no config ${CONFIG%%:*} in $CHECKOUT"
  # The job starts in the checkout; paths given from here must not move.
  WORKDIR=$(absolute "$WORKDIR")
}

# 0,1,...,G-1
device_ids() {
  local ids=0 i
  for ((i = 1; i < $1; i++)); do ids+=",$i"; done
  echo "$ids"
}

sbatch_header() {
  local opts=(--job-name="$JOB_NAME" --nodes="$NODES" --ntasks-per-node=1
    --gpus-per-node="$GPUS_PER_NODE" --output="$WORKDIR/slurm-%j.out")
  [[ -z $PARTITION ]] || opts+=(--partition="$PARTITION")
  [[ -z $TIME_LIMIT ]] || opts+=(--time="$TIME_LIMIT")
  opts+=(${SBATCH_OPTS[@]+"${SBATCH_OPTS[@]}"})
  echo '#!/bin/bash'
  printf '#SBATCH %s\n' "${opts[@]}"
}

job_script() {
  sbatch_header
  cat <<EOF
# Made by launch/gpu_slurm.sh.
set -euo pipefail
cd $(quote "$CHECKOUT")
EOF
  local line
  for line in ${SETUP[@]+"${SETUP[@]}"}; do echo "$line"; done
  for line in ${ENVS[@]+"${ENVS[@]}"}; do
    echo "export ${line%%=*}=$(quote "${line#*=}")"
  done
  local main_words=("$VENV/bin/python" -m swirl_jax.main "--config=$CONFIG"
    "--workdir=$WORKDIR" ${EXTRA[@]+"${EXTRA[@]}"})
  cat <<EOF
# One process per node drives all of the node's GPUs. Without this, JAX's
# SLURM auto-detection would give each process only GPU number SLURM_LOCALID.
export JAX_LOCAL_DEVICE_IDS=$(device_ids "$GPUS_PER_NODE")
# jax.distributed (swirl_jax.distributed.initialize): the coordinator on
# the first node, one process per node, each its SLURM_PROCID as its id.
: "\${SLURM_JOB_NODELIST:?not in a SLURM job; submit this script with sbatch}"
first_node=\$(scontrol show hostnames "\$SLURM_JOB_NODELIST" | head -n 1)
export JAX_COORDINATOR_ADDRESS="\$first_node:$COORDINATOR_PORT"
export JAX_NUM_PROCESSES=\$SLURM_NNODES
# --kill-on-bad-exit: one failed process ends the job instead of leaving
# the others blocked in a collective.
srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\
  bash -c 'export JAX_PROCESS_ID=\$SLURM_PROCID; exec "\$@"' swirl_jax \\
  $(quote_words "${main_words[@]}")
EOF
}

cmd_script() {
  check_job_options
  job_script
}

cmd_submit() {
  check_job_options
  local file="$WORKDIR/$JOB_FILE" script
  script=$(job_script)
  # Caught now rather than after the job waited in the queue.
  [[ $DRY_RUN == 1 || -x $VENV/bin/python ]] ||
    die "no $VENV/bin/python; run launch/gpu_slurm.sh install or pass --venv"
  if [[ $DRY_RUN == 1 ]]; then
    echo "$script"
  fi
  # SLURM opens the --output file in WORKDIR before the job runs.
  run_cmd mkdir -p "$WORKDIR"
  if [[ $DRY_RUN != 1 ]]; then
    echo "$script" >"$file"
    echo "wrote $file" >&2
  fi
  run_cmd sbatch "$file"
}

cmd_install() {
  run_cmd python3 -m venv "$VENV"
  run_cmd "$VENV/bin/pip" install -q -U pip
  run_cmd "$VENV/bin/pip" install -q -U 'jax[cuda12]'
  run_cmd "$VENV/bin/pip" install -q -e "$CHECKOUT"
  if ! command -v bwrap >/dev/null 2>&1; then
    echo "note: no bwrap here; the Python sandbox (SimpleTIR) needs the" \
      "bubblewrap package on the compute nodes" >&2
  fi
}

main() {
  check_command "script submit install" "$@"
  local cmd=$1
  shift
  CONFIG=${CONFIG:-} WORKDIR=${WORKDIR:-} NODES=${NODES:-1}
  COORDINATOR_PORT=${COORDINATOR_PORT:-8476}
  GPUS_PER_NODE=${GPUS_PER_NODE:-8} PARTITION=${PARTITION:-}
  TIME_LIMIT=${TIME_LIMIT:-} VENV=${VENV:-$HOME/venvs/swirl_jax}
  JOB_NAME=swirl_jax
  SBATCH_OPTS=() SETUP=() ENVS=() EXTRA=()
  parse_args "$@"
  if ((${#EXTRA[@]})) && [[ $cmd == install ]]; then
    die "arguments after -- are for script and submit only"
  fi
  VENV=$(absolute "$VENV")
  "cmd_$cmd"
}

main "$@"
