"""Where an LM train step's time goes on XLA's CPU backend, by kind of compiled operation.

    python experiments/lm/lm_step_profile.py                  # small (experiments/lm/lm_benchmark.py's shapes)
    python experiments/lm/lm_step_profile.py --size medium --what forward

Profiles a few calls of the jitted gradient of the next-token loss (or the forward pass) with `jax.profiler`,
XLA's per-operation trace events switched on (`--xla_cpu_enable_xprof_traceme`, set here before JAX starts),
and sums the events' durations by kind: the operation's name without its number (`ynn_fusion` are the products
YNNPACK runs, `copy_bitcast_fusion` and `transpose_copy_fusion` copies that change a layout, `while` the layer
scan's loop). Durations are thread time summed over XLA's threads, nested events included, so read the shares,
not a total. This is how issue 36 found the train step's transposing copies.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()

import jax  # noqa: E402 (after XLA_FLAGS)
import jax.numpy as jnp  # noqa: E402
from lm_benchmark import SIZES  # noqa: E402

from ftw_jax.lm import CausalLM  # noqa: E402

CALLS = 3
RUNTIME_EVENTS = ("ThunkExecutor", "SlinkyThreadPool", "$")  # the runtime's and Python's own, not operations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=[name for name in SIZES if not name.startswith("qwen")])
    parser.add_argument("--what", default="gradient", choices=["gradient", "forward"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--top", type=int, default=12, help="kinds listed")
    args = parser.parse_args()
    config = SIZES[args.size]
    model = CausalLM(config)
    tokens = jax.random.randint(jax.random.key(1), (args.batch, args.length), 0, config.vocab_size)
    params = jax.jit(model.init)(jax.random.key(0), tokens)

    def loss(params):
        log_probs = jax.nn.log_softmax(model.apply(params, tokens[:, :-1]))
        return -jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1).mean()

    function = jax.jit(jax.grad(loss) if args.what == "gradient" else loss)
    for _ in range(2):  # compile, then warm
        jax.block_until_ready(function(params))
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(CALLS):
                jax.block_until_ready(function(params))
        (trace,) = pathlib.Path(folder).rglob("*.xplane.pb")
        profile = jax.profiler.ProfileData.from_file(str(trace))
    by_kind: collections.Counter[str] = collections.Counter()
    for plane in profile.planes:
        for line in plane.lines:
            for event in line.events:
                if not event.name.startswith(RUNTIME_EVENTS):
                    by_kind[re.sub(r"\.\d+$", "", event.name)] += event.duration_ns / CALLS / 1e6
    total = sum(by_kind.values())
    print(f"{args.what} of {args.size}, batch {args.batch} x {args.length} tokens: ms per call by kind (thread time)\n")
    print("| kind | ms per call | share |")
    print("|---|---:|---:|")
    for kind, ms in by_kind.most_common(args.top):
        print(f"| {kind} | {ms:.1f} | {ms / total:.0%} |")
    print(f"| (all {len(by_kind)} kinds) | {total:.1f} | 100% |")


if __name__ == "__main__":
    main()
