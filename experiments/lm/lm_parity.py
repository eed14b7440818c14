"""Tiny random Hugging Face causal-LM checkpoints and PyTorch reference logits for the JAX parity tests.

    python experiments/lm/lm_parity.py   # builds runs/parity-venv (torch CPU + transformers 5) on first use

The JAX tests check that our Llama/Qwen2 forward pass, reading these checkpoints, reproduces transformers'
logits to 1e-5 in float32, without torch in the project. So torch and transformers live only in a virtual
environment this script builds for itself; it then re-runs itself there (`--worker`) and writes, under
`tests/data/lm/`:

- `qwen2-untied/`: Qwen2ForCausalLM, grouped-query attention, q/k/v biases, separate lm_head.
- `qwen2-tied/`: Qwen2ForCausalLM with tied embeddings, saved in several safetensors shards plus an index.
- `llama3-scaled/`: LlamaForCausalLM, GQA, an explicit head_dim unlike hidden/heads, Llama-3 rope scaling
  whose four rotary frequencies cover the three llama3 regimes (kept, interpolated, divided by the factor).
- each folder's `reference.npz`: `tokens` int32 [2, 12] and `logits` float32 [2, 12, V] (eval mode, eager
  attention); `qwen2-untied`'s also a left-padded batch (`padded_tokens`, `attention_mask`, `position_ids`,
  `padded_logits`) for left-padded sampling parity.
- `manifest.json` (versions, seed, each model's config and tensors) and `README.md`.

Every tensor is re-drawn from a fixed seed after construction: transformers' own init leaves biases at zero
and norm weights at one, which would hide a missing bias or norm scale. The logits come from the checkpoint
as reloaded by `from_pretrained`, so they also test that the saved files (sharding, tying) load back whole.
One torch thread and fixed zip timestamps make a rerun write byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import time
import zipfile

import numpy as np

TORCH_SPECS = ["torch==2.13.0+cpu", "torch==2.13.0"]  # the first is a local CPU wheel here; the second a fallback
OTHERS = ["transformers==5.17.0", "safetensors"]
SEED = 0
BATCH, LENGTH = 2, 12
PAD_LEFT = 4  # pad positions at the start of the padded batch's row 0
VOCAB = 96
PAD_ID = VOCAB - 1

# The Llama-3 rope: head_dim 8 gives four frequencies θ^(-2i/8); with θ = 500 their wavelengths 2π/f are
# ≈ 6.3, 29.7, 140.5, 664.3. original_max_position_embeddings 64 with low_freq_factor 1 and high_freq_factor 4
# puts high_freq_wavelen at 64/4 = 16 and low_freq_wavelen at 64/1 = 64, so
#   6.3 < 16            -> kept as it is (high frequency),
#   16 <= 29.7 <= 64    -> interpolated, smooth = (64/29.7 - 1) / (4 - 1) ≈ 0.385 (well inside (0, 1)),
#   140.5, 664.3 > 64   -> divided by factor 8 (low frequency).
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
COMMON = dict(
    vocab_size=VOCAB,
    num_hidden_layers=2,
    intermediate_size=64,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    pad_token_id=PAD_ID,
    bos_token_id=0,
    eos_token_id=1,
)
MODELS = {
    "qwen2-untied": dict(
        architecture="Qwen2ForCausalLM",
        shard=None,
        config=dict(
            COMMON,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    "qwen2-tied": dict(
        architecture="Qwen2ForCausalLM",
        shard="24KB",
        config=dict(
            COMMON,
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        ),
    ),
    # 8 query heads of head_dim 8 (64 wide) on a 32-wide residual: hidden/heads = 4 is NOT the head_dim.
    "llama3-scaled": dict(
        architecture="LlamaForCausalLM",
        shard=None,
        config=dict(
            COMMON,
            hidden_size=32,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=8,
            tie_word_embeddings=False,
            rope_parameters=LLAMA3_ROPE,
        ),
    ),
}
ROPE_KEYS = ("rope", "max_position_embeddings", "head_dim", "partial_rotary")


def save_npz(path: pathlib.Path, **arrays: np.ndarray) -> None:
    """`np.savez` with a fixed zip timestamp (numpy stamps the current time), so reruns give identical bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            with archive.open(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), "w") as file:
                np.lib.format.write_array(file, np.ascontiguousarray(array), allow_pickle=False)


def redraw(model, generator) -> None:
    """Every parameter from the seeded generator: matrices N(0, 0.15²), biases N(0, 0.1²), RMSNorm scales
    1 + N(0, 0.1²). `named_parameters` yields a tied embedding once, and the in-place copy keeps the tie."""
    import torch

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
            if "norm" in name:
                parameter.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_(0.15 * noise)


