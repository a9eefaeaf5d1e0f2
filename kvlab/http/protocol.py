"""The OpenAI wire format kvlab's server speaks: request checks, error bodies, response and chunk shapes.

Every check runs before a request reaches the engine, and each failure is an `APIError` rendered as OpenAI renders it:
`{"error": {"message", "type", "param", "code"}}` with status 400 (bad input: malformed or too deeply nested JSON, text
that is not valid Unicode, a bad field), 404 (unknown model — OpenAI answers 404 `model_not_found`), 429 (queue full,
with `Retry-After`) or 503 (engine stopped, with `Retry-After`). The server's own guards (`kvlab.http.guard`) add 401,
408, 413 and 415.

Temperature: in [0, 2] as OpenAI allows; one above 0 but below `kvlab.sampling.MIN_TEMPERATURE` is raised to that
floor, as vLLM does, and the request carries a warning saying so (logged, and sent back in the `X-Kvlab-Warning`
header).

Chat template. kvlab's tiny models are byte-level and have no chat format of their own, so messages become plain text,
one block per message and an open assistant block at the end:

    <|system|>\\nYou are terse.\\n<|user|>\\nHi!\\n<|assistant|>\\n

(one token per byte with `ByteTokenizer`). A checkpoint whose transformers
tokenizer has a `chat_template` uses that template instead.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from kvlab.sampling import MIN_TEMPERATURE

ROLES = ("system", "developer", "user", "assistant")
DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default, used for chat too (tiny CPU models)
# Fields kvlab does not implement: refused unless they hold their default (None, or the value given).
UNSUPPORTED_UNLESS = {"n": 1, "best_of": 1, "echo": False, "suffix": None, "logprobs": None, "top_logprobs": None,
                      "stop": None, "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None,
                      "tools": None, "response_format": None}


class APIError(Exception):
    """An error answered to the client in OpenAI's shape."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 type_: str = "invalid_request_error", headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.type = status, message, code, param, type_
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class CompletionRequest:
    """One checked request: the prompt as token ids and how to sample its answer."""

    model: str
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    temperature: float
    top_p: float | None
    top_k: int | None
    seed: int | None
    ignore_eos: bool
    chat: bool
    warnings: list[str] = field(default_factory=list)  # what was changed to serve it (logged, sent as a header)


def chat_template_text(messages: list[dict]) -> str:
    """kvlab's plain-text chat template (see the module docstring)."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def _unicode(text: str, param: str) -> str:
    """`text` if it can be encoded as UTF-8; a lone surrogate (JSON `"\\ud800"`) cannot: 400 naming where it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(400, f"{param} is not valid Unicode: a lone surrogate {text[e.start]!r} at character "
                            f"{e.start}; send real characters (a surrogate pair, or the character itself)",
                       "invalid_unicode", param) from None
    return text


def _message_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return _unicode(content, f"messages[{i}].content")
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise APIError(400, f"messages[{i}].content: only text parts are supported, got {part!r:.80}",
                               "invalid_message", f"messages[{i}].content")
            texts.append(_unicode(part["text"], f"messages[{i}].content"))
        return "".join(texts)
    raise APIError(400, f"messages[{i}].content must be a string or a list of text parts, got "
                        f"{type(content).__name__}", "invalid_message", f"messages[{i}].content")


def chat_prompt_ids(messages: Any, tokenizer) -> list[int]:
    """Token ids of `messages` under the chat template (the checkpoint's own if it has one)."""
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", "invalid_message",
                       "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise APIError(400, f"messages[{i}] needs a role and a content, got {m!r:.80}", "invalid_message",
                           f"messages[{i}]")
        if m["role"] not in ROLES:
            raise APIError(400, f"messages[{i}].role {m['role']!r} is not one of {ROLES}", "invalid_message",
                           f"messages[{i}].role")
        role = "system" if m["role"] == "developer" else m["role"]
        clean.append({"role": role, "content": _message_text(m["content"], i)})
    hf = getattr(tokenizer, "hf", None)
    if hf is not None and getattr(hf, "chat_template", None):
        return list(hf.apply_chat_template(clean, add_generation_prompt=True, tokenize=True))
    return tokenizer.encode(chat_template_text(clean))


