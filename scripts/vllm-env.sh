#!/usr/bin/env bash
# The vLLM CPU environment (Python 3.11, requirements/vllm.txt), built and cached
# by scripts/locked-env.sh; prints its python's path as the last line of stdout.
#   scripts/vllm-env.sh          # env from requirements/vllm.lock (exact versions)
#   scripts/vllm-env.sh --lock   # re-resolve requirements/vllm.txt into vllm.lock
set -euo pipefail
name=vllm
want=3.11
imports="import tokenizers, transformers, vllm"
# vLLM only needs these for multimodal models; see requirements/vllm.txt.
unwanted=(torchvision torchaudio torchcodec)
source "$(dirname "$0")/locked-env.sh"
reqs=$root/requirements/vllm.txt lock=$root/requirements/vllm.lock
locked_env_main "$@"
