#!/usr/bin/env bash
# The OpenHands application's environment (openhands-ai, Python 3.12,
# requirements/openhands-app.txt), built and cached by scripts/locked-env.sh;
# prints its python's path as the last line of stdout.
#   scripts/openhands-env.sh          # env from requirements/openhands-app.lock
#   scripts/openhands-env.sh --lock   # re-resolve openhands-app.txt into the lock
set -euo pipefail
name=openhands
want=3.12
# Importing openhands must not fetch LiteLLM's model-cost map from the network nor
# print the SDK's banner (on stdout, which must end with the python's path).
export LITELLM_LOCAL_MODEL_COST_MAP=True OPENHANDS_SUPPRESS_BANNER=1
# What the env must import: the SDK and tools the app runs, and this clone.
imports="import openhands.sdk, openhands.tools.terminal, openhands.tools.file_editor, \
openhands.tools.task_tracker, agentmars.sdk, agentmars.sandbox.pool"
unwanted=()
source "$(dirname "$0")/locked-env.sh"
reqs=$root/requirements/openhands-app.txt lock=$root/requirements/openhands-app.lock
locked_env_main "$@"
