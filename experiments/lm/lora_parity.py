"""A LoRA run's merged export read by transformers gives the logits of our model with its adapters applied.

    # uses runs/parity-venv (experiments/lm/lm_parity.py)
    python experiments/lm/lora_parity.py --out results/lora-parity

Starting from the transformers-written tiny Qwen2 (`tests/data/lm/qwen2-untied`), adapters of rank 4 (alpha 8) on
every projection (`ftw_jax.lm.lora.with_adapters`), their B drawn away from zero so that they change the model;
our logits with the adapters applied (`CausalLM` with `lora_rank`), then the adapters merged into the weights
(`lora.merged`) and written as `lm learn --lora-rank` writes its versions (`lm.save`). The parity venv's
transformers loads that folder (`AutoModelForCausalLM.from_pretrained`, float32, eager attention) and its
logits are compared with ours: OUT/lora_parity.json holds the largest difference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import subprocess
import tempfile

import numpy as np
from lm_parity import build_venv  # noqa: E402

START = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "lm" / "qwen2-untied"

WORKER = """
import json, sys
import numpy as np, torch, transformers
folder, data = sys.argv[1], np.load(sys.argv[2])
model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
with torch.no_grad():
    logits = model(torch.as_tensor(data["tokens"]).long()).logits.numpy()
print(json.dumps({"max_abs_difference": float(np.max(np.abs(logits - data["logits"]))),
                  "transformers": transformers.__version__, "torch": torch.__version__}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/lora-parity"))
    parser.add_argument("--venv", type=pathlib.Path, default=pathlib.Path("runs/parity-venv"))
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp

    from ftw_jax.lm import CausalLM, load, lora, save

    model, base = load(START)
    config = dataclasses.replace(model.config, lora_rank=4, lora_alpha=8.0)
    adapted = lora.with_adapters(jax.random.key(0), config, base)
    keys = iter(jax.random.split(jax.random.key(1), 64))
    adapted = jax.tree_util.tree_map_with_path(
        lambda path, leaf: 0.05 * jax.random.normal(next(keys), leaf.shape) if path[-1].key == "lora_b" else leaf,
        adapted,
    )
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (2, 12)).astype(np.int32)
    logits = np.asarray(CausalLM(config).apply(adapted, jnp.asarray(tokens)))
    base_logits = np.asarray(model.apply(base, jnp.asarray(tokens)))
    python = build_venv(args.venv.resolve())
    with tempfile.TemporaryDirectory() as work:
        folder, ours = pathlib.Path(work) / "merged", pathlib.Path(work) / "ours.npz"
        save(folder, model.config, lora.merged(config, adapted))
        np.savez(ours, tokens=tokens, logits=logits)
        command = [str(python), "-c", WORKER, str(folder), str(ours)]
        report = subprocess.run(command, check=True, capture_output=True, text=True)
    result = {
        **json.loads(report.stdout.strip().splitlines()[-1]),
        "adapters_change_logits_by": float(np.max(np.abs(logits - base_logits))),
        "lora_rank": 4,
        "lora_alpha": 8.0,
        "adapter_numbers": lora.adapter_count(adapted),
        "jax": jax.__version__,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lora_parity.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
