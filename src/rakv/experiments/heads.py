"""The heads stage: learned heads (rakv.runtime.heads) trained by self-distillation on the target's own choices,
seeded, cached by content, and installed where the proposer finds them (docs/heads.md).

`./reproduce.sh stages=heads [heads=tiny] [heads.seed=1 heads.paragraphs=1600 ...]` composes conf/heads.yaml (the
settings: conf/heads/<pair>.yaml), computes the set's key (the target's fingerprint, the texts' digest, the
settings, rakv.runtime.heads.heads_key) and then: the shipped set (data/heads/<pair>/) has that key -> nothing to do;
the cache (<derived files>/heads/<key>/) has it -> installed from there; else trained, cached and installed. The
data (WikiText-2 paragraphs, the bundled validation split by default: the test split stays held out for the
measurements, scripts/bench_heads.py; or Python code, `heads.dataset=python`: the functions and classes of the
interpreter's standard library or of a folder, `heads.source=DIR`; or a mixture in equal shares,
`heads.dataset=wikitext2+python`), of two kinds that mix: `prompts` paragraphs' first `prompt_tokens` tokens
continued greedily by the target (one forward per token), where head i learns, from the hidden state that produced
continuation token j, token j+i; and `paragraphs` paragraphs read teacher-forced (one prefill each), where head i's
label at position t is the target's own argmax at position t+i (with `consistent`, only where the text's tokens in
between are the target's own choices, so that the label is what its greedy continuation would give).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import shutil
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from rakv.runtime.compact import Segment
from rakv.runtime.decoding import forward_rows
from rakv.runtime.errors import RakvError
from rakv.runtime.heads import (
    Heads,
    HeadsRecord,
    HeadsSettings,
    data_origin,
    head_logits,
    heads_key,
    input_rows,
    output_rows,
    read_heads_record,
    save_heads,
    target_identity,
)
from rakv.runtime.kernels import new_kv_cache
from rakv.runtime.models import derived_files_dir
from rakv.runtime.run_layout import HeadsLayout
from rakv.runtime.workloads import dataset_texts

GENERATION_BATCH = 16  # prompts continued together (one batched forward per token: rakv.runtime.decoding)


def training_texts(encode, settings: HeadsSettings) -> tuple[list[list[int]], list[list[int]]]:
    """The split's paragraphs in a seeded order, each used once: the first `prompts` of `prompt_tokens` tokens or
    more, cut to those (continued greedily), and the first `paragraphs` of the others of `heads` + 2 tokens or more,
    cut to `paragraph_tokens` (read teacher-forced)."""
    prompts, paragraphs = [], []
    for ids in mixed_texts(encode, settings):
        if len(prompts) < settings.prompts and len(ids) >= settings.prompt_tokens:
            prompts.append(ids[:settings.prompt_tokens])
        elif len(paragraphs) < settings.paragraphs and len(ids) >= settings.heads + 2:
            paragraphs.append(ids[:settings.paragraph_tokens])
    if len(prompts) < settings.prompts or len(paragraphs) < settings.paragraphs:
        raise RakvError(f"heads: {settings.dataset}/{settings.split} has {len(prompts)} paragraphs of "
                        f"{settings.prompt_tokens} tokens or more and {len(paragraphs)} others, fewer than the "
                        f"{settings.prompts} prompts and {settings.paragraphs} paragraphs asked for")
    return prompts, paragraphs


def mixed_texts(encode, settings: HeadsSettings) -> list[list[int]]:
    """The texts of `settings.dataset` encoded, in a seeded order; a mixture (`wikitext2+python`: each named dataset
    with the same `source` and `split`) takes one text of each in turn, each dataset in its own seeded order, so the
    mixture holds equal shares whatever the datasets' sizes (until the smaller runs out)."""
    orders = []
    for name in settings.dataset.split("+"):
        encoded = [encode(text) for _, text in dataset_texts(name, settings.source, settings.split)]
        random.Random(settings.seed).shuffle(encoded)
        orders.append(encoded)
    return [ids for group in itertools.zip_longest(*orders) for ids in group if ids is not None]


