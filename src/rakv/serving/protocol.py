"""The OpenAI-compatible API's bodies as pydantic models: what `rakv serve --http` accepts and answers.

Field names, defaults and shapes follow OpenAI's completions and chat completions APIs (and vLLM's `ignore_eos`
extension), so that the official `openai` client and `vllm bench serve` drive this server as they drive vLLM. A
request is validated here, field by field and before anything is tokenised or reaches the engine: types are strict
(no "5" for 5, no true for 1, no NaN or Infinity), every number is bounded (rakv.serving.http_options: the
temperature, the seed's 64-bit range; `max_tokens` against the context in rakv.serving.http), and a feature this
server does not implement (`stop`, `logprobs`, `n` > 1, tools, ...) is refused by name instead of ignored. A
violation is a 400 whose body is OpenAI's error shape (`ErrorResponse`) with a one-line message.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from rakv.runtime.decoding import Sampling
from rakv.serving.http_options import MAX_TEMPERATURE, MIN_TEMPERATURE, SEED_RANGE

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions

TokenId = Annotated[int, Field(strict=True, ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Text = Annotated[str, Field(strict=True, min_length=1)]
Temperature = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=MAX_TEMPERATURE, description=(
    f"0 is greedy; otherwise in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]"))]
TopP = Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0, le=1)]
Seed = Annotated[int, Field(strict=True, ge=SEED_RANGE[0], le=SEED_RANGE[1])]
MaxTokens = Annotated[int, Field(strict=True, ge=1)]

# what a field whose type is a union must be: a failed union's own errors name its members, not the rule
UNION_RULES = {"prompt": "a non-empty string or a non-empty list of token ids (integers >= 0), or a list of one of "
                         "either",
               "content": "a string or a list of {\"type\": \"text\", \"text\": ...} parts"}

# OpenAI fields this server does not implement: refused when given a value other than their no-op default
UNSUPPORTED = ("stop", "logprobs", "top_logprobs", "suffix", "logit_bias", "echo", "tools", "tool_choice",
               "functions", "function_call", "response_format", "presence_penalty", "frequency_penalty")
NO_OP = (None, [], {}, 0, 0.0, False, "", "none", "auto", {"type": "text"})


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """What completions and chat completions share: the sampler, the stream, the stopping rule, and the checks."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: StrictStr | None = None
    temperature: Temperature | None = None  # absent: the server's --temperature
    top_p: TopP | None = None
    seed: Seed | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1
    best_of: Literal[1] | None = None
    ignore_eos: StrictBool | None = None  # vLLM's extension: generate exactly max_tokens

    @model_validator(mode="before")
    @classmethod
    def refuse_unsupported(cls, data):
        if isinstance(data, dict):
            for name in UNSUPPORTED:
                if data.get(name) not in NO_OP:
                    raise ValueError(f"'{name}' is not supported by this server")
        return data

    @model_validator(mode="after")
    def temperature_in_range(self):
        if self.temperature is not None and 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]")
        return self

    def sampling(self, default: Sampling) -> Sampling:
        return Sampling(temperature=default.temperature if self.temperature is None else self.temperature,
                        top_p=default.top_p if self.top_p is None else self.top_p,
                        seed=default.seed if self.seed is None else self.seed, verify=default.verify)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def stops_at_eos(self, ignore_eos: bool) -> bool:
        return not (ignore_eos if self.ignore_eos is None else self.ignore_eos)


class CompletionRequest(SamplingFields):
    """POST /v1/completions: one prompt (a string or token ids; a batch of one is taken as its prompt)."""

    prompt: Text | TokenIds | Annotated[list[Text], Field(min_length=1, max_length=1)] | \
        Annotated[list[TokenIds], Field(min_length=1, max_length=1)]
    max_tokens: MaxTokens = DEFAULT_MAX_TOKENS

    @model_validator(mode="after")
    def one_prompt(self):
        if isinstance(self.prompt, list) and isinstance(self.prompt[0], (str, list)):  # a batch of one: its prompt
            self.prompt = self.prompt[0]
        return self

    @property
    def new_tokens(self) -> int:
        return self.max_tokens


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions: the messages, rendered by the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: MaxTokens | None = None  # the older name; either one
    max_completion_tokens: MaxTokens | None = None

    @property
    def new_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS


# --- answers ---

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: Literal["stop", "length", "abort"] | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Literal["stop", "length", "abort"]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "rakv"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "draining", "stopped"]
    reason: str | None = None


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""

    error: ErrorInfo


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 408: "RequestTimeoutError",
               413: "RequestTooLargeError", 422: "UnprocessableEntityError", 429: "RateLimitError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """The JSON of an error answer: one line of message."""
    line = " ".join(message.split()) or "error"
    return ErrorResponse(error=ErrorInfo(message=line, type=ERROR_TYPES.get(status, "Error"), param=param,
                                         code=status)).model_dump()
