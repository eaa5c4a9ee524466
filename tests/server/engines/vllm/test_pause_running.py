"""A policy that pauses a session while its call runs in vLLM (ThunderAgent's and
MORI's ``pause``) must hand that call back to vLLM once on resume. Holding it twice
queued it twice, and vLLM's waiting loop met the second copy running: "Invalid request
status: RUNNING" killed the engine core (issue 39, thunderagent-cpu under
`bench replay`). Here vLLM's real scheduler runs the plugin in the vLLM environment
(no model: bench_schedule's synthetic outputs), with ThunderAgent checking for
thrashing at every step and a KV pool too small for the sessions' contexts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PAUSE_WHILE_RUNNING_PROBE = """
import json, sys
from agentmars.sdk.events import SessionEnd
from agentmars.server.engines.vllm import bench_schedule as b
from agentmars.server.engines.vllm.tiny_model import ensure_tiny_model

shape = b.SchedulerShape(kv_blocks=96, max_model_len=2048)
scheduler = b.make_scheduler(sys.argv[1], ensure_tiny_model(), shape)
seen = {"pauses": 0, "pauses_of_running": 0, "resumes": 0, "calls": 0}
pause, resume = scheduler._pause, scheduler._resume

def session_of(request):
    return (request.sampling_params.extra_args or {}).get("session_id")

def counted_pause(session_id, reason):
    seen["pauses"] += 1
    seen["pauses_of_running"] += any(session_of(r) == session_id for r in scheduler.running)
    pause(session_id, reason)

def counted_resume(session_id):
    seen["resumes"] += 1
    resume(session_id)

scheduler._pause, scheduler._resume = counted_pause, counted_resume
sessions = b.build_sessions(b.QueueShape(sessions=12, turns=3, first_prompt=(256, 512)))
factory = b.RequestFactory(shape.block_size)
live, turn, contexts = {}, [0] * len(sessions), [[] for _ in sessions]

def submit(s):
    request = factory.make(sessions[s][turn[s]], contexts[s])
    live[request.request_id] = (s, request)
    scheduler.add_request(request)

for s in range(len(sessions)):
    submit(s)
idle = 0
while live:
    output = scheduler.schedule()
    idle = 0 if output.total_num_scheduled_tokens else idle + 1
    assert idle < 2000, f"{len(live)} calls left and none is scheduled"
    requests = {request_id: request for request_id, (_, request) in live.items()}
    scheduler.update_from_output(output, b.synthetic_output(output, requests))
    for request_id in [k for k, (_, request) in live.items() if request.is_finished()]:
        s, request = live.pop(request_id)
        seen["calls"] += 1
        contexts[s] = list(request.all_token_ids)
        turn[s] += 1
        if turn[s] < len(sessions[s]):
            submit(s)
        else:  # as the gateway says it: the session's pins go
            scheduler.feed(SessionEnd(session_id=sessions[s][0].session_id))
print(json.dumps(seen))
"""


def test_a_session_paused_mid_call_resumes_its_call_once(vllm_python: Path) -> None:
    done = subprocess.run(
        [str(vllm_python), "-c", PAUSE_WHILE_RUNNING_PROBE, "thunderagent:check_interval_s=0.001"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["calls"] == 36  # every call of every session ran to its end
    assert seen["pauses_of_running"] > 0  # the case in question happened
    assert seen["resumes"] == seen["pauses"]
