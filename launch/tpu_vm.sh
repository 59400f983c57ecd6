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
  --workdir DIR         run: output directory, on each host; gs://BUCKET/PATH
                        mounts the bucket with gcsfuse at ~/gcs/BUCKET on
                        every host and runs there [WORKDIR]
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

# die, quote, quote_words, require, check_command, trace, run_cmd,
# parse_args.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

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

# Options and switches, and the variables they set (see common.sh).
readonly -a OPTIONS=(--name=TPU_NAME --zone=ZONE --project=PROJECT
  --type=ACCELERATOR_TYPE --version=RUNTIME_VERSION --repo=REPO_URL
  --ref=REPO_REF --src=SRC --remote-dir=REMOTE_DIR --venv=VENV
  --config=CONFIG --workdir=WORKDIR --coordinator=COORDINATOR
  --worker=WORKER --env=ENVS+)
readonly -a SWITCHES=(--spot=SPOT --detach=DETACH --yes=YES)
# Options whose value may start with "-": none.
readonly DASH_VALUES=

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

# mount_steps BUCKET MOUNT: shell text that mounts gs://BUCKET at MOUNT on a
# host (installing gcsfuse first where the image lacks it), then "&& ".
# Records are appended with local file I/O, so every host writes through
# one mount of the bucket; checkpoints there commit with a commit file
# instead of a directory rename (swirl_jax.training.checkpoint).
mount_steps() {
  local bucket mount=$2 apt="sudo DEBIAN_FRONTEND=noninteractive apt-get -qq"
  local key=/usr/share/keyrings/cloud.google.asc
  local repo="deb [signed-by=$key] https://packages.cloud.google.com/apt"
  bucket=$(quote "$1")
  printf '%s' "{ command -v gcsfuse >/dev/null || {" \
    " echo \"$repo gcsfuse-\$(lsb_release -cs) main\"" \
    " | sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null" \
    " && curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg" \
    " | sudo tee $key >/dev/null && $apt update && $apt install -y gcsfuse;" \
    " }; } && mkdir -p $mount && { mountpoint -q $mount ||" \
    " gcsfuse --implicit-dirs $bucket $mount; } && "
}

cmd_run() {
  require CONFIG --config
  require WORKDIR --workdir
  local workdir=$WORKDIR mount="" bucket rest
  case $WORKDIR in
    gs://?*)  # Mounted on every host at ~/gcs/BUCKET.
      rest=${WORKDIR#gs://} bucket=${rest%%/*}
      [[ $bucket =~ ^[a-z0-9][a-z0-9._-]*$ ]] ||
        die "--workdir $WORKDIR: not a bucket name"
      mount=$(remote_path "gcs/$bucket")
      workdir="gcs/$bucket${rest:${#bucket}}" ;;
    *://*) die "--workdir $WORKDIR: only gs:// URLs are mounted; mount" \
      "the storage on every host and pass the mount path" ;;
  esac
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
  launch+=" -m swirl_jax.main $(quote_words "--config=$CONFIG")"
  if [[ -n $mount ]]; then
    # $HOME, not ~: a tilde after "=" is not expanded in an argument.
    launch+=" --workdir=\$HOME/$(quote "$workdir")"
  else
    launch+=" $(quote "--workdir=$workdir")"
  fi
  launch+="${EXTRA[@]+ $(quote_words "${EXTRA[@]}")}"
  if [[ $DETACH == 1 ]]; then
    launch="nohup $launch > $RUN_LOG 2>&1 < /dev/null &"
  fi
  local mounting=""
  [[ -z $mount ]] || mounting=$(mount_steps "$bucket" "$mount")
  tpu_ssh all "${mounting}cd $(remote_path "$REMOTE_DIR") && $launch"
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
  check_command "create install run ssh delete" "$@"
  local cmd=$1
  shift
  TPU_NAME=${TPU_NAME:-} ZONE=${ZONE:-} PROJECT=${PROJECT:-}
  ACCELERATOR_TYPE=${ACCELERATOR_TYPE:-} RUNTIME_VERSION=${RUNTIME_VERSION:-}
  REPO_URL=${REPO_URL:-} REPO_REF=${REPO_REF:-HEAD} SRC=$CHECKOUT
  REMOTE_DIR=${REMOTE_DIR:-swirl_jax} VENV=${VENV:-swirl_venv}
  CONFIG=${CONFIG:-} WORKDIR=${WORKDIR:-} COORDINATOR=${COORDINATOR:-}
  WORKER=0 SPOT=0 DETACH=0 YES=0 ENVS=() EXTRA=()
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
