"""The OpenAI-compatible API's bodies as pydantic models: what `rakv serve --http` accepts and answers.

Field names, defaults and shapes follow OpenAI's completions and chat completions APIs (and vLLM's `ignore_eos`
extension), so that the official `openai` client and `vllm bench serve` drive this server as they drive vLLM. A
request is validated here, field by field and before anything is tokenised or reaches the engine: types are strict
(no "5" for 5, no true for 1, no NaN or Infinity), every number is bounded (rakv.serving.http_options: the
temperature, the seed's 64-bit range; `max_tokens` against the context in rakv.serving.http), and a feature this
server does not implement (tools, logit_bias, penalties, suffix, ...) is refused by name instead of
ignored. A violation is a 400 whose body is OpenAI's error shape (`ErrorResponse`) with a one-line message.
docs/serving.md's table of honoured fields is generated from these models (`honoured_fields`).
"""

from __future__ import annotations

import time
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from rakv.runtime.decoding import Sampling
from rakv.serving.http_options import MAX_TEMPERATURE, MIN_TEMPERATURE, SEED_RANGE
from rakv.serving.scoring import MAX_LOGPROBS
from rakv.serving.stops import MAX_STOP_CHARS, MAX_STOPS

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions

TokenId = Annotated[int, Field(strict=True, ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Text = Annotated[str, Field(strict=True, min_length=1)]
Temperature = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=MAX_TEMPERATURE, description=(
    f"0 is greedy; otherwise in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]"))]
TopP = Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0, le=1)]
Seed = Annotated[int, Field(strict=True, ge=SEED_RANGE[0], le=SEED_RANGE[1])]
MaxTokens = Annotated[int, Field(strict=True, ge=1)]
MAX_N = 16  # choices per prompt at most
MAX_PROMPTS = 64  # prompts in one completions request at most
StopText = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_STOP_CHARS)]
Stop = StopText | Annotated[list[StopText], Field(max_length=MAX_STOPS)]

# what a field whose type is a union must be: a failed union's own errors name its members, not the rule
UNION_RULES = {"prompt": f"a non-empty string or a non-empty list of token ids (integers >= 0), or a list of 1 to "
                         f"{MAX_PROMPTS} of either",
               "stop": f"a string or a list of at most {MAX_STOPS} strings, each of 1 to {MAX_STOP_CHARS} characters",
               "content": "a string or a list of {\"type\": \"text\", \"text\": ...} parts"}

# OpenAI fields this server does not implement: refused when given a value other than their no-op default
UNSUPPORTED = ("suffix", "logit_bias", "tools", "tool_choice", "functions", "function_call", "response_format",
               "presence_penalty", "frequency_penalty")
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
    n: Annotated[int, Field(strict=True, ge=1, le=MAX_N)] = 1
    best_of: Literal[1] | None = None
    stop: Stop | None = None
    ignore_eos: StrictBool | None = None  # vLLM's extension: generate exactly max_tokens

    unsupported: ClassVar[tuple[str, ...]] = UNSUPPORTED

    @model_validator(mode="before")
    @classmethod
    def refuse_unsupported(cls, data):
        if isinstance(data, dict):
            for name in cls.unsupported:
                if data.get(name) not in NO_OP:
                    raise ValueError(f"'{name}' is not supported by this server")
        return data

    @model_validator(mode="after")
    def temperature_in_range(self):
        if self.temperature is not None and 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]")
        return self

    def sampling(self, default: Sampling, choice: int = 0) -> Sampling:
        """The sampler of choice `choice` (0..n-1): the request's seed (or the server's) plus `choice`, as vLLM
        seeds the n choices of one request (a greedy request's n choices are the same)."""
        seed = default.seed if self.seed is None else self.seed
        seed = seed + choice if seed + choice <= SEED_RANGE[1] else seed - choice
        return Sampling(temperature=default.temperature if self.temperature is None else self.temperature,
                        top_p=default.top_p if self.top_p is None else self.top_p, seed=seed, verify=default.verify)

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def stops_at_eos(self, ignore_eos: bool) -> bool:
        return not (ignore_eos if self.ignore_eos is None else self.ignore_eos)


