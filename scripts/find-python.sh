#!/usr/bin/env bash
# Print the path of a Python 3.12 interpreter: $AGENTMARS_PYTHON, python3.12 on
# PATH, or one installed by pyenv. Fails with a clear message when none exists.
set -euo pipefail
want=3.12
check() { [ -x "$1" ] && "$1" -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))" 2>/dev/null; }
candidates=()
[ -n "${AGENTMARS_PYTHON:-}" ] && candidates+=("$AGENTMARS_PYTHON")
command -v python$want >/dev/null 2>&1 && candidates+=("$(command -v python$want)")
pyenv_root=$( (pyenv root 2>/dev/null) || echo "${PYENV_ROOT:-$HOME/.pyenv}")
for dir in "$pyenv_root"/versions/$want*; do
  [ -d "$dir" ] && candidates+=("$dir/bin/python$want")
done
candidates+=(/usr/bin/python$want /usr/local/bin/python$want)
for python in "${candidates[@]}"; do
  if check "$python"; then echo "$python"; exit 0; fi
done
echo "error: no Python $want found (looked at \$AGENTMARS_PYTHON, PATH, pyenv, /usr); install one, e.g. 'pyenv install 3.12'" >&2
exit 1
