"""Set before any test module imports OpenHands (and with it LiteLLM): LiteLLM fetches
its model-cost map in a background thread otherwise, which can deadlock with the
imports of the main thread on a host without a route out."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")