class CompletionRequest(SamplingFields):
    """POST /v1/completions: a prompt (a string or token ids) or a list of them; each prompt's n choices, indexed
    prompt by prompt as OpenAI's (choice j of prompt i is index i * n + j)."""

    prompt: Text | TokenIds | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS)] | \
        Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    max_tokens: Annotated[int, Field(strict=True, ge=0)] = DEFAULT_MAX_TOKENS  # 0: with echo only (scoring)
    logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)] | None = None
    echo: StrictBool = False

    @model_validator(mode="after")
    def generates_or_echoes(self):
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens must be at least 1 (0 only with echo: the prompt scored, nothing generated)")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a string or token ids."""
        if isinstance(self.prompt, str) or isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)

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

    logprobs: StrictBool = False
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS)] | None = None

    @model_validator(mode="after")
    def logprobs_whole(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if self.stream and self.logprobs:
            raise ValueError("logprobs are answered whole: not with stream")
        return self

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: MaxTokens | None = None  # the older name; either one
    max_completion_tokens: MaxTokens | None = None

    @property
    def new_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS


class TokenizeRequest(BaseModel):
    """POST /tokenize (vLLM's body): a `prompt`, or chat `messages` rendered by the chat template."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: StrictBool | None = None  # vLLM's defaults: true for a prompt, false for messages
    add_generation_prompt: StrictBool = True
    return_token_strs: StrictBool = False

    @model_validator(mode="after")
    def one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either 'prompt' or 'messages'")
        return self


class DetokenizeRequest(BaseModel):
    """POST /detokenize (vLLM's body): token ids back to text."""

    model_config = ConfigDict(strict=True, extra="ignore")
    model: StrictStr | None = None
    tokens: list[TokenId]


# --- answers ---

class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """OpenAI's completions logprobs: per token, its text, log-probability (None for a prompt's first), top
    alternatives (text -> log-probability; the token itself included, as vLLM) and offset in the choice's text."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None
    stop_reason: str | None = None  # vLLM's: the stop string that ended it


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


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """OpenAI's chat logprobs: per generated token, its text, log-probability, UTF-8 bytes and top alternatives."""

    content: list[TokenLogprob]


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"]
    stop_reason: str | None = None


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
    stop_reason: str | None = None


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


# Every request field the server honours, as docs/serving.md's table shows it (`honoured_fields`; a field of the
# request models missing here fails tests/test_http_fields.py): (request models, its values, what it does)
FIELD_DOCS = {
    "model": ("all", "string", "the served name (`--served-model-name`); another is 404"),
    "prompt": ("completions, tokenize", f"string, token ids, or a list of 1 to {MAX_PROMPTS} of either (completions)",
               "the prompt(s); each prompt's choices follow one another in `choices`"),
    "messages": ("chat, tokenize", "list of {role, content}", "rendered by the model's chat template"),
    "max_tokens": ("completions, chat", "integer >= 1 (completions: 0 with `echo`)",
                   "tokens to generate at most (completions' default 16); 0 with `echo`: the prompt scored only"),
    "max_completion_tokens": ("chat", "integer >= 1", "the newer name of `max_tokens`"),
    "temperature": ("completions, chat", f"0 or [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]",
                    "0: greedy; absent: the server's `--temperature`"),
    "top_p": ("completions, chat", "(0, 1]", "nucleus sampling"),
    "seed": ("completions, chat", "64-bit integer", "the sampler's seed; choice j of `n` gets seed + j (as vLLM)"),
    "stream": ("completions, chat", "boolean", "server-sent events, one chunk per iteration that confirmed text"),
    "stream_options": ("completions, chat", "{include_usage: boolean}", "the usage in a last chunk"),
    "n": ("completions, chat", f"1 to {MAX_N}", "choices per prompt, when sampling (greedy: 400, as vLLM refuses it)"),
    "best_of": ("completions, chat", "1 or null", "accepted as 1 only"),
    "stop": ("completions, chat", f"string or up to {MAX_STOPS} strings of 1 to {MAX_STOP_CHARS} characters",
             "the output ends where the first stop begins (excluded), checked as tokens are confirmed; "
             "finish_reason `stop`, `stop_reason` the string"),
    "ignore_eos": ("completions, chat", "boolean", "vLLM's extension: generate exactly `max_tokens`"),
    "logprobs": ("completions, chat", f"completions: 0 to {MAX_LOGPROBS}; chat: boolean",
                 "each token's log-probability under the target (one fp32 forward) and (completions) this many "
                 "alternatives; completions with `stream`: each chunk those of its tokens (chat: not with `stream`)"),
    "top_logprobs": ("chat", f"0 to {MAX_LOGPROBS}", "with `logprobs`: this many alternatives per token"),
    "echo": ("completions", "boolean", "the prompt's text before the output (with `logprobs`: its log-probabilities "
                                       "too, the first null); with `stream`: in each choice's first chunk"),
    "add_special_tokens": ("tokenize", "boolean", "as vLLM's: default true for a prompt, false for messages"),
    "add_generation_prompt": ("tokenize", "boolean", "messages: the assistant's turn opened (default true)"),
    "return_token_strs": ("tokenize", "boolean", "also each token as the tokenizer spells it"),
    "tokens": ("detokenize", "token ids", "back to text"),
}


def honoured_fields() -> str:
    """docs/serving.md's table of the request fields the server honours (from the models and FIELD_DOCS)."""
    names = [name for model in (CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest)
             for name in model.model_fields]
    missing = [name for name in dict.fromkeys(names) if name not in FIELD_DOCS]
    if missing:
        raise ValueError(f"protocol.FIELD_DOCS has no line for {', '.join(missing)}")
    rows = ["| field | requests | values | what it does |", "|---|---|---|---|"]
    rows += [f"| `{name}` | {where} | {values} | {what} |" for name, (where, values, what) in FIELD_DOCS.items()
             if name in names]
    refused = ", ".join(f"`{name}`" for name in UNSUPPORTED)
    return "\n".join(rows) + f"\n\nRefused by name (400) rather than ignored: {refused}."


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""

    error: ErrorInfo


ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 408: "RequestTimeoutError",
               413: "RequestTooLargeError", 422: "UnprocessableEntityError", 429: "RateLimitError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """The JSON of an error answer: one line of message."""
    line = " ".join(message.split()) or "error"
    return ErrorResponse(error=ErrorInfo(message=line, type=ERROR_TYPES.get(status, "Error"), param=param,
                                         code=status)).model_dump()