def completion_prompt_ids(prompt: Any, tokenizer, vocab_size: int) -> list[int]:
    """Token ids of a completions `prompt`: a string, or a list of token ids (one prompt per request)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # ["text"] or [[ids]]: a batch of one
    if isinstance(prompt, str):
        ids = tokenizer.encode(_unicode(prompt, "prompt"))
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < vocab_size]
        if bad:
            raise APIError(400, f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
                           "invalid_prompt", "prompt")
        ids = list(prompt)
    elif isinstance(prompt, list):
        raise APIError(400, "batched prompts are not supported: send one prompt (a string or a list of token ids) "
                            "per request", "invalid_prompt", "prompt")
    else:
        raise APIError(400, f"prompt must be a string or a list of token ids, got {type(prompt).__name__}",
                       "invalid_prompt", "prompt")
    if not ids:
        raise APIError(400, "prompt is empty: give at least one token", "invalid_prompt", "prompt")
    return ids


def _number(body: dict, name: str, default, lo: float, hi: float, integer: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not lo <= value <= hi:
        what = "an integer" if integer else "a number"
        raise APIError(400, f"{name} must be {what} in [{lo}, {hi}], got {value!r}", f"invalid_{name}", name)
    return value


def parse_request(raw: bytes, chat: bool, *, served_model: str, tokenizer, vocab_size: int,
                  max_model_len: int) -> CompletionRequest:
    """Check a `/v1/completions` (or chat) body; raise APIError naming what is wrong."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON ({e}); send a JSON object", "invalid_json") from None
    except RecursionError:
        raise APIError(400, "the request body is JSON nested too deeply to read; send a flat request object",
                       "invalid_json") from None
    try:
        return _parse_body(body, chat, served_model, tokenizer, vocab_size, max_model_len)
    except RecursionError:  # a deeply nested field (a prompt of lists of lists ...)
        raise APIError(400, "a field of the request is nested too deeply; send plain values", "invalid_json") from None


def _parse_body(body: Any, chat: bool, served_model: str, tokenizer, vocab_size: int,
                max_model_len: int) -> CompletionRequest:
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}", "invalid_json")
    field = "messages" if chat else "prompt"
    missing = [k for k in ("model", field) if k not in body]
    if missing:
        raise APIError(400, f"missing required field(s): {', '.join(missing)}", "missing_field", missing[0])
    if body["model"] != served_model:
        raise APIError(404, f"The model `{body['model']}` does not exist; this server serves `{served_model}` "
                            "(see GET /v1/models)", "model_not_found", "model")
    for name, default in UNSUPPORTED_UNLESS.items():
        value = body.get(name)
        if value is not None and value != default and value != [] and value is not False:
            raise APIError(400, f"{name}={value!r:.60} is not supported by kvlab serve; leave it out",
                           "unsupported_parameter", name)
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise APIError(400, f"stream must be true or false, got {stream!r}", "invalid_stream", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError(400, "stream_options must be an object like {\"include_usage\": true}",
                       "invalid_stream_options", "stream_options")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise APIError(400, f"ignore_eos must be true or false, got {ignore_eos!r}", "invalid_ignore_eos",
                       "ignore_eos")
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = DEFAULT_MAX_TOKENS if body.get(name) is None else body[name]
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise APIError(400, f"{name} must be an integer >= 1, got {max_tokens!r}", f"invalid_{name}", name)
    if max_tokens >= max_model_len:
        raise APIError(400, f"{name}={max_tokens} leaves no room for a prompt in this model's context of "
                            f"{max_model_len} tokens; ask for at most {max_model_len - 1}",
                       "context_length_exceeded", name)
    ids = (chat_prompt_ids(body["messages"], tokenizer) if chat
           else completion_prompt_ids(body["prompt"], tokenizer, vocab_size))
    if len(ids) >= max_model_len:
        raise APIError(400, f"the prompt is {len(ids)} tokens, longer than this model's context of {max_model_len} "
                            "tokens can hold with an answer; shorten it", "prompt_too_long", field)
    if len(ids) + max_tokens > max_model_len:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                            f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} for the "
                            f"completion); lower {name} to at most {max_model_len - len(ids)}",
                       "context_length_exceeded", name)
    temperature, warnings = _number(body, "temperature", 1.0, 0.0, 2.0), []
    if 0 < temperature < MIN_TEMPERATURE:
        warnings.append(f"temperature {temperature!r} is below {MIN_TEMPERATURE}, where dividing the logits "
                        f"overflows; it was raised to {MIN_TEMPERATURE} (use 0 for greedy decoding)")
        temperature = MIN_TEMPERATURE
    return CompletionRequest(
        model=served_model, prompt_ids=ids, max_tokens=max_tokens, stream=bool(stream),
        include_usage=bool(options.get("include_usage")), temperature=temperature, warnings=warnings,
        top_p=_number(body, "top_p", None, 1e-9, 1.0), top_k=_number(body, "top_k", None, 1, 10**9, integer=True),
        seed=_number(body, "seed", None, 0, 2**63 - 1, integer=True), ignore_eos=ignore_eos, chat=chat)


# -- what goes back --------------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class ResponseShape:
    """Builds the JSON of one request's answer: chunks while streaming, or the whole response."""

    def __init__(self, response_id: str, model: str, chat: bool) -> None:
        self.id, self.model, self.chat = response_id, model, chat
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    def _head(self, chunk: bool) -> dict:
        kind = self.object + ".chunk" if self.chat and chunk else self.object
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def role_chunk(self) -> dict:
        return {**self._head(True), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]}

    def chunk(self, text: str, finish_reason: str | None) -> dict:
        body: dict = {"delta": {"content": text}} if self.chat else {"text": text}
        return {**self._head(True), "choices": [{"index": 0, **body, "logprobs": None, "finish_reason": finish_reason}]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._head(True), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}

    def response(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        body: dict = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        choice = {"index": 0, **body, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head(False), "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
