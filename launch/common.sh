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

# check_command "COMMAND..." ARGS...: fails unless ARGS start with one of
# the script's commands; with no ARGS, or -h, prints the usage instead.
check_command() {
  local commands=$1 command
  shift
  if (($# == 0)); then
    usage >&2
    exit 2
  fi
  if [[ $1 == -h || $1 == --help ]]; then
    usage
    exit 0
  fi
  for command in $commands; do [[ $1 != "$command" ]] || return 0; done
  local list=${commands// /, }
  die "unknown command '$1' (want ${list%, *} or ${list##*, })"
}

# Dry-run traces go to fd 3, the real stdout, so that one made inside $(...)
# still reaches the user.
exec 3>&1

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

# table_var NAME ENTRY...: VAR of the ENTRY NAME=VAR; fails for none.
table_var() {
  local name=$1 entry
  shift
  for entry in "$@"; do
    if [[ ${entry%%=*} == "$name" ]]; then
      echo "${entry#*=}"
      return 0
    fi
  done
  return 1
}

# The scripts' tables: OPTIONS, entries --name=VAR (the option sets VAR to
# its value) or --name=VAR+ (appends it to array VAR); SWITCHES, entries
# --name=VAR (the switch sets VAR to 1); DASH_VALUES, the options whose
# value may start with "-".

# set_option NAME VALUE HAS_VALUE: sets the variable OPTIONS names for NAME.
set_option() {
  local var
  var=$(table_var "$1" "${OPTIONS[@]}") || die "unknown option $1 (see --help)"
  [[ $3 == 1 && -n $2 ]] || die "option $1 needs a value"
  # A value starting with "-" is more likely a forgotten value than a value,
  # unless the option takes options.
  [[ $2 != -* || " $DASH_VALUES " == *" $1 "* ]] ||
    die "option $1 needs a value"
  [[ $1 != --env ]] || check_env_item "$2"
  case $var in
    # eval, not a nameref (bash 4.3+); var is a name from the script's table.
    *+) eval "${var%+}+=(\"\$2\")" ;;
    *) printf -v "$var" '%s' "$2" ;;
  esac
}

# parse_args ARGS...: the script's OPTIONS and SWITCHES, -n, -h, and EXTRA,
# the words after --.
parse_args() {
  local switch
  # Anything but an explicit no means a dry run: it must never run things.
  case ${DRY_RUN:-0} in 0 | false | no | "") DRY_RUN=0 ;; *) DRY_RUN=1 ;; esac
  while (($#)); do
    case $1 in
      -h | --help) usage; exit 0 ;;
      -n | --dry-run) DRY_RUN=1 ;;
      --) shift; EXTRA=("$@"); return ;;
      --*=*) set_option "${1%%=*}" "${1#*=}" 1 ;;
      --*)
        if switch=$(table_var "$1" ${SWITCHES[@]+"${SWITCHES[@]}"}); then
          printf -v "$switch" 1
        else
          set_option "$1" "${2-}" "$(($# >= 2))"
          shift
        fi
        ;;
      *) die "unexpected argument '$1' (arguments for main go after --)" ;;
    esac
    shift
  done
}
