#!/usr/bin/env bash
# Cloud TPU VMs for swirl_jax: create one, install the code on every host,
# run a config on every host, delete it. Each step is a gcloud command;
# --dry-run prints them ("+ " and the command, one a line) and runs nothing.
set -euo pipefail

CHECKOUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly CHECKOUT
# Port of the jax.distributed coordinator on worker 0 (JAX's usual TPU port).
readonly COORDINATOR_PORT=8476
readonly REMOTE_TGZ=swirl_jax_src.tgz
# Tildes here are for the remote shell to expand, on the TPU host.
# shellcheck disable=SC2088
readonly RUN_LOG='~/swirl_run.log'

usage() {
  cat <<'EOF'
usage: launch/tpu_vm.sh COMMAND [options] [-- args]

Commands:
  create   create the TPU VM
  install  put the code on every host and pip install it with jax[tpu]
  run      run swirl_jax.main on every host; args after -- go to main
  ssh      run a shell command (args after --) on --worker, or log in
  delete   delete the TPU VM

Options ([environment variable] that sets the default):
  --name NAME           TPU VM name [TPU_NAME]
  --zone ZONE           zone, e.g. us-central2-b [ZONE]
  --project PROJECT     Cloud project; default: gcloud's own [PROJECT]
  --type TYPE           create: accelerator type, e.g. v4-32, v5litepod-16
                        [ACCELERATOR_TYPE]
  --version VERSION     create: TPU runtime version; default from --type
                        [RUNTIME_VERSION]
  --spot                create: a Spot VM
  --repo URL            install: git clone URL on every host instead of
                        copying a local checkout [REPO_URL]
  --ref REF             install: branch, tag or commit of --repo [REPO_REF]
  --src DIR             install: local checkout to copy (default: this one)
  --remote-dir DIR      code on each host, under ~ unless absolute
                        (default swirl_jax) [REMOTE_DIR]
  --venv DIR            virtual environment on each host, under ~ unless
                        absolute (default swirl_venv) [VENV]
  --config FILE[:ARGS]  run: config, relative to the code [CONFIG]
  --workdir DIR         run: output directory, on each host [WORKDIR]
  --env KEY=VALUE       run: extra environment for main (repeatable)
  --coordinator ADDR    run: jax.distributed coordinator host:port
                        (default: worker 0's internal IP) [COORDINATOR]
  --detach              run: keep running after ssh ends; log to
                        ~/swirl_run.log on each host
  --worker N|all        ssh: which host (default 0)
  --yes                 delete: do not ask for confirmation
  -n, --dry-run         print the commands, run nothing [DRY_RUN=1]
  -h, --help            this help

Example:
  launch/tpu_vm.sh run --dry-run --name=swirl --zone=us-central2-b \
      --config=configs/swirl_gsm8k.py --workdir=/tmp/swirl_gsm8k
EOF
}

# die, quote, quote_words, require, check_env_item.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Dry-run traces go to fd 3, the real stdout (main opens it), so that one
# made inside $(...) still reaches the user.
trace() {
  if [[ $DRY_RUN == 1 ]]; then
    echo "+ $*" >&3
  else
    echo "+ $*" >&2
  fi
}

run_cmd() {
  trace "$(quote_words "$@")"
  [[ $DRY_RUN == 1 ]] || "$@"
}

# A path on a TPU host: relative paths are under the login user's home.
remote_path() {
  # shellcheck disable=SC2088
  if [[ $1 == /* ]]; then quote "$1"; else printf '~/%s' "$(quote "$1")"; fi
}

default_version() {
  case $1 in
    v2-* | v3-*) echo tpu-vm-base ;;
    v4-*) echo tpu-ubuntu2204-base ;;
    v5litepod-* | v5e-*) echo v2-alpha-tpuv5-lite ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v6e-*) echo v2-alpha-tpuv6e ;;
    *) die "no default runtime version for --type $1; pass --version" ;;
  esac
}

# Option name -> variable it sets; fails for an unknown option.
option_var() {
  case $1 in
    --name) echo TPU_NAME ;;
    --zone) echo ZONE ;;
    --project) echo PROJECT ;;
    --type) echo ACCELERATOR_TYPE ;;
    --version) echo RUNTIME_VERSION ;;
    --repo) echo REPO_URL ;;
    --ref) echo REPO_REF ;;
    --src) echo SRC ;;
    --remote-dir) echo REMOTE_DIR ;;
    --venv) echo VENV ;;
    --config) echo CONFIG ;;
    --workdir) echo WORKDIR ;;
    --coordinator) echo COORDINATOR ;;
    --worker) echo WORKER ;;
    --env) echo ENV_ITEM ;;
    *) return 1 ;;
  esac
}

# set_option NAME VALUE HAS_VALUE
set_option() {
  local var
  var=$(option_var "$1") || die "unknown option $1 (see --help)"
  [[ $3 == 1 && -n $2 && $2 != -* ]] || die "option $1 needs a value"
  if [[ $var == ENV_ITEM ]]; then
    check_env_item "$2"; ENVS+=("$2")
  else
    printf -v "$var" '%s' "$2"
  fi
}

parse_args() {
  while (($#)); do
    case $1 in
      -h | --help) usage; exit 0 ;;
      -n | --dry-run) DRY_RUN=1 ;;
      --spot) SPOT=1 ;;
      --detach) DETACH=1 ;;
      --yes) YES=1 ;;
      --) shift; EXTRA=("$@"); return ;;
      --*=*) set_option "${1%%=*}" "${1#*=}" 1 ;;
      --*) set_option "$1" "${2-}" "$(($# >= 2))"; shift ;;
      *) die "unexpected argument '$1' (arguments for main go after --)" ;;
    esac
    shift
  done
}

# gcloud compute tpus tpu-vm VERB NAME --zone=... [--project=...] ARGS...
tpu_vm() {
  local verb=$1
  shift
  run_cmd gcloud compute tpus tpu-vm "$verb" "$TPU_NAME" "${GCLOUD_FLAGS[@]}" \
    "$@"
}

# tpu_ssh WORKER SHELL_TEXT: one ssh per host, all hosts at once for 'all'.
tpu_ssh() {
  tpu_vm ssh --worker="$1" --command="$2"
}

cmd_create() {
  require ACCELERATOR_TYPE --type
  local version=$RUNTIME_VERSION
  [[ -n $version ]] || version=$(default_version "$ACCELERATOR_TYPE")
  local args=(--accelerator-type="$ACCELERATOR_TYPE" --version="$version")
  [[ $SPOT != 1 ]] || args+=(--spot)
  tpu_vm create "${args[@]}"
}

# Tracked files plus untracked ones git does not ignore, i.e. the code with
# local edits but without build outputs or workdirs, to every host.
copy_checkout() {
  local tgz="${TMPDIR:-/tmp}/swirl_jax_src.$$.tgz"
  local src
  src=$(quote "$SRC")
  trace "git -C $src ls-files -z --cached --others --exclude-standard" \
    "| tar -czf $(quote "$tgz") -C $src --null -T -"
  if [[ $DRY_RUN != 1 ]]; then
    # shellcheck disable=SC2064  # tgz is local: expand it now.
    trap "rm -f $(quote "$tgz")" EXIT
    git -C "$SRC" ls-files -z --cached --others --exclude-standard |
      tar -czf "$tgz" -C "$SRC" --null -T -
  fi
  run_cmd gcloud compute tpus tpu-vm scp "$tgz" "$TPU_NAME:$REMOTE_TGZ" \
    --worker=all "${GCLOUD_FLAGS[@]}"
}

# Shell text that fetches the code on a host: a clone of --repo, or the
# tarball copy_checkout sent.
fetch_code_steps() {
  local dir=$1
  if [[ -n $REPO_URL ]]; then
    printf '%s\n' \
      "[ -d $dir/.git ] || git clone -q $(quote "$REPO_URL") $dir" \
      "git -C $dir fetch -q origin $(quote "$REPO_REF")" \
      "git -C $dir checkout -q FETCH_HEAD"
  else
    printf '%s\n' "mkdir -p $dir" "tar -xzf ~/$REMOTE_TGZ -C $dir"
  fi
}

# Shell text run on every host by `install`, one step a line.
install_steps() {
  local dir venv
  dir=$(remote_path "$REMOTE_DIR")
  venv=$(remote_path "$VENV")
  local apt='sudo DEBIAN_FRONTEND=noninteractive apt-get -qq'
  # Boot-time unattended upgrades hold the apt lock for a while; wait.
  apt+=' -o DPkg::Lock::Timeout=600'
  printf '%s\n' "set -e" "$apt update" \
    "$apt install -y git python3-venv bubblewrap"
  fetch_code_steps "$dir"
  # TPU VM images ship Python 3.10; JAX wants 3.11 or newer since 0.7.
  local old="python3 -c 'import sys; sys.exit(sys.version_info >= (3, 11))'"
  printf '%s\n' \
    "PY=python3" \
    "if $old; then $apt install -y python3.11-venv; PY=python3.11; fi" \
    "\$PY -m venv $venv" \
    "$venv/bin/pip install -q -U pip" \
    "$venv/bin/pip install -q -U 'jax[tpu]'" \
    "$venv/bin/pip install -q -e $dir"
}

cmd_install() {
  [[ -n $REPO_URL ]] || copy_checkout
  local steps
  steps=$(install_steps)
  tpu_ssh all "${steps//$'\n'/; }"
}

# Worker 0's internal IP: every host must agree on the coordinator.
worker0_ip() {
  local args=(gcloud compute tpus tpu-vm describe "$TPU_NAME"
    "${GCLOUD_FLAGS[@]}" '--format=value(networkEndpoints[0].ipAddress)')
  trace "$(quote_words "${args[@]}")"
  if [[ $DRY_RUN == 1 ]]; then
    echo WORKER_0_IP
  else
    "${args[@]}"
  fi
}

cmd_run() {
  require CONFIG --config
  require WORKDIR --workdir
  # Records (JSONL shards, metrics) are appended with local file I/O.
  [[ $WORKDIR != *://* ]] || die "--workdir $WORKDIR: swirl_jax writes" \
    "with local file I/O; mount the bucket (gcsfuse) and pass the mount path"
  local coordinator=$COORDINATOR ip
  if [[ -z $coordinator ]]; then
    ip=$(worker0_ip)
    [[ -n $ip ]] || die "no internal IP for worker 0 of $TPU_NAME"
    coordinator="$ip:$COORDINATOR_PORT"
  fi
  # swirl_jax.main calls jax.distributed.initialize() when this is set
  # (an ssh session on a TPU VM need not have TPU_WORKER_HOSTNAMES, the
  # other sign it looks for); JAX then reads the process count and id from
  # the TPU metadata.
  local env_words=(env "JAX_COORDINATOR_ADDRESS=$coordinator"
    ${ENVS[@]+"${ENVS[@]}"})
  local launch
  launch="$(quote_words "${env_words[@]}") $(remote_path "$VENV")/bin/python"
  launch+=" -m swirl_jax.main $(quote_words "--config=$CONFIG" \
    "--workdir=$WORKDIR" ${EXTRA[@]+"${EXTRA[@]}"})"
  if [[ $DETACH == 1 ]]; then
    launch="nohup $launch > $RUN_LOG 2>&1 < /dev/null &"
  fi
  tpu_ssh all "cd $(remote_path "$REMOTE_DIR") && $launch"
}

cmd_ssh() {
  if ((${#EXTRA[@]})); then
    # Joined like ssh joins its arguments: the words are shell text.
    tpu_ssh "$WORKER" "${EXTRA[*]}"
  else
    tpu_vm ssh --worker="$WORKER"
  fi
}

cmd_delete() {
  if [[ $YES == 1 ]]; then tpu_vm delete --quiet; else tpu_vm delete; fi
}

main() {
  if (($# == 0)); then
    usage >&2
    exit 2
  fi
  case $1 in
    -h | --help) usage; exit 0 ;;
    create | install | run | ssh | delete) ;;
    *) die "unknown command '$1' (want create, install, run, ssh or delete)" ;;
  esac
  local cmd=$1
  shift
  exec 3>&1
  TPU_NAME=${TPU_NAME:-} ZONE=${ZONE:-} PROJECT=${PROJECT:-}
  ACCELERATOR_TYPE=${ACCELERATOR_TYPE:-} RUNTIME_VERSION=${RUNTIME_VERSION:-}
  REPO_URL=${REPO_URL:-} REPO_REF=${REPO_REF:-HEAD} SRC=$CHECKOUT
  REMOTE_DIR=${REMOTE_DIR:-swirl_jax} VENV=${VENV:-swirl_venv}
  CONFIG=${CONFIG:-} WORKDIR=${WORKDIR:-} COORDINATOR=${COORDINATOR:-}
  WORKER=0 SPOT=0 DETACH=0 YES=0 ENVS=() EXTRA=()
  # Anything but an explicit no means a dry run: it must never run things.
  case ${DRY_RUN:-0} in 0 | false | no | "") DRY_RUN=0 ;; *) DRY_RUN=1 ;; esac
  parse_args "$@"
  if ((${#EXTRA[@]})) && [[ $cmd != run && $cmd != ssh ]]; then
    die "arguments after -- are for run and ssh only"
  fi
  require TPU_NAME --name
  require ZONE --zone
  GCLOUD_FLAGS=(--zone="$ZONE")
  [[ -z $PROJECT ]] || GCLOUD_FLAGS+=(--project="$PROJECT")
  "cmd_$cmd"
}

main "$@"