def training_prompts(encode, settings: HeadsSettings) -> list[list[int]]:
    """The prompts continued greedily (training_texts' first part)."""
    return training_texts(encode, settings)[0]


def data_digest(prompts: list[list[int]], paragraphs: list[list[int]] | None = None) -> str:
    blob = prompts if not paragraphs else {"prompts": prompts, "paragraphs": paragraphs}
    return hashlib.sha256(json.dumps(blob).encode()).hexdigest()[:20]


@torch.inference_mode()
def continuations(pair, prompts: list[list[int]], new_tokens: int, log=None) -> list[tuple[torch.Tensor, list[int]]]:
    """Per prompt, the target's greedy continuation (stopped after an end of sequence) and the hidden states that
    produced each of its tokens ([n, d]: row j is the hidden state whose output head gave token j)."""
    target, device, eos = pair.target.module, pair.device, pair.eos_token_id
    out = []
    for start in range(0, len(prompts), GENERATION_BATCH):
        group = prompts[start:start + GENERATION_BATCH]
        caches = [new_kv_cache(target) for _ in group]
        tokens: list[list[int]] = [[] for _ in group]
        hiddens: list[list[torch.Tensor]] = [[] for _ in group]
        feeds = [list(p) for p in group]
        alive = list(range(len(group)))
        for _ in range(new_tokens):
            segments = [Segment(torch.tensor(feeds[i], dtype=torch.long, device=device), caches[i], 1) for i in alive]
            logits, hidden = forward_rows(target, segments, return_hidden=True)
            for i, row, h in zip(alive, logits, hidden):
                token = int(row[-1].argmax())
                tokens[i].append(token)
                hiddens[i].append(h[-1].float().cpu())
                feeds[i] = [token]
            alive = [i for i in alive if tokens[i][-1] != eos]
            if not alive:
                break
        out.extend((torch.stack(h), t) for h, t in zip(hiddens, tokens))
        if log is not None:
            log(f"heads: continued {len(out)}/{len(prompts)} prompts")
    return out


def continuation_labels(tokens: list[int], heads: int) -> torch.Tensor:
    """[len, heads] token ids: head i's label at the hidden state that produced token j is token j+i (-1: past the
    continuation's end)."""
    n = len(tokens)
    return torch.tensor([[tokens[j + i] if j + i < n else -1 for i in range(1, heads + 1)] for j in range(n)],
                        dtype=torch.long).reshape(n, heads)


