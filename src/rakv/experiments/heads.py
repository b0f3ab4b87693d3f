"""The heads stage: learned heads (rakv.runtime.heads) trained by self-distillation on the target's own greedy
continuations, seeded, cached by content, and installed where the proposer finds them (docs/heads.md).

`./reproduce.sh stages=heads [heads=tiny] [heads.seed=1 heads.prompts=320 ...]` composes conf/heads.yaml (the
settings: conf/heads/<pair>.yaml), computes the set's key (the target's fingerprint, the prompts' digest, the
settings, rakv.runtime.heads.heads_key) and then: the shipped set (data/heads/<pair>/) has that key -> nothing to do;
the cache (<derived files>/heads/<key>/) has it -> installed from there; else trained, cached and installed. The
data: the first `prompt_tokens` tokens of WikiText-2 paragraphs (the bundled validation split by default: the test
split stays held out for the measurements, scripts/bench_heads.py), each continued greedily by the target for
`new_tokens` tokens; head i learns to predict, from the hidden state that produced continuation token j, token j+i.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

from rakv.runtime.compact import Segment
from rakv.runtime.decoding import forward_rows
from rakv.runtime.errors import RakvError
from rakv.runtime.heads import (
    Heads,
    HeadsRecord,
    HeadsSettings,
    head_logits,
    heads_key,
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


def training_prompts(encode, settings: HeadsSettings) -> list[list[int]]:
    """The first `prompt_tokens` tokens of the split's first paragraphs long enough for them, in a seeded order."""
    texts = dataset_texts(settings.dataset, settings.source, settings.split)
    encoded = [ids for ids in (encode(text) for _, text in texts) if len(ids) >= settings.prompt_tokens]
    random.Random(settings.seed).shuffle(encoded)
    if len(encoded) < settings.prompts:
        raise RakvError(f"heads: {settings.dataset}/{settings.split} has {len(encoded)} paragraphs of "
                        f"{settings.prompt_tokens} tokens or more, fewer than the {settings.prompts} asked for")
    return [ids[:settings.prompt_tokens] for ids in encoded[:settings.prompts]]


def data_digest(prompts: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:20]


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


def candidate_vocabulary(sequences: list[list[int]], size: int) -> torch.Tensor:
    """The `size` most frequent tokens of the continuations (ties: the smaller id first)."""
    counts: dict[int, int] = {}
    for seq in sequences:
        for token in seq:
            counts[token] = counts.get(token, 0) + 1
    ranked = sorted(counts, key=lambda t: (-counts[t], t))[:size]
    return torch.tensor(sorted(ranked), dtype=torch.long)


def examples(data: list[tuple[torch.Tensor, list[int]]], heads: int, index: dict[int, int]):
    """Hidden states [N, d] and labels [N, heads] (the candidate index of token j+i for head i; -1: none or
    outside the candidate vocabulary)."""
    xs, ys = [], []
    for hidden, tokens in data:
        labels = torch.full((len(tokens), heads), -1, dtype=torch.long)
        for j in range(len(tokens)):
            for i in range(1, heads + 1):
                if j + i < len(tokens):
                    labels[j, i - 1] = index.get(tokens[j + i], -1)
        xs.append(hidden)
        ys.append(labels)
    return torch.cat(xs), torch.cat(ys)


def accuracy(x: torch.Tensor, y: torch.Tensor, params, rows) -> list[float]:
    """Each head's top-1 agreement with the target's greedy token (a label outside the vocabulary is a miss)."""
    with torch.no_grad():
        predicted = head_logits(x, *params, rows).argmax(-1)
    counted = (y != -2)  # every position with a label; -1 (outside the vocabulary) counts as a miss
    return [float(((predicted[:, i] == y[:, i]) & counted[:, i]).sum() / max(int(counted[:, i].sum()), 1))
            for i in range(y.shape[1])]


