"""XLA's memory count, per device, of the FTW update `ftw-jax lm learn` runs, compiled at Qwen2.5's sizes.

Compiled with abstract inputs (no weight is allocated), and printed beside `ftw_jax.lm.memory.memory_estimate`;
the measuring is `ftw_jax.agent.compiled_memory`'s, the rows and the table this script's.

    python experiments/lm/lm_compiled_memory.py --out runs/compiled-memory.jsonl     # the default rows, then the table
    python experiments/lm/lm_compiled_memory.py --models 0.5B --remat off            # one model, one setting
    python experiments/lm/lm_compiled_memory.py --models 7B --mesh 2x4,4x2,8x1 --placement learn,sharded
    python experiments/lm/lm_compiled_memory.py --table runs/compiled-memory.jsonl   # the table of rows already done

Each row builds the learner `lm learn` builds, `EpisodeLearner.build(LearnConfig(...), model_config)`, takes
its state's shapes from `learner.init` (`jax.eval_shape`: an empty pool of N episodes, the policy and its
reference, Adam's state), and lowers and compiles its jitted `learn(state, batch, iteration)` — the batch into
the pool, selection, U updates — with `jax.ShapeDtypeStruct` inputs; `compiled.memory_analysis()` then gives
XLA's buffer sizes per device: arguments, outputs, temporaries, and the bytes where an output reuses an input's
buffer (aliased). Peak = arguments + outputs + temporaries − aliased. `learn` donates the learner state (its
outputs reuse its buffers: the "donated" columns are what `lm learn` runs); the same update compiled without
donation shows what that saves. On a mesh (`--mesh DATAxMODEL`, forced host devices) the parameters are laid
out as `lm learn --mesh` lays them (`lm.sharding.param_specs`); the rest of the state either as `lm learn`'s
compiled `init` places it (placement "learn", every leaf by `param_specs` since issue 31) or by `param_specs`
through the measuring jit's own out_shardings (placement "sharded": the same layout, measured apart); the
batch is replicated, as `lm learn` places it. `init peak` is the same count for that compiled `init` (the
parameters in, the learner state out), which runs before the first update.

The update: B = 8 episodes per iteration into a pool of N = 64, J = 4 minibatches of C = 4 with the top K = 2
kept, so the loss runs on J·K = 8 trajectories of T = 1024 steps (max_length 1025; J·K < N: the gathered
path), U = 1 update, Adam, β = 0.05, the trust-region monitor off unless `--monitor-entries` (its default in
`lm learn`, 16, adds 2 × 16 forward passes of T tokens). Compute in bfloat16 with float32 master weights and
Adam state (`--param-dtype bfloat16`: pure bfloat16). `--losses dense,chunked`: the loss over the whole batch's
logits, or in chunks of `--chunk` steps (`LearnConfig.logits_chunk`; default: its automatic choice, 32 for
M = 8 rows of these vocabularies; the tables in docs/lm.md were measured at 128, the choice before, and name
it). `estimate` is `memory_estimate` for the same step (M = 8 rows of T tokens, the same chunks), divided by
the devices on a mesh.

Progress goes to stderr; each row, as it finishes, is appended to `--out` (JSON Lines), and rows already there
are not compiled again. The table (GiB per device) goes to stdout; `--json` prints the rows instead.
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # the device count is fixed when jax starts: set it first (not when this is imported)
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()

import argparse
import dataclasses
import itertools
import json
import pathlib
import resource
import sys
import time
from typing import Any

import jax

from ftw_jax.agent.compiled_memory import (
    LOSSES,
    MODELS,
    NUM_BATCHES,
    NUM_ELITES,
    PLACEMENTS,
    Dtype,
    compiled_memory,
    init_memory,
    learn_config,
    model_config,
)
from ftw_jax.lm.memory import memory_estimate, parameter_count

GIB = 2**30
DEVICE_MEMORY = 80 * GIB  # the goal: one 80 GiB GPU (an A100/H100 80GB) per device
MARGIN = 2 * GIB  # what no count holds: the CUDA context, the allocator's fragmentation

DEFAULT_MESH = {"0.5B": "1x1", "1.5B": "1x1", "3B": "1x1", "7B": "2x4"}  # the 7B shape is the mesh's point


@dataclasses.dataclass(frozen=True)
class Row:
    """The settings of one table row (a row of --out with the same settings is not compiled again)."""

    model: str  # a key of MODELS
    mesh: str = "1x1"  # DATAxMODEL
    placement: str = "-"  # on a mesh: "learn" or "sharded"
    remat: bool = True
    loss: str = "dense"
    chunk: int | None = None  # the chunked loss's steps per chunk (None: LearnConfig's automatic choice)
    monitor_entries: int = 0
    param_dtype: Dtype = "float32"
    reference_dtype: Dtype | None = None  # None: as init makes it (the compute dtype's, under float32 masters)
    algorithm: str = "ftw"  # lm learn's --algorithm
    lora_rank: int | None = None  # lm learn's --lora-rank: the base frozen in bfloat16, adapters float32
    task: str = "lm-learn"  # the update's sizes: lm learn's rows above, or `lm retrieval-qa`'s defaults

    @property
    def devices(self) -> tuple[int, int]:
        data, model = (int(part) for part in self.mesh.lower().split("x"))
        return data, model


def task_sizes(task: str) -> dict[str, int]:
    """The update's sizes for `task`: "lm-learn" those of the module's docstring; "retrieval-qa" the defaults of
    `ftw-jax lm retrieval-qa` (Search-R1's protocol: episodes of up to 4,548 tokens, B = 64 into a
    pool of N = 64, J = 16 minibatches of C = 8, K = 2 kept: 32 trajectories in the loss)."""
    if task == "lm-learn":
        return {}
    if task != "retrieval-qa":
        raise SystemExit(f"--task must be lm-learn or retrieval-qa, got {task!r}.")
    from ftw_jax.agent.retrieval_qa.learner import RetrievalTrainConfig

    learn = RetrievalTrainConfig().learn
    ftw = learn.algorithm_config
    return dict(
        max_length=learn.max_length,
        episodes=learn.episodes_per_iteration,
        pool=ftw.pool_capacity,
        num_batches=ftw.num_batches,
        batch_size=ftw.batch_size,
        num_elites=ftw.num_elites,
    )


def measure(settings: Row, *, donated: bool = True) -> dict[str, Any]:
    """One table row: the compiled update's memory as lm learn runs it (and with the state donated), its init's,
    and the estimate for the same step."""
    base_dtype = "bfloat16" if settings.lora_rank else settings.param_dtype  # LoRA's base: the compute dtype
    model = model_config(settings.model, remat=settings.remat, param_dtype=base_dtype)
    config = learn_config(
        loss=settings.loss,
        chunk=settings.chunk,
        param_dtype=settings.param_dtype,
        monitor_entries=settings.monitor_entries,
        algorithm=settings.algorithm,
        lora_rank=settings.lora_rank,
        **task_sizes(settings.task),
    )
    mesh, placement = settings.devices, settings.placement if settings.placement != "-" else "learn"
    devices = mesh[0] * mesh[1]
    row: dict[str, Any] = {
        **dataclasses.asdict(settings),
        "parameters": parameter_count(model),
        "devices": devices,
        "dtype": model.dtype,
        "weights_dtype": model.weights_dtype,
        "trajectories_in_loss": NUM_BATCHES * NUM_ELITES,
        "steps": config.num_steps,
    }
    reference_dtype = settings.reference_dtype
    row.update(compiled_memory(model, config, mesh=mesh, placement=placement, reference_dtype=reference_dtype))
    row["init_peak"] = init_memory(model, config, mesh=mesh, placement=placement)["peak"]
    if donated:
        donated_row = compiled_memory(
            model, config, mesh=mesh, placement=placement, reference_dtype=reference_dtype, donate=True
        )
        row.update({f"donated_{key}": value for key, value in donated_row.items()})
    estimate = memory_estimate(model, NUM_BATCHES * NUM_ELITES, config.num_steps, logits_chunk=row["logits_chunk"])
    row["estimate"] = estimate["total"]
    row["estimate_per_device"] = estimate["total"] / devices
    row["jax"] = jax.__version__
    row["backend"] = jax.default_backend()
    return row


def _gib(value: float | None) -> str:
    return "" if value is None else f"{value / GIB:.1f}"


def verdict(row: dict) -> str:
    """Whether lm learn's init and update fit DEVICE_MEMORY per device with MARGIN to spare: "yes", "donated"
    (with the state donated), "at the limit" (within MARGIN of it; ", donated" if only so) or "no"."""

    def fits(peak: float) -> str:
        return "yes" if peak <= DEVICE_MEMORY - MARGIN else "at the limit" if peak <= DEVICE_MEMORY else ""

    if row.get("init_peak", 0) > DEVICE_MEMORY:
        return "no (init)"
    if fits(row["peak"]):
        return fits(row["peak"])
    donated = fits(row.get("donated_peak", float("inf")))
    return {"yes": "donated", "at the limit": "at the limit, donated"}.get(donated, "no")


def table(rows: list[dict]) -> str:
    """The rows as a markdown table, GiB per device."""
    lines = [
        "| model | mesh | state | remat | loss | arguments | outputs | temps | peak | donated: temps | donated: peak "
        "| init peak | estimate | fits 80 GiB | compile s |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for row in rows:
        loss = "dense" if not row["logits_chunk"] else f"chunks of {row['logits_chunk']}"
        if row["monitor_entries"]:
            loss += f", monitor {row['monitor_entries']}"
        model = f"Qwen2.5-{row['model']}" + (", bfloat16 weights" if row["param_dtype"] == "bfloat16" else "")
        if row.get("reference_dtype"):
            model += f", {row['reference_dtype']} reference"
        if row.get("algorithm", "ftw") != "ftw":
            model += f", {row['algorithm']}"
        if row.get("lora_rank"):
            model += f", LoRA rank {row['lora_rank']}"
        placement = {"learn": "as lm learn", "sharded": "all sharded"}.get(row["placement"], row["placement"])
        lines.append(
            f"| {model} | {row['mesh']} | {placement} | {'on' if row['remat'] else 'off'} | "
            f"{loss} | {_gib(row['arguments'])} | {_gib(row['outputs'])} | {_gib(row['temps'])} | "
            f"{_gib(row['peak'])} | {_gib(row.get('donated_temps'))} | {_gib(row.get('donated_peak'))} | "
            f"{_gib(row.get('init_peak'))} | {_gib(row['estimate_per_device'])} | {verdict(row)} | "
            f"{row['compile_seconds'] + row.get('donated_compile_seconds', 0):.0f} |"
        )
    return "\n".join(lines)


def _choices(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    values = [value.strip() for value in text.split(",") if value.strip()]
    for value in values:
        if value not in allowed:
            raise SystemExit(f"{what}: {value!r} is not one of {', '.join(allowed)}.")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument(
        "--mesh", default="auto", help="DATAxMODEL meshes, comma-separated (1x1: one device); auto: 1x1, 7B 2x4"
    )
    parser.add_argument("--placement", default="learn,sharded", help="the state's layout on a mesh: learn, sharded")
    parser.add_argument("--remat", default="on", help="on, off or on,off")
    parser.add_argument("--losses", default="dense,chunked", help="dense, chunked or both")
    parser.add_argument("--chunk", type=int, default=None, help="steps per chunk of the chunked loss (default: auto)")
    parser.add_argument("--monitor-entries", type=int, default=0, help="the trust-region monitor's entries (0: off)")
    parser.add_argument("--param-dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument(
        "--reference-dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="the KL reference's params in this dtype (default: the parameters', as lm learn's init makes them)",
    )
    parser.add_argument(
        "--task", default="lm-learn", help="the update's sizes: lm-learn or retrieval-qa (its defaults)"
    )
    parser.add_argument("--lora-rank", type=int, default=None, help="lm learn's --lora-rank (default: the whole model)")
    parser.add_argument("--algorithms", default="ftw", help="lm learn's --algorithm: ftw, grpo, reinforce, ppo")
    parser.add_argument("--no-donated", action="store_true", help="skip the second compile, with the state donated")
    parser.add_argument("--out", type=pathlib.Path, help="append each row to this JSON Lines file; skip rows in it")
    parser.add_argument("--table", type=pathlib.Path, help="print the table of this JSON Lines file's rows and stop")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    args = parser.parse_args()

    if args.table:
        rows = [json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]
        print(json.dumps(rows, indent=1) if args.json else table(rows))
        return
    models = _choices(args.models, tuple(MODELS), "--models")
    remats = [value == "on" for value in _choices(args.remat, ("on", "off"), "--remat")]
    losses = _choices(args.losses, LOSSES, "--losses")
    placements = _choices(args.placement, PLACEMENTS, "--placement")
    algorithms = _choices(args.algorithms, ("ftw", "grpo", "reinforce", "ppo"), "--algorithms")
    plan = []
    for name in models:
        meshes = [DEFAULT_MESH[name]] if args.mesh == "auto" else [text.strip() for text in args.mesh.split(",")]
        for mesh in meshes:
            data, model = Row(name, mesh).devices
            if data * model > jax.device_count():
                raise SystemExit(f"a {mesh} mesh needs more than the {jax.device_count()} devices here.")
            for placement in placements if data * model > 1 else ["-"]:
                for remat in remats:
                    for loss, algorithm in itertools.product(losses, algorithms):
                        plan.append(
                            Row(
                                model=name,
                                mesh=mesh,
                                placement=placement,
                                remat=remat,
                                loss=loss,
                                chunk=args.chunk if loss == "chunked" else None,
                                monitor_entries=args.monitor_entries,
                                param_dtype=args.param_dtype,
                                reference_dtype=args.reference_dtype,
                                task=args.task,
                                algorithm=algorithm,
                                lora_rank=args.lora_rank,
                            )
                        )
    done = []
    if args.out and args.out.exists():
        done = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    rows, started = [], time.perf_counter()
    for index, settings in enumerate(plan, 1):
        key = dataclasses.asdict(settings)
        label = ", ".join(f"{name} {value}" for name, value in key.items())
        defaults = dataclasses.asdict(Row(settings.model))  # settings added since a row was written: their default
        previous = [row for row in done if all(row.get(name, defaults[name]) == value for name, value in key.items())]
        if previous:
            print(f"[{index}/{len(plan)}] {label}: in {args.out} already", file=sys.stderr)
            rows.append(previous[-1])
            continue
        print(f"[{index}/{len(plan)}] {label}: compiling", file=sys.stderr, flush=True)
        row = measure(settings, donated=not args.no_donated)
        rows.append(row)
        print(
            f"    compiled in {row['compile_seconds']:.1f} s (+{row.get('donated_compile_seconds', 0):.1f} s donated): "
            f"peak {row['peak'] / GIB:.1f} GiB per device, donated {_gib(row.get('donated_peak'))}, "
            f"estimate {row['estimate_per_device'] / GIB:.1f}",
            file=sys.stderr,
            flush=True,
        )
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as file:
                file.write(json.dumps(row) + "\n")
    resident = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(
        f"{len(plan)} rows in {time.perf_counter() - started:.0f} s; this process's peak resident memory "
        f"{resident / GIB:.2f} GiB (nothing was allocated)",
        file=sys.stderr,
    )
    print(json.dumps(rows, indent=1) if args.json else table(rows))


if __name__ == "__main__":
    main()
