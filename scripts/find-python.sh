#!/usr/bin/env bash
# Print the path of a Python X.Y interpreter (argument, default 3.12):
# $AGENTMARS_PYTHON, pythonX.Y on PATH, or one installed by pyenv. Fails with a
# clear message when none exists.
#   scripts/find-python.sh        # the main environment's 3.12
#   scripts/find-python.sh 3.11   # the vLLM environment's 3.11
set -euo pipefail
want=${1:-3.12}
[[ $want =~ ^3\.[0-9]+$ ]] || { echo "error: expected a version like 3.12, got '$want'" >&2; exit 2; }
minor=${want#3.}
# Prints the interpreter's own path: a pyenv shim resolves to the real binary.
resolve() {
  [ -x "$1" ] && "$1" -c "import sys; assert sys.version_info[:2] == (3, $minor); print(sys.executable)" 2>/dev/null
}
candidates=()
[ -n "${AGENTMARS_PYTHON:-}" ] && candidates+=("$AGENTMARS_PYTHON")
command -v python$want >/dev/null 2>&1 && candidates+=("$(command -v python$want)")
pyenv_root=$( (pyenv root 2>/dev/null) || echo "${PYENV_ROOT:-$HOME/.pyenv}")
# NOTE: "3.1" must not match 3.12's folder: only "<want>" and "<want>.<patch>".
for dir in "$pyenv_root"/versions/$want "$pyenv_root"/versions/$want.*; do
  [ -d "$dir" ] && candidates+=("$dir/bin/python$want")
done
candidates+=(/usr/bin/python$want /usr/local/bin/python$want)
for python in "${candidates[@]}"; do
  if resolve "$python"; then exit 0; fi
done
echo "error: no Python $want found (looked at \$AGENTMARS_PYTHON, PATH, pyenv, /usr); install one, e.g. 'pyenv install $want'" >&2
exit 1
