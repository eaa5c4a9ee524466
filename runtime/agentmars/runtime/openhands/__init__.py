"""OpenHands on agentmars: an OpenHands agent's conversations served through the gateway,
their tools run in the sandbox pool, by instrumenting only the LLM and tool boundaries
(seed 000 §5).

    from agentmars.runtime.openhands import Conversation  # instead of openhands.sdk's
    conversation = Conversation(agent=agent, workspace=os.getcwd())

or, on a pool of one's own event loop::

    runtime = AgentmarsRuntime("http://127.0.0.1:8000", pool)
    with runtime.conversation(agent) as conversation:
        conversation.send_message("..."); conversation.run()

- ``runtime``: the conversation factories;
- ``hosted``: the pool a runtime starts for itself, on its own event loop;
- ``markers``: each call's session markers on the wire, through the LLM's
  ``litellm_extra_body``;
- ``tools`` / ``terminal``: the terminal, file editor and task tracker under the pool;
- ``binding``: a conversation's sandbox session, used from OpenHands' threads.

Needs the ``openhands`` extra (Python 3.12): ``openhands-sdk`` and ``openhands-tools``.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

from agentmars.runtime.openhands.runtime import AgentmarsRuntime, Conversation

__all__ = ["AgentmarsRuntime", "Conversation"]
