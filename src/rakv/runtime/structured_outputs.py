"""The structured-output workload: prompts asking for one JSON object that follows a given JSON Schema, and the check
of what a model wrote (docs/sampling.md, "Workloads").

Each prompt states a schema, shows one record of it as a worked example, then gives the facts of another record in
prose and asks for its JSON. Records come from a seeded generator over small word lists, so the prompts are the same
on every machine and nothing is downloaded. An output is judged by `validity`: whether its first JSON object parses
(Python's `json`) and whether it matches the schema (`jsonschema`, Draft 2020-12).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from jsonschema import Draft202012Validator

FIRST_NAMES = ("Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "John", "Radia", "Ken", "Margaret",
               "Tim", "Sophie", "Linus", "Hedy", "Claude")
LAST_NAMES = ("Lovelace", "Turing", "Hopper", "Dijkstra", "Liskov", "Knuth", "Allen", "McCarthy", "Perlman",
              "Thompson", "Hamilton", "Berners-Lee", "Wilson", "Torvalds", "Lamarr", "Shannon")
SKILLS = ("compilers", "databases", "networking", "graphics", "security", "statistics", "robotics", "typography")
CITIES = ("Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Tallinn", "Perth", "Quebec")
PRODUCTS = ("kettle", "lamp", "notebook", "cable", "chair", "mug", "router", "backpack")

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0},
            "city": {"type": "string"},
            "skills": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        },
        "required": ["name", "age", "city", "skills"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "order_id": {"type": "integer"},
            "customer": {"type": "string"},
            "items": {"type": "array", "minItems": 1, "items": {
                "type": "object",
                "properties": {"product": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1}},
                "required": ["product", "quantity"], "additionalProperties": False}},
            "paid": {"type": "boolean"},
        },
        "required": ["order_id", "customer", "items", "paid"],
        "additionalProperties": False,
    },
}


def _pick(rng: np.random.Generator, options: tuple[str, ...], n: int = 1) -> list[str]:
    return [options[i] for i in rng.choice(len(options), size=n, replace=False)]


def record(schema: str, rng: np.random.Generator) -> dict:
    """One record of `schema` from the seeded generator."""
    name = " ".join((_pick(rng, FIRST_NAMES)[0], _pick(rng, LAST_NAMES)[0]))
    if schema == "person":
        return {"name": name, "age": int(rng.integers(18, 90)), "city": _pick(rng, CITIES)[0],
                "skills": _pick(rng, SKILLS, int(rng.integers(1, 4)))}
    items = [{"product": p, "quantity": int(rng.integers(1, 6))} for p in _pick(rng, PRODUCTS, int(rng.integers(1, 4)))]
    return {"order_id": int(rng.integers(1000, 99999)), "customer": name, "items": items,
            "paid": bool(rng.integers(0, 2))}


def facts(schema: str, values: dict) -> str:
    """The record said in prose: what the prompt gives the model to convert."""
    if schema == "person":
        return (f"{values['name']} is {values['age']} years old, lives in {values['city']} and works on "
                f"{', '.join(values['skills'])}.")
    items = ", ".join(f"{i['quantity']} x {i['product']}" for i in values["items"])
    return (f"Order {values['order_id']} for {values['customer']}: {items}; "
            f"{'paid' if values['paid'] else 'not paid yet'}.")


def prompt(schema: str, example: dict, target: dict) -> str:
    return (f"Convert the description into one JSON object that follows this JSON Schema:\n"
            f"{json.dumps(SCHEMAS[schema])}\n\n"
            f"Description: {facts(schema, example)}\nJSON: {json.dumps(example)}\n\n"
            f"Description: {facts(schema, target)}\nJSON:")


def structured_texts(count: int = 64, seed: int = 0) -> list[tuple[str, str]]:
    """(id, prompt) pairs, `count` of them alternating between the schemas; the id names the schema
    (structured/<schema>/<i>) so that `schema_of` finds what an output must follow."""
    rng = np.random.default_rng(seed)
    names = sorted(SCHEMAS)
    out = []
    for i in range(count):
        schema = names[i % len(names)]
        out.append((f"structured/{schema}/{i}", prompt(schema, record(schema, rng), record(schema, rng))))
    return out


def schema_of(prompt_id: str) -> dict:
    return SCHEMAS[prompt_id.split("/")[1]]


@dataclass(frozen=True)
class Validity:
    parses: bool  # the output's first JSON object parses
    matches: bool  # ... and follows the schema


def validity(output: str, schema: dict) -> Validity:
    """Whether `output` (what the model wrote after the prompt) begins, after white space, with a JSON object that
    parses, and whether that object follows `schema`; text after the object is allowed (a model may go on)."""
    text = output.lstrip()
    if not text.startswith("{"):
        return Validity(False, False)
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError:
        return Validity(False, False)
    return Validity(True, Draft202012Validator(schema).is_valid(value))
