"""Prompt sources need nothing outside the repository and the package registry."""

import gzip
import hashlib
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from rakv.runtime.errors import RakvError
from rakv.runtime.workloads import BUNDLED_WIKITEXT2, STDLIB_LEFT_OUT, load_wikitext2, python_files

ROOT = Path(__file__).resolve().parents[1]

# The digests data/wikitext-2/README.md states for the decompressed text.
WIKITEXT2_SHA256 = {
    "test.txt.gz": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
    "valid.txt.gz": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
}


@pytest.mark.parametrize("name", sorted(WIKITEXT2_SHA256))
def test_bundled_wikitext2_is_the_published_text(name):
    text = gzip.decompress((BUNDLED_WIKITEXT2 / name).read_bytes())
    assert hashlib.sha256(text).hexdigest() == WIKITEXT2_SHA256[name]
    assert WIKITEXT2_SHA256[name] in (BUNDLED_WIKITEXT2 / "README.md").read_text()


def test_bundled_wikitext2_loads_through_datasets():
    lines = load_wikitext2("bundled", "validation")["text"]
    assert len(lines) == 3760 and lines[1] == " = Homarus gammarus = "


def test_unknown_wikitext2_source_is_a_one_line_error(tmp_path):
    with pytest.raises(RakvError, match="neither bundled, hub, nor an existing folder"):
        load_wikitext2(str(tmp_path / "nowhere"))
    with pytest.raises(RakvError, match="not found"):
        load_wikitext2(str(tmp_path))


SELECT_EVERY_OFFLINE_PROFILE = """
from hydra import compose, initialize_config_dir
from rakv.runtime.models import smollm2_tokenizer
from rakv.experiments.config import CONF_DIR, prompts_for

tokenizer = smollm2_tokenizer()
encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
for profile in ("smoke", "offline", "offline-full"):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"profile={profile}"])
    grid = cfg.profile.study
    for dataset in cfg.datasets:
        prompts = prompts_for(cfg, encode, dataset)
        assert len(prompts) == len(grid.length_bins) * grid.prompts_per_bin, (profile, dataset)
        print(profile, dataset, len(prompts), cfg.data[dataset].source)
"""


def test_every_offline_profile_selects_its_prompts_without_network_or_workspace_data():
    env = {k: v for k, v in os.environ.items() if k != "RAKV_WIKITEXT_DIR"}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(ROOT / ".pytest_cache" / "hfds"))
    done = subprocess.run([sys.executable, "-c", SELECT_EVERY_OFFLINE_PROFILE], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert sum(line.startswith(("smoke", "offline")) for line in lines) == 6
    assert "offline wikitext2 4 bundled" in lines


# --- the structured-output and long-context workloads (issue 41)

from rakv.runtime.structured_outputs import SCHEMAS, record, schema_of, structured_texts, validity  # noqa: E402
from rakv.runtime.workloads import dataset_texts, select_documents, wikitext2_articles  # noqa: E402


def test_structured_prompts_are_seeded_and_their_worked_examples_follow_their_schemas():
    import json

    import numpy as np

    texts = structured_texts(8, seed=3)
    assert texts == structured_texts(8, seed=3) and texts != structured_texts(8, seed=4)
    assert {schema_of(i) is SCHEMAS["person"] or schema_of(i) is SCHEMAS["order"] for i, _ in texts} == {True}
    for prompt_id, text in texts:
        example = text.split("JSON: ")[1].split("\n")[0]  # the worked example the prompt shows
        assert validity(example, schema_of(prompt_id)).matches, (prompt_id, example)
    rng = np.random.default_rng(0)
    for schema in SCHEMAS:
        assert validity(" " + json.dumps(record(schema, rng)) + " and more text", SCHEMAS[schema]).matches
    assert dataset_texts("structured") == structured_texts()


@pytest.mark.parametrize("output, parses, matches", [
    ('{"name": "Ada Lovelace", "age": 36, "city": "Oslo", "skills": ["compilers"]}', True, True),
    ('{"name": "Ada Lovelace", "age": "36", "city": "Oslo", "skills": ["compilers"]}', True, False),  # a string age
    ('{"name": "Ada Lovelace", "age": 36, "city": "Oslo"}', True, False),  # a field missing
    ('{"name": "Ada Lovelace", "age": 36, "city": "Oslo", "skills": [], "x": 1}', True, False),
    ('{"name": "Ada Lovelace", "age": 36,', False, False),  # cut off
    ('Sure! {"name": "Ada"}', False, False),  # not JSON first
    ("", False, False),
])
def test_validity_tells_parsing_from_following_the_schema(output, parses, matches):
    v = validity(output, SCHEMAS["person"])
    assert (v.parses, v.matches) == (parses, matches)


def test_long_context_documents_share_their_prefix_across_questions():
    articles = wikitext2_articles()
    assert len(articles) > 50 and all(a.title and a.text for a in articles)
    assert articles[0].title == "Robert <unk>" and "Career" in articles[0].sections

    def encode(text):  # words as tokens: the selection needs lengths, not a tokenizer
        return [zlib.crc32(w.encode()) % 50_000 for w in text.split()]

    docs = select_documents(articles, encode, [(1000, 2000), (2000, 4000)], per_bin=2, questions=3, seed=0)
    assert [d.length_bin for d in docs] == ["1000-2000"] * 2 + ["2000-4000"] * 2
    assert docs == select_documents(articles, encode, [(1000, 2000), (2000, 4000)], 2, 3, seed=0)
    for doc in docs:
        low, high = map(int, doc.length_bin.split("-"))
        assert low <= len(doc.document) < high and len(doc.questions) == 3
        prompts = [doc.prompt(i) for i in range(3)]
        assert all(p[:len(doc.document)] == doc.document for p in prompts) and len(set(prompts)) == 3
    with pytest.raises(RakvError, match="only"):
        select_documents(articles, encode, [(100_000, 200_000)], per_bin=1, questions=1, seed=0)


def test_python_texts_are_each_top_level_function_and_class_of_a_folder(tmp_path):
    (tmp_path / "b.py").write_text("import os\n\n@decorator\ndef f(x):\n    return x\n\n\nclass C:\n    y = 1\n")
    (tmp_path / "a.py").write_text("async def g():\n    pass\nX = 1\n")
    (tmp_path / "broken.py").write_text("def (:\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "c.py").write_text("def h():\n    pass\n")
    assert dataset_texts("python", str(tmp_path)) == [
        ("python/a.py:1", "async def g():\n    pass"),
        ("python/b.py:3", "@decorator\ndef f(x):\n    return x"),
        ("python/b.py:8", "class C:\n    y = 1")]


def test_bundled_python_is_the_interpreters_library_without_its_tests():
    root, files = python_files("bundled")
    parts = {part for f in files for part in f.relative_to(root).parts[:-1]}
    assert len(files) > 100 and root / "json" / "decoder.py" in files and not parts & STDLIB_LEFT_OUT


def test_a_python_source_that_is_not_a_folder_fails_with_one_line(tmp_path):
    with pytest.raises(RakvError, match="neither bundled .* nor an existing folder"):
        dataset_texts("python", str(tmp_path / "missing"))
