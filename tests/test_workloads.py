"""Prompt sources need nothing outside the repository and the package registry."""

import gzip
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rakv.runtime.errors import RakvError
from rakv.runtime.workloads import BUNDLED_WIKITEXT2, load_wikitext2

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
