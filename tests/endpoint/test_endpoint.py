"""The policy endpoint with the real openai SDK against the real hf engine (embedded SmolLM2-135M):
what a completion records, the OpenAI wire format, refusals and version pinning (issue 54)."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import openai
import pytest

from agentrl.endpoint import PolicyEndpoint
from agentrl.endpoint.conversation import Conversation, tools_from_specs
from agentrl.inference.base import SamplingParams
from agentrl.parsing import get_parser
from agentrl.rollout.tokens import ChatTokens

from .programs import ADD_TOOLS


def client_for(episode) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=episode.base_url, api_key=episode.key, max_retries=0)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_a_chat_completion_records_prompt_sample_logprobs_and_version(hf_engine) -> None:
    async with PolicyEndpoint(hf_engine, hf_engine.tokenizer, sampling=SamplingParams(max_tokens=12)) as endpoint:
        assert endpoint.url.startswith("http://127.0.0.1:")
        episode = endpoint.open_episode(seed=5)
        client = client_for(episode)
        messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "2 + 3?"}]
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=ADD_TOOLS, n=2,
                                                     logprobs=True, max_tokens=8, temperature=0.9, top_p=0.95)
        assert [m.id for m in (await client.models.list()).data] == ["policy"]
        await client.close()

    assert len(reply.choices) == 2 and len(episode.samples) == 2
    chat = ChatTokens(hf_engine.tokenizer)
    described = get_parser("hermes").format_tools(tools_from_specs(ADD_TOOLS))
    rendered = [{"role": "system", "content": f"You add numbers.\n\n{described}"}, messages[1]]
    for choice, sample in zip(reply.choices, episode.samples):
        assert sample.prompt_ids == chat.prompt(rendered) + chat.generation_prompt(rendered)
        assert 1 <= len(sample.completion_ids) <= 8 and sample.version == hf_engine.version == 0
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx(sample.logprobs)
        assert "".join(t.token for t in choice.logprobs.content) == chat.decode(sample.completion_ids)
        assert reply.usage.prompt_tokens == len(sample.prompt_ids)
    assert not listening(endpoint.port)  # stopped: nothing left listening


async def test_streaming_and_the_completions_api(hf_engine) -> None:
    async with PolicyEndpoint(hf_engine, hf_engine.tokenizer, sampling=SamplingParams(max_tokens=10)) as endpoint:
        episode = endpoint.open_episode(seed=1)
        client = client_for(episode)
        stream = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Say hi."}], stream=True,
            stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == episode.samples[0].text
        assert chunks[-1].usage.completion_tokens == len(episode.samples[0].completion_ids)
        done = await client.completions.create(model="policy", prompt="The capital of France is", max_tokens=5,
                                               logprobs=0, stop=["\n"])
        await client.close()
    sample = episode.samples[1]
    assert sample.prompt_ids == hf_engine.tokenizer.encode("The capital of France is", add_special_tokens=False)
    assert done.choices[0].logprobs.token_logprobs == pytest.approx(sample.logprobs)
    assert done.choices[0].text == ChatTokens(hf_engine.tokenizer).decode(sample.completion_ids)


async def test_requests_without_an_episode_key_are_refused_and_malformed_ones_get_a_clear_400(hf_engine) -> None:
    async with PolicyEndpoint(hf_engine, hf_engine.tokenizer, sampling=SamplingParams(max_tokens=4)) as endpoint:
        episode = endpoint.open_episode()
        user = [{"role": "user", "content": "hi"}]
        for key in ("not-an-episode", ""):
            stranger = openai.AsyncOpenAI(base_url=endpoint.url, api_key=key or "x", max_retries=0)
            with pytest.raises(openai.AuthenticationError, match="names no open agentrl episode"):
                await stranger.chat.completions.create(model="policy", messages=user)
            await stranger.close()
        async with httpx.AsyncClient() as http:  # no Authorization header at all
            r = await http.post(f"{endpoint.url}/chat/completions", json={"messages": user})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            r = await http.post(f"{episode.base_url}/chat/completions", content=b"{not json")
            assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        client = client_for(episode)
        bad = [({"messages": []}, "'messages' must be a non-empty list"),
               ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role must be one of"),
               ({"messages": user, "temperature": 7}, "'temperature' must be a number in [0, 2]"),
               ({"messages": user, "n": 99}, "'n' must be at most 16"),
               ({"messages": user, "tools": [{"type": "function"}]}, "tools[0] must be"),
               ({"messages": user, "top_logprobs": 3}, "'top_logprobs' is not supported"),
               ({"messages": [{"role": "user", "content": "x" * 40000}]}, "the context limit is")]
        for body, message in bad:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.chat.completions.create(model="policy", **body)
            assert message in caught.value.body["message"], caught.value.body
        await client.close()
    assert episode.samples == []


async def test_a_request_started_under_version_v_is_recorded_as_v_when_a_push_lands_meanwhile(hf_engine) -> None:
    weights = {k: v.clone() for k, v in hf_engine.model.state_dict().items()}
    async with PolicyEndpoint(hf_engine, hf_engine.tokenizer, sampling=SamplingParams(max_tokens=48)) as endpoint:
        episode = endpoint.open_episode(seed=3)
        client = client_for(episode)
        first = asyncio.ensure_future(client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "Tell me a long story."}]))
        while hf_engine._batch is None:  # the request is generating under version 0
            await asyncio.sleep(0.005)
        await hf_engine.load_weights(weights, 7)  # waits for running rows, then swaps
        await first
        second = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Hi"}])
        await client.close()
    assert second.choices and [s.version for s in episode.samples] == [0, 7]


def test_tool_calls_are_read_by_agentrl_parsers_and_map_back_to_the_sampled_text(smollm2_path) -> None:
    from agentrl.models import load_tokenizer
    from agentrl.rollout.stepwise import Sample

    chat = ChatTokens(load_tokenizer(smollm2_path))
    conversation = Conversation(chat, get_parser("hermes"))
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    tools = tools_from_specs(ADD_TOOLS)
    context = conversation.messages([{"role": "user", "content": "2 + 3?"}], tools)
    prompt = conversation.prompt_ids(context, {})
    completion_ids = [*chat.encode(text), chat.eos_token_ids[0]]
    completion = conversation.record(context, {}, Sample(prompt, completion_ids, [0.0] * len(completion_ids), 0,
                                                         text=text), parse_tools=True)
    assert completion.content == "Let me add."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in completion.tool_calls] == \
        [("add", {"a": 2, "b": 3})]
    # The program sends it back (arguments re-serialized, ids kept) with the tool's result: the next
    # prompt is the first prompt and the sampled tokens, extended by the template's tokens.
    echoed = {"role": "assistant", "content": "Let me add. ", "tool_calls": [
        {"id": completion.tool_calls[0]["id"], "type": "function",
         "function": {"name": "add", "arguments": '{"b": 3, "a": 2}'}}]}
    following = conversation.messages([{"role": "user", "content": "2 + 3?"}, echoed,
                                       {"role": "tool", "tool_call_id": "x", "content": "5"}], tools)
    ids = conversation.prompt_ids(following, {})
    assert ids[: len(prompt) + len(completion_ids)] == prompt + completion_ids
    assert chat.decode(ids) == chat.render(following, generation_prompt=True)
