"""The README example: a complete agentrl environment in one file.

    agentrl env check examples.my_env:AddEnv
"""

from agentrl import ToolEnv, register
from agentrl.tools import submit, tool


@tool
def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return str(a + b)


class AddEnv(ToolEnv):
    tools = (add, submit)
    max_turns = 4

    def tasks(self, split="train"):
        return [{"id": str(i), "a": i, "b": 7 * i + 3} for i in range(20)]

    def user_prompt(self, task):
        return f"What is {task['a']} + {task['b']}? Use the add tool, then submit the answer."

    async def reward(self, task, state):
        return float(state.get("answer") == str(task["a"] + task["b"]))


register("add", AddEnv)
