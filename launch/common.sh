# Shell helpers shared by the launch scripts (sourced, not run).

die() {
  echo "error: $*" >&2
  exit 2
}

# One word as shell text, quoted only when it has to be.
quote() {
  local safe='^[A-Za-z0-9_./:=,@%+-]+$'
  if [[ $1 =~ $safe ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

quote_words() {
  local out="" w
  for w in "$@"; do out+="${out:+ }$(quote "$w")"; done
  printf '%s' "$out"
}

# require VAR OPTION: fails unless VAR (set by OPTION) is non-empty.
require() {
  [[ -n ${!1} ]] || die "missing $2 (or set $1)"
}

# check_env_item VALUE: an --env value must be KEY=VALUE.
check_env_item() {
  [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env wants KEY=VALUE, got '$1'"
}