def write_checkpoint(out: pathlib.Path, name: str, spec: dict, index: int) -> dict:
    """Builds, randomises, saves and reloads one model; writes its reference logits; returns its manifest entry."""
    import torch
    import transformers
    from safetensors import safe_open

    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)  # drop stale shards of an earlier run
    config_class = {"Qwen2ForCausalLM": transformers.Qwen2Config, "LlamaForCausalLM": transformers.LlamaConfig}[
        spec["architecture"]
    ]
    model_class = getattr(transformers, spec["architecture"])
    config = config_class(**json.loads(json.dumps(spec["config"])), dtype="float32")
    torch.manual_seed(SEED)
    model = model_class._from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    redraw(model, torch.Generator().manual_seed(SEED + index))
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if tied != config.tie_word_embeddings:
        raise SystemExit(f"{name}: lm_head tied {tied}, config says {config.tie_word_embeddings}")
    shard = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    model.save_pretrained(folder, safe_serialization=True, **shard)

    tokens = np.random.default_rng(SEED + index).integers(0, VOCAB, (BATCH, LENGTH)).astype(np.int32)
    reloaded = model_class.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        logits = reloaded(torch.from_numpy(tokens).long()).logits.numpy()
        in_memory = model(torch.from_numpy(tokens).long()).logits.numpy()
    if not np.array_equal(logits, in_memory):
        raise SystemExit(
            f"{name}: reloaded checkpoint's logits differ from the model that was saved "
            f"(max {np.max(np.abs(logits - in_memory)):.2e})"
        )
    arrays = {"tokens": tokens, "logits": logits.astype(np.float32)}
    checks = {}
    if name == "qwen2-untied":
        arrays.update(padded_batch(reloaded, tokens))
        checks = padded_checks(reloaded, tokens, arrays)
    save_npz(folder / "reference.npz", **arrays)

    written = json.loads((folder / "config.json").read_text())
    rope = {key: value for key, value in written.items() if any(part in key for part in ROPE_KEYS)}
    print(f"{name}: config.json rope-related keys {json.dumps(rope)}", flush=True)
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="np") as handle:
            for key in handle.keys():
                tensors[key] = {"shape": list(handle.get_slice(key).get_shape()), "file": file.name}
    files = {path.name: path.stat().st_size for path in sorted(folder.iterdir())}
    return {
        "architecture": spec["architecture"],
        "config_written": written,
        "rope_keys_written": rope,
        "tied_embeddings": tied,
        "lm_head_weight_saved": "lm_head.weight" in tensors,
        "parameters": sum(p.numel() for p in model.parameters()),
        "tensors": dict(sorted(tensors.items())),
        "files": files,
        "logit_std": float(logits.std()),
        "checks": checks,
    }


def padded_batch(model, tokens: np.ndarray) -> dict:
    """Row 0 left-padded by PAD_LEFT (its first LENGTH - PAD_LEFT tokens after the pads), row 1 as is; positions
    count only real tokens. Logits at pad positions are whatever transformers makes of a fully masked query:
    compare real positions only."""
    import torch

    padded = tokens.copy()
    padded[0] = np.concatenate([np.full(PAD_LEFT, PAD_ID), tokens[0, : LENGTH - PAD_LEFT]])
    mask = np.ones_like(padded)
    mask[0, :PAD_LEFT] = 0
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int32)
    with torch.no_grad():
        logits = model(
            torch.from_numpy(padded).long(),
            attention_mask=torch.from_numpy(mask).long(),
            position_ids=torch.from_numpy(positions).long(),
        ).logits.numpy()
    return {
        "padded_tokens": padded,
        "attention_mask": mask.astype(np.int32),
        "position_ids": positions,
        "padded_logits": logits.astype(np.float32),
    }


def padded_checks(model, tokens: np.ndarray, arrays: dict) -> dict:
    """How far the padded batch's real positions are from the same tokens run unpadded (should be ~1e-7)."""
    import torch

    with torch.no_grad():
        short = model(torch.from_numpy(tokens[:1, : LENGTH - PAD_LEFT]).long()).logits.numpy()
    return {
        "row0_real_vs_unpadded": float(np.max(np.abs(arrays["padded_logits"][0, PAD_LEFT:] - short[0]))),
        "row1_vs_logits": float(np.max(np.abs(arrays["padded_logits"][1] - arrays["logits"][1]))),
    }


