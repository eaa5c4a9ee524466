"""Trace-replay agents: a workload's sessions (the simulator's generators and importers)
replayed on the real stack, through the SDK, the gateway and the sandbox pool.

- ``repository``: the small Python repository each session works on;
- ``tools``: a workload's tool call as a real command in the session's sandbox (a read,
  a grep, an edit, the repository's tests...), padded to the tool's CPU demand and
  duration;
- ``agent``: one agent per session, its LLM calls through the instrumented OpenAI
  client asking the engine for the workload's prompt and output lengths;
- ``records``: what the agents saw, as the metrics' run records (the simulator's).
"""
