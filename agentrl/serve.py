"""`agentrl serve RUN_DIR_OR_MODEL`: the policy endpoint without training, so a user evaluates a
model or a trained checkpoint with their own harness (issue 54).

    agentrl serve runs/code-smollm2-135m-20250101-120000 --port 8000
    # → agentrl serve: runs/... at http://127.0.0.1:8000/v1 (loopback only; Ctrl-C stops)

The same OpenAI-compatible server that training gives agent programs (agentrl/endpoint/), on
127.0.0.1 only, with the configured engine (`engine.kind`: hf or vllm). Serve mode records nothing
and needs no episode key: any API key is accepted (only this machine can reach the port), and a
request's temperature, top_p, max_tokens (up to `sampling.max_tokens`) and seed are used as given.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentrl.config import Config
from agentrl.endpoint import PolicyEndpoint
from agentrl.evaluate import load_checkpoint
from agentrl.inference import make_engine
from agentrl.inference.base import SamplingParams
from agentrl.models import load_tokenizer, resolve_configured, use_chat_template


async def serve(cfg: Config, checkpoint: Path | None, name: str, port: int) -> None:
    """Serve until cancelled (Ctrl-C), then stop listening and close the engine."""
    engine = make_engine(cfg)
    try:
        if checkpoint is not None:
            await load_checkpoint(engine, cfg, checkpoint)
        tokenizer = use_chat_template(load_tokenizer(resolve_configured(cfg.model)), cfg.model)
        sampling = SamplingParams(temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                                  max_tokens=cfg.sampling.max_tokens)
        endpoint = PolicyEndpoint(engine, tokenizer, model_name=name, sampling=sampling, require_key=False,
                                  max_context_tokens=cfg.rollout.max_context_tokens, port=port)
        await endpoint.start()
        try:
            print(f"agentrl serve: {name} at {endpoint.url} (loopback only; Ctrl-C stops)", flush=True)
            await asyncio.Event().wait()
        finally:
            await endpoint.stop()
    finally:
        await engine.close()


def main(cfg: Config, checkpoint: Path | None, target: str, port: int = 8000) -> int:
    """`agentrl serve`, once `plan.resolve_target` has resolved its target."""
    try:
        asyncio.run(serve(cfg, checkpoint, Path(target).name or target, port))
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped: not a failure
        print("agentrl serve: stopped", flush=True)
    return 0
