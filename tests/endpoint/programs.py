"""Agent programs the endpoint tests train: written against the OpenAI API as a user would, with no
agentrl in their loop (`agentrl train --env tests/endpoint/programs.py:ToolLoopAgent`)."""

from __future__ import annotations

import json
from typing import Any

from agentrl import AgentEnv

ADD_TOOLS = [
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Submit the final answer.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
]


def addition_tasks(split: str) -> list[dict[str, Any]]:
    offset = 0 if split == "train" else 50
    return [{"id": f"{split}-{i}", "a": i + offset, "b": 2 * i + 1} for i in range(8)]


class ToolLoopAgent(AgentEnv):
    """A plain tool-calling loop with the openai SDK: call, run the tools asked for, repeat."""

    max_turns = 2

    def tasks(self, split: str = "train") -> list[dict[str, Any]]:
        return addition_tasks(split)

    async def run(self, task: dict[str, Any], client: Any) -> float:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You add numbers with the add tool and submit the sum."},
            {"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
        for _ in range(self.max_turns):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=ADD_TOOLS)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                messages.append({"role": "user", "content": "Call a tool."})
                continue
            for call in message.tool_calls:
                args = json.loads(call.function.arguments)
                if call.function.name == "submit":
                    return float(str(args.get("answer", "")).strip() == str(task["a"] + task["b"]))
                output = str(int(args.get("a", 0)) + int(args.get("b", 0))) if call.function.name == "add" \
                    else f"unknown tool {call.function.name}"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        return 0.0


class AgentsSDKAgent(AgentEnv):
    """The OpenAI Agents SDK's agent with a function tool, on agentrl's client (no tracing, offline)."""

    def tasks(self, split: str = "train") -> list[dict[str, Any]]:
        return addition_tasks(split)

    async def run(self, task: dict[str, Any], client: Any) -> float:
        from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
        from agents.exceptions import AgentsException

        set_tracing_disabled(True)

        @function_tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        agent = Agent(name="adder", instructions="Add the numbers with the add tool, then answer with the sum.",
                      tools=[add], model=OpenAIChatCompletionsModel(model="policy", openai_client=client))
        try:
            result = await Runner.run(agent, f"What is {task['a']} + {task['b']}?", max_turns=2)
        except AgentsException:  # too many turns, a call it cannot use: the policy's failure, reward 0
            return 0.0
        return float(str(task["a"] + task["b"]) in str(result.final_output))