@torch.inference_mode()
def teacher_forced(pair, paragraphs: list[list[int]], heads: int, consistent: bool, token: bool = False,
                   log=None) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per paragraph, one prefill: hidden states [m, d], the text's token after each position [m] (what the hidden
    state is followed by: the token heads with `token` read) and labels [m, heads] (token ids, -1: none). With a_t the
    target's argmax at position t (its choice of token t+1 given the real text), head i's label at position t is
    a_{t+i}; with `consistent`, only where the text's tokens in between are the target's own choices, so that the
    label is what the target's greedy continuation would give there, as at decoding time: tokens t+1..t+i for heads
    that read h_t alone, tokens t+2..t+i for heads that also read token t+1 (they are told which token followed, so
    head 1 learns the target's next choice after any token, as after a sampled or corrected one). Positions without
    any label are dropped."""
    target, device = pair.target.module, pair.device
    out = []
    group_size = max(1, GENERATION_BATCH // 4)  # every row's logits come back: keep a group's memory small
    for start in range(0, len(paragraphs), group_size):
        group = paragraphs[start:start + group_size]
        segments = [Segment(torch.tensor(p, dtype=torch.long, device=device), new_kv_cache(target), 0)
                    for p in group]
        logits, hidden = forward_rows(target, segments, return_hidden=True)
        for ids, rows, h in zip(group, logits, hidden):
            choice = rows.argmax(-1).cpu()  # choice[t]: the target's token t+1
            text = torch.tensor(ids, dtype=torch.long)
            n = len(ids)
            agrees = torch.cat([choice[:-1] == text[1:], torch.zeros(1, dtype=torch.bool)])  # agrees[t]: a_t = x_t+1
            labels = torch.full((n, heads), -1, dtype=torch.long)
            run = torch.ones(n, dtype=torch.bool)
            for i in range(1, heads + 1):
                if consistent and (i > 1 or not token):  # run[t]: agrees[t..t+i-1] (with token: [t+1..t+i-1])
                    run = run & torch.cat([agrees[i - 1:], torch.zeros(i - 1, dtype=torch.bool)])
                if n > i:
                    valid = run[:n - i]
                    labels[:n - i, i - 1] = torch.where(valid, choice[i:], torch.full_like(choice[i:], -1))
            following = torch.cat([text[1:], torch.full((1,), -1, dtype=torch.long)])
            keep = (labels >= 0).any(-1)
            out.append((h.float().cpu()[keep], following[keep], labels[keep]))
        if log is not None and (start // group_size) % 25 == 0:
            log(f"heads: read {min(start + group_size, len(paragraphs))}/{len(paragraphs)} paragraphs")
    return out


def candidate_vocabulary(sequences, size: int) -> torch.Tensor:
    """The `size` most frequent label tokens (ties: the smaller id first); `sequences` of token ids (-1: none)."""
    counts: dict[int, int] = {}
    for seq in sequences:
        for token in (seq.reshape(-1).tolist() if isinstance(seq, torch.Tensor) else seq):
            if token >= 0:
                counts[token] = counts.get(token, 0) + 1
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    return torch.tensor(sorted(ranked), dtype=torch.long)


def to_candidates(labels: torch.Tensor, vocab: torch.Tensor, outside: int) -> torch.Tensor:
    """Token-id labels as candidate indices: -1 stays -1 (no label), a token outside the vocabulary -> `outside`."""
    table = torch.full((int(max(labels.max(), vocab.max())) + 1,), outside, dtype=torch.long)
    table[vocab] = torch.arange(len(vocab))
    mapped = table[labels.clamp(min=0)]
    return torch.where(labels >= 0, mapped, torch.full_like(labels, -1))


def logits_of(x: torch.Tensor, e: torch.Tensor | None, params: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """head_logits with the training's parameter list [W, b, c] or [W, b, c, U] (U: heads that read the token)."""
    weight, bias, vocab_bias, *token_weight = params
    return head_logits(x, weight, bias, vocab_bias, rows, e, token_weight[0] if token_weight else None)


def accuracy(x: torch.Tensor, e: torch.Tensor | None, y: torch.Tensor, params, rows) -> list[float]:
    """Each head's top-1 agreement with the target's greedy token over the positions with a label (y >= 0 or -3:
    outside the vocabulary, a miss; -1: no label, not counted)."""
    with torch.no_grad():
        predicted = torch.cat([logits_of(x[b:b + 4096], None if e is None else e[b:b + 4096], params, rows).argmax(-1)
                               for b in range(0, len(x), 4096)])
    counted = y != -1
    return [float(((predicted[:, i] == y[:, i]) & counted[:, i]).sum() / max(int(counted[:, i].sum()), 1))
            for i in range(y.shape[1])]


@torch.no_grad()  # not inference_mode: the embeddings are the training's inputs, saved for its backward
def embedded(pair, tokens: torch.Tensor) -> torch.Tensor:
    """The target's input embeddings of `tokens` [m] as [m, d] fp32 on the CPU, in chunks (a packed table is
    dequantised row by row)."""
    return torch.cat([input_rows(pair.target.module, tokens[b:b + 4096].to(pair.device)).cpu()
                      for b in range(0, len(tokens), 4096)])


@dataclass(frozen=True)
class TrainingSet:
    """The heads' training and held-out data: hidden states, the embeddings of the tokens they produced (heads that
    read the token; else None) and labels as candidate indices (-1: none; held out, -3: outside the vocabulary)."""

    x: torch.Tensor
    e: torch.Tensor | None
    y: torch.Tensor
    held_x: torch.Tensor
    held_e: torch.Tensor | None
    held_y: torch.Tensor
    vocab: torch.Tensor  # the candidate vocabulary (token ids)
    coverage: float  # share of the training labels inside it


def training_set(pair, settings: HeadsSettings, prompts: list[list[int]], paragraphs: list[list[int]],
                 log=print) -> TrainingSet:
    """Generate the continuations, read the paragraphs, hold out the last `holdout` share of each kind, choose the
    vocabulary."""
    greedy = [(h, torch.tensor(t, dtype=torch.long), continuation_labels(t, settings.heads)) for h, t in
              continuations(pair, prompts, settings.new_tokens, log)] if prompts else []
    forced = teacher_forced(pair, paragraphs, settings.heads, settings.consistent, settings.token,
                            log) if paragraphs else []
    train_data, held = [], []
    for data in (greedy, forced):
        if data:
            cut = max(1, int(round(len(data) * (1 - settings.holdout))))
            train_data += data[:cut]
            held += data[cut:] or data[-1:]
    vocab = candidate_vocabulary([y for _, _, y in train_data], settings.vocab)
    labels = torch.cat([y for _, _, y in train_data])
    y = to_candidates(labels, vocab, -1)  # outside the vocabulary: not trained on
    e = he = None
    if settings.token:  # the input embedding of the token each hidden state produced (followed by)
        e = embedded(pair, torch.cat([c for _, c, _ in train_data]))
        he = embedded(pair, torch.cat([c for _, c, _ in held]))
    return TrainingSet(torch.cat([h for h, _, _ in train_data]), e, y, torch.cat([h for h, _, _ in held]), he,
                       to_candidates(torch.cat([y for _, _, y in held]), vocab, -3),  # outside: a miss
                       vocab, float((y >= 0).sum() / max(int((labels >= 0).sum()), 1)))


def train(pair, settings: HeadsSettings, prompts: list[list[int]], commit: str, log=print,
          paragraphs: list[list[int]] | None = None) -> tuple[Heads, HeadsRecord]:
    """Build the training set (`training_set`), fit the heads; seeded (torch CPU). The last `holdout` share of the
    prompts and of the paragraphs is held out for the record's agreement."""
    started = time.perf_counter()
    paragraphs = paragraphs or []
    data = training_set(pair, settings, prompts, paragraphs, log)
    x, e, y, hx, he, hy, vocab = data.x, data.e, data.y, data.held_x, data.held_e, data.held_y, data.vocab
    rows = output_rows(pair.target.module, vocab).cpu()
    generator = torch.Generator().manual_seed(settings.seed)
    n, d, v = settings.heads, x.shape[1], len(vocab)
    params = [torch.zeros(n, d, d), torch.zeros(n, d), torch.zeros(n, v)] + ([torch.zeros(n, d, d)] if e is not None
                                                                            else [])
    for p in params:
        p.requires_grad_(True)
    optimiser = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    curve, best, best_epoch = [], None, 0
    for epoch in range(settings.epochs):
        order = torch.randperm(len(x), generator=generator)
        sums, batches = torch.zeros(n), 0
        for b in range(0, len(order), settings.batch):
            pick = order[b:b + settings.batch]
            logits = logits_of(x[pick], None if e is None else e[pick], params, rows)
            losses = torch.stack([F.cross_entropy(logits[:, i], y[pick, i], ignore_index=-1) if
                                  (y[pick, i] >= 0).any() else logits.sum() * 0 for i in range(n)])
            optimiser.zero_grad()
            losses.sum().backward()
            optimiser.step()
            sums += losses.detach()
            batches += 1
        curve.append([round(float(s / max(batches, 1)), 5) for s in sums])
        held_now = accuracy(hx, he, hy, [p.detach() for p in params], rows)
        log(f"heads: epoch {epoch + 1}/{settings.epochs}, loss per head {curve[-1]}, held-out agreement "
            f"{[round(a, 3) for a in held_now]}")
        if not settings.keep_best or best is None or sum(held_now) > sum(best[0]):
            best, best_epoch = (held_now, [p.detach().clone() for p in params]), epoch + 1
    held_accuracy = [round(a, 5) for a in best[0]]
    digest = data_digest(prompts, paragraphs)
    weight, bias, vocab_bias, *token_weight = best[1]
    module = pair.target.module
    heads = Heads(weight, bias, vocab_bias, vocab, rows, pair.vocab_size, None,
                  token_weight[0] if token_weight else None, lambda ids: input_rows(module, ids)).on_kernels_of(module)
    record = HeadsRecord(key=heads_key(pair, settings, digest), settings=settings,
                         target=target_identity(pair), data_digest=digest, commit=commit,
                         positions=len(x), vocab_size=v, coverage=round(data.coverage, 5), loss_curve=curve,
                         holdout_accuracy=held_accuracy, train_seconds=round(time.perf_counter() - started, 2),
                         best_epoch=best_epoch, texts=data_origin(settings))
    heads.record = record
    return heads, record


def ensure_heads(pair, settings: HeadsSettings, commit: str, install: bool = True, log=print) -> HeadsLayout:
    """The set for these settings on `pair`: the shipped one when its key matches, else the cached one, else
    trained and cached; installed as the pair's shipped set (data/heads/<pair>/) when `install`."""
    if settings.pair != pair.name:
        raise RakvError(f"heads settings are for pair '{settings.pair}', the loaded pair is '{pair.name}'")
    prompts, paragraphs = training_texts(pair.tokenizer.encode, settings)
    key = heads_key(pair, settings, data_digest(prompts, paragraphs))
    shipped = HeadsLayout.shipped(pair.name)
    if shipped.record.exists() and _shipped_key(shipped, log) == key:
        log(f"heads: {shipped.root} already holds the set {key}")
        return shipped
    cached = HeadsLayout.cached(derived_files_dir(), key)
    if not cached.record.exists():
        log(f"heads: training {key} ({settings.heads} heads, {settings.prompts} prompts x {settings.new_tokens} "
            f"tokens, {settings.paragraphs} paragraphs teacher-forced, seed {settings.seed})")
        heads, record = train(pair, settings, prompts, commit, log, paragraphs)
        save_heads(heads, record, cached)
        log(f"heads: trained in {record.train_seconds:.0f} s; held-out top-1 per head {record.holdout_accuracy}; "
            f"vocabulary {record.vocab_size} tokens covering {record.coverage:.1%} of the labels")
    else:
        log(f"heads: {key} found in the cache {cached.root}")
    if install:
        shipped.root.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached.tensors, shipped.tensors)
        shutil.copyfile(cached.record, shipped.record)
        log(f"heads: installed as {shipped.root}")
        return shipped
    return cached


