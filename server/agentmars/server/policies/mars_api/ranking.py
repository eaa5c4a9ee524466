"""Seed 001 §3 Step 2: a call's rank is the area under its memory over time (Fig. 3),
from now to the end of its API call, under the handling chosen for it: a call that
holds little memory for little time runs first, and a call whose handling keeps its
memory through a long API call (Preserve) waits for the others. In token-seconds
(Fig. 3's area without the common factor M, the bytes per token).

Seed 001 segments a multi-API request at its API calls ("After completing an API call,
the request re-enters the system as a new request"): one segment is one engine call
here, whose prompt holds the context so far. The area of a segment:
- the prompt's prefill: the tokens still to compute take ``prefill_time``, holding the
  prompt's memory;
- the generation still to come: each of the predicted remaining output tokens takes a
  decode step of the current context and adds its token;
- the API call, by handling: Preserve holds the whole context for the API's duration
  (INFERCEPT Eq. 1), Discard holds it while it is recomputed after the call (Eq. 2
  without the other calls' share), Swap while it is copied out and in (Eq. 3 without
  the batch's share). A call that calls no API adds none.
NOTE: ours — the figure gives the shapes, not the formula; the other calls' share in
Eq. 2-3 is their waste, not this call's memory, so it chooses the handling but does not
rank.
"""

from __future__ import annotations

from agentmars.server.policies.mars_api.handling import Handling
from agentmars.server.policies.mars_api.predictors import Prediction
from agentmars.server.policies.views import CallView, EngineView


def memory_time(
    call: CallView, prediction: Prediction, handling: Handling | None, view: EngineView
) -> float:
    """The area under ``call``'s memory from now to the end of its API call
    (``handling`` None: it calls none)."""
    costs = view.costs
    prompt = call.prompt_tokens
    computed = min(call.num_computed_tokens, prompt)
    prefill = costs.prefill_time(prompt - computed, computed) * prompt if computed < prompt else 0.0
    context = prompt + call.output_tokens
    remaining = max(prediction.output_tokens - call.output_tokens, 1)
    decode = costs.decode_time(context, 1) * (remaining * context + remaining * (remaining + 1) / 2)
    end = context + remaining
    return prefill + decode + _api_area(end, prediction.api_s, handling, view)


def _api_area(context: int, api_s: float, handling: Handling | None, view: EngineView) -> float:
    if handling is None:
        return 0.0
    if handling is Handling.PRESERVE:
        return api_s * context
    if handling is Handling.DISCARD:
        return view.costs.prefill_time(context) * context
    return 2 * view.costs.transfer_time(view.blocks_for(context)) * context
