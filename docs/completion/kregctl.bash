# bash completion for kregctl. Install:
#   sudo install -m644 docs/completion/kregctl.bash \
#     /usr/share/bash-completion/completions/kregctl
# or `source docs/completion/kregctl.bash` in ~/.bashrc.
# Commands and options are read from `kregctl --help` / `kregctl CMD --help`,
# so new subcommands complete without editing this file; target names come
# from `kregctl list` (first column) for commands that take NAME.

_kregctl_commands() {
  "$1" --help 2>/dev/null | sed -n '/^Subcommands:/,$p' |
    awk 'NR > 1 && /^  [a-z]/ { print $1 }'
}

_kregctl_options() {
  "$1" ${2:+"$2"} --help 2>/dev/null | grep -oE -- '--[a-z][a-z-]*' | sort -u
}

_kregctl() {
  local cur prev bin cmd i
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  bin=${COMP_WORDS[0]}
  local -a sock=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${COMP_WORDS[i]} in
      --socket) sock=(--socket "${COMP_WORDS[i+1]}"); ((i++)) ;;
      -*) ;;
      *) [[ -z $cmd ]] && cmd=${COMP_WORDS[i]} ;;
    esac
  done
  case $prev in
    --socket) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --module) COMPREPLY=($(compgen -f -X '!*.so' -- "$cur") \
                         $(compgen -d -- "$cur")); return ;;
    --platform) COMPREPLY=($(compgen -W "cpu cuda" -- "$cur")); return ;;
  esac
  if [[ -z $cmd ]]; then
    if [[ $cur == -* ]]; then
      COMPREPLY=($(compgen -W "$(_kregctl_options "$bin")" -- "$cur"))
    else
      COMPREPLY=($(compgen -W "$(_kregctl_commands "$bin")" -- "$cur"))
    fi
    return
  fi
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$(_kregctl_options "$bin" "$cmd")" -- "$cur"))
  elif "$bin" "$cmd" --help 2>/dev/null | grep -q '^  NAME '; then
    COMPREPLY=($(compgen -W "$("$bin" "${sock[@]}" list 2>/dev/null |
                               awk 'NR > 1 && !/^not runnable/ { print $1 }')" \
                 -- "$cur"))
  fi
}
complete -F _kregctl kregctl