def _shipped_key(layout: HeadsLayout, log) -> str | None:
    """The shipped set's key; None when its record is of an older format (it is then replaced)."""
    try:
        return read_heads_record(layout).key
    except RakvError as exc:
        log(f"heads: the shipped set is replaced ({exc})")
        return None


def settings_of(node) -> HeadsSettings:
    """conf/heads/<pair>.yaml's node as HeadsSettings (an unknown key fails with one line)."""
    values = dict(node)
    known = set(asdict(HeadsSettings()))
    unknown = sorted(set(values) - known)
    if unknown:
        raise RakvError(f"heads: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return HeadsSettings(**values)


def run_heads(cfg) -> None:
    """The stage: the configured pair's heads, on the configured device, dtype, kernels and threads."""
    from rakv.experiments.records import git_commit
    from rakv.runtime.models import load_pair

    if cfg.get("heads") is None:
        raise RakvError("no heads settings in the composed config: run the heads stage (conf/heads.yaml)")
    settings = settings_of(cfg.heads)
    pair = load_pair(settings.pair, device=cfg.device, dtype=cfg.dtype, threads=cfg.threads, kernels=cfg.kernels)
    torch.manual_seed(settings.seed)
    ensure_heads(pair, settings, git_commit() or "unknown", install=True, log=lambda line: print(line, flush=True))