def llama3_regimes() -> list[dict]:
    """Where each rotary frequency of the llama3 checkpoint falls (the comment above LLAMA3_ROPE, computed)."""
    head_dim, rope = MODELS["llama3-scaled"]["config"]["head_dim"], LLAMA3_ROPE
    old = rope["original_max_position_embeddings"]
    low, high = old / rope["low_freq_factor"], old / rope["high_freq_factor"]
    rows = []
    for i in range(head_dim // 2):
        wavelength = 2 * np.pi * rope["rope_theta"] ** (2 * i / head_dim)
        regime = "kept" if wavelength < high else "divided" if wavelength > low else "interpolated"
        rows.append({"index": i, "wavelength": round(float(wavelength), 2), "regime": regime})
    return rows


def worker(out: pathlib.Path) -> None:
    """Runs inside the parity venv: every checkpoint, its references, the manifest and the README."""
    import safetensors
    import torch
    import transformers

    if torch.version.cuda is not None:
        raise SystemExit(f"torch {torch.__version__} is a CUDA build; the parity venv wants the CPU wheel")
    torch.set_num_threads(1)  # one thread: the same reduction order, so the same bits, on every rerun
    torch.use_deterministic_algorithms(True)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
        "seed": SEED,
        "tokens_shape": [BATCH, LENGTH],
        "pad_token_id": PAD_ID,
        "pad_left": PAD_LEFT,
        "attn_implementation": "eager",
        "dtype": "float32",
        "init": "matrices N(0, 0.15^2), biases N(0, 0.1^2), RMSNorm weights 1 + N(0, 0.1^2)",
        "llama3_rope_regimes": llama3_regimes(),
        "models": {},
    }
    for index, (name, spec) in enumerate(MODELS.items()):
        manifest["models"][name] = write_checkpoint(out, name, spec, index)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (out / "README.md").write_text(README.format(torch=torch.__version__, transformers=transformers.__version__))


README = """# Tiny random causal-LM checkpoints with PyTorch reference logits

`qwen2-untied/`, `qwen2-tied/` (sharded safetensors + index) and `llama3-scaled/` (Llama-3 rope scaling, GQA,
explicit head_dim) are float32 Hugging Face checkpoints of random weights, written by transformers'
`save_pretrained`. Each `reference.npz` holds `tokens` [2, 12] and transformers' `logits` [2, 12, V]
(eval, eager attention); `qwen2-untied`'s also a left-padded batch (`padded_tokens`, `attention_mask`,
`position_ids`, `padded_logits`; compare real positions only). `manifest.json` records versions, the seed
and each model's config and tensor shapes. Made with torch {torch}, transformers {transformers}.
Regenerate from the repository root (builds `runs/parity-venv` once; reruns write identical files):

    .venv/bin/python experiments/lm/lm_parity.py
"""


def installable(python: pathlib.Path, spec: str) -> bool:
    """Whether pip resolves `spec` without a CUDA build (nvidia-* or triton wheels), asking it for a dry run."""
    report = subprocess.run(
        [str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", spec],
        capture_output=True,
        text=True,
    )
    if report.returncode != 0:
        return False
    names = [item["metadata"]["name"].lower() for item in json.loads(report.stdout)["install"]]
    return not any(name.startswith(("nvidia", "triton")) for name in names)


def build_venv(venv: pathlib.Path) -> pathlib.Path:
    """The parity venv's python, building the venv (or finishing an interrupted build) if it cannot import
    torch, transformers and safetensors."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import torch, transformers, safetensors"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    started = time.perf_counter()
    print(f"building {venv} with torch (CPU) and {' '.join(OTHERS)} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    torch_spec = next((spec for spec in TORCH_SPECS if installable(python, spec)), None)
    if torch_spec is None:
        raise SystemExit(f"none of {TORCH_SPECS} installs without a CUDA build")
    subprocess.run([str(python), "-m", "pip", "install", "-q", torch_spec, *OTHERS], check=True)
    subprocess.run(check, check=True)
    print(f"built {venv} with {torch_spec} in {time.perf_counter() - started:.0f} s", flush=True)
    return python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=pathlib.Path, default=pathlib.Path("runs/parity-venv"))
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("tests/data/lm"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.out)
        return
    python = build_venv(args.venv.resolve())
    started = time.perf_counter()
    subprocess.run([str(python), __file__, "--worker", "--out", str(args.out.resolve())], check=True)
    sizes = sorted(
        (path.relative_to(args.out).as_posix(), path.stat().st_size) for path in args.out.rglob("*") if path.is_file()
    )
    print("\n".join(f"{size:>8,}  {name}" for name, size in sizes))
    print(f"{sum(size for _, size in sizes):,} bytes in {args.out}, written in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