def train(pair, settings: HeadsSettings, prompts: list[list[int]], commit: str,
          log=print) -> tuple[Heads, HeadsRecord]:
    """Generate the continuations, choose the vocabulary, fit the heads; seeded (torch CPU)."""
    started = time.perf_counter()
    data = continuations(pair, prompts, settings.new_tokens, log)
    cut = max(1, int(round(len(data) * (1 - settings.holdout))))
    train_data, held = data[:cut], data[cut:] or data[-1:]
    vocab = candidate_vocabulary([t for _, t in train_data], settings.vocab)
    index = {int(t): i for i, t in enumerate(vocab)}
    x, y = examples(train_data, settings.heads, index)
    hx, hy_raw = examples(held, settings.heads, index)
    # a held-out label past the continuation's end is not a position; one outside the vocabulary is a miss
    held_end = torch.cat([_ends(t, settings.heads) for _, t in held])
    hy = torch.where(held_end, torch.full_like(hy_raw, -2), hy_raw)
    coverage = float((y >= 0).sum() / max(int((_ends_all(train_data, settings.heads) == 0).sum()), 1))
    rows = output_rows(pair.target.module, vocab).cpu()
    generator = torch.Generator().manual_seed(settings.seed)
    n, d, v = settings.heads, x.shape[1], len(vocab)
    params = [torch.zeros(n, d, d), torch.zeros(n, d), torch.zeros(n, v)]
    for p in params:
        p.requires_grad_(True)
    optimiser = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    curve = []
    for epoch in range(settings.epochs):
        order = torch.randperm(len(x), generator=generator)
        sums, batches = torch.zeros(n), 0
        for b in range(0, len(order), settings.batch):
            pick = order[b:b + settings.batch]
            logits = head_logits(x[pick], *params, rows)
            losses = torch.stack([F.cross_entropy(logits[:, i], y[pick, i], ignore_index=-1) if
                                  (y[pick, i] >= 0).any() else logits.sum() * 0 for i in range(n)])
            optimiser.zero_grad()
            losses.sum().backward()
            optimiser.step()
            sums += losses.detach()
            batches += 1
        curve.append([round(float(s / max(batches, 1)), 5) for s in sums])
        log(f"heads: epoch {epoch + 1}/{settings.epochs}, loss per head {curve[-1]}")
    held_accuracy = [round(a, 5) for a in accuracy(hx, hy, [p.detach() for p in params], rows)]
    heads = Heads(*(p.detach().clone() for p in params), vocab, rows, pair.vocab_size)
    record = HeadsRecord(key=heads_key(pair, settings, data_digest(prompts)), settings=settings,
                         target=target_identity(pair), data_digest=data_digest(prompts), commit=commit,
                         positions=len(x), vocab_size=v, coverage=round(coverage, 5), loss_curve=curve,
                         holdout_accuracy=held_accuracy, train_seconds=round(time.perf_counter() - started, 2))
    heads.record = record
    return heads, record


def _ends(tokens: list[int], heads: int) -> torch.Tensor:
    """[len, heads]: True where head i's label would lie past the continuation's end."""
    n = len(tokens)
    return torch.tensor([[j + i >= n for i in range(1, heads + 1)] for j in range(n)], dtype=torch.bool)


def _ends_all(data, heads: int) -> torch.Tensor:
    return torch.cat([_ends(t, heads) for _, t in data]).long()


def ensure_heads(pair, settings: HeadsSettings, commit: str, install: bool = True, log=print) -> HeadsLayout:
    """The set for these settings on `pair`: the shipped one when its key matches, else the cached one, else
    trained and cached; installed as the pair's shipped set (data/heads/<pair>/) when `install`."""
    if settings.pair != pair.name:
        raise RakvError(f"heads settings are for pair '{settings.pair}', the loaded pair is '{pair.name}'")
    prompts = training_prompts(pair.tokenizer.encode, settings)
    key = heads_key(pair, settings, data_digest(prompts))
    shipped = HeadsLayout.shipped(pair.name)
    if shipped.record.exists() and read_heads_record(shipped).key == key:
        log(f"heads: {shipped.root} already holds the set {key}")
        return shipped
    cached = HeadsLayout.cached(derived_files_dir(), key)
    if not cached.record.exists():
        log(f"heads: training {key} ({settings.heads} heads, {settings.prompts} prompts x {settings.new_tokens} "
            f"tokens, seed {settings.seed})")
        heads, record = train(pair, settings, prompts, commit, log)
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
