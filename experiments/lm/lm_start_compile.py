"""Compile time of `lm text-search --model`'s initialisation, the checkpoint's weights passed in or compiled in.

    python experiments/lm/lm_start_compile.py              # a random 30.6M-parameter checkpoint (8 layers, width 512)
    python experiments/lm/lm_start_compile.py --layers 24 --width 1024

The checkpoint is the tests' tiny chat model (`tests/conftest.py`: a byte-level BPE tokenizer of 320 tokens
and a Qwen-style chat template) widened to the given shape, random weights. One seed; the text search task
without a warm start. `argument` is what `MemberRun` compiles (`trainer.start_params` an input shared by
the seeds); `constant` is the same init closing over the weights, as before they became an argument.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from conftest import write_tiny_bpe_checkpoint  # noqa: E402

from ftw_jax.lab.train import TrainConfig, make_train  # noqa: E402
from ftw_jax.lm.config import pretrained_config  # noqa: E402
from ftw_jax.lm.load import save  # noqa: E402
from ftw_jax.lm.model import CausalLM  # noqa: E402
from ftw_jax.running.loop import seed_keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    jax.config.update("jax_debug_key_reuse", False)  # the checker's false positive on the LM's cached rollout
    with tempfile.TemporaryDirectory() as scratch:
        small = write_tiny_bpe_checkpoint(pathlib.Path(scratch) / "tiny")
        config = dataclasses.replace(
            pretrained_config(str(small)),
            hidden_size=args.width,
            intermediate_size=4 * args.width,
            num_layers=args.layers,
            num_heads=args.width // 64,
            num_kv_heads=2,
            head_dim=64,
        )
        params = CausalLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
        folder = save(
            pathlib.Path(scratch) / "model",
            config,
            params,
            copy_files=[small / "tokenizer.json", small / "tokenizer_config.json"],
        )
        print(f"{sum(leaf.size for leaf in jax.tree.leaves(params)) / 1e6:.1f}M parameters")
        trainer = make_train(
            TrainConfig.for_env("text-search", warm_start_demonstrations=0, model=str(folder)), step_limit=240
        )
        keys = jax.random.key_data(seed_keys([0]))
        hyperparameters = jax.tree.map(lambda leaf: jnp.stack([leaf]), trainer.config.hyperparameters())
        start = lambda data, h, params: trainer.init(jax.random.wrap_key_data(data), h, params)  # noqa: E731
        constant = lambda data, h: trainer.init(jax.random.wrap_key_data(data), h)  # noqa: E731
        for name, init, inputs in [
            ("argument", jax.vmap(start, in_axes=(0, 0, None)), (keys, hyperparameters, trainer.start_params)),
            ("constant", jax.vmap(constant), (keys, hyperparameters)),
        ]:
            started = time.perf_counter()
            lowered = jax.jit(init).lower(*inputs)
            lowered.compile()
            print(
                f"{name}: lower + compile {time.perf_counter() - started:.1f} s, "
                f"program {len(lowered.as_text()):,} characters"
            )


if __name__ == "__main__":
    main()
