import os

from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.task_tracker import TaskTrackerTool
from openhands.tools.terminal import TerminalTool

llm = LLM(
    model=os.getenv("LLM_MODEL", "openai/cpu-tiny"),
    api_key=os.getenv("LLM_API_KEY", "none"),
    base_url=os.getenv("LLM_BASE_URL"),
    usage_id="agent",
)
agent = Agent(
    llm=llm,
    tools=[
        Tool(name=TerminalTool.name),
        Tool(name=FileEditorTool.name),
        Tool(name=TaskTrackerTool.name),
    ],
)
cwd = os.getcwd()
conversation = Conversation(agent=agent, workspace=cwd, visualizer=None)
conversation.send_message("Write 3 facts about the current project into FACTS.txt.")
conversation.run()
print("All done:", conversation.state.execution_status.value)
