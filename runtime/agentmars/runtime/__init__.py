"""agentmars' agent side: trace-replay agents on the real stack (``replay``) and the
OpenHands integration."""
