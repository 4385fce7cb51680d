"""A verifiers (v1) environment written with its public API, for `agentrl ... --env verifiers:vf_addition`:
inline addition tasks (no hub, no network), a reward on the trace, and its own harness, a chat loop that
calls the model through the OpenAI SDK at the endpoint verifiers hands it."""

from __future__ import annotations

import openai
import verifiers.v1 as vf


class AdditionData(vf.TaskData):
    answer: int


class AdditionTask(vf.Task[AdditionData]):
    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return float(str(self.data.answer) in (trace.last_reply or ""))


class AdditionConfig(vf.TasksetConfig):
    split: str = "train"
    num_tasks: int = 6


class AdditionTaskset(vf.Taskset[AdditionTask, AdditionConfig]):
    def load(self) -> list[AdditionTask]:
        offset = 0 if self.config.split == "train" else 100
        return [AdditionTask(AdditionData(idx=i, prompt=f"What is {i + offset} + {i}?", answer=2 * i + offset,
                                          system_prompt="Answer with the number only."), self.config.task)
                for i in range(self.config.num_tasks)]


class ChatLoopHarness(vf.Harness[vf.HarnessConfig]):
    """One chat completion on the task's prompt, in-process: nothing to install in a runtime."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = False
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def setup(self, runtime: vf.Runtime) -> None:
        pass

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_) -> vf.ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        async with openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            reply = await client.chat.completions.create(model=ctx.model, messages=messages)
        return vf.ProgramResult(exit_code=0, stdout=reply.choices[0].message.content or "", stderr="")


__all__ = ["AdditionTaskset", "ChatLoopHarness"]
