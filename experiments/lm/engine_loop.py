"""A reference engine loop: PyTorch transformers samples episodes, `ftw-jax lm learn` learns from them.

    .venv/bin/python experiments/lm/engine_loop.py                 # builds runs/parity-venv (torch) once
    .venv/bin/python experiments/lm/engine_loop.py --venv PATH     # or an environment that has torch, transformers
    .venv/bin/python experiments/lm/engine_loop.py --venv PATH --out results/engine-loop   # the committed results

Without `--out` the results go to `runs/engine-loop` (git-ignored), beside the scratch files, so that a run
leaves the committed `results/engine-loop/` alone; those (and docs/lm.md's "A reference loop, measured") were
made with `--out results/engine-loop`, as in the last command (then the default: their `command` omits it).

The engine is transformers (torch CPU, in the virtual environment `experiments/lm/lm_parity.py` builds, never a
dependency of the package); the learner is `ftw-jax lm learn`, run as a subprocess with this script's Python.
The task: a tiny random Qwen2 over V = 16 token ids (`ftw_jax.lm.config.tiny_config`, saved by
`ftw_jax.lm.save`), the fixed prompt [1, 2, 3, 4], four generated tokens, reward 1 when the first generated
token is the target id (6; about 1/V by chance at the start). No tokenizer: episodes are token ids.

The engine samples at temperature 1 with top-k 0, top-p 1 and repetition penalty 1 (the plain model's
distribution), and takes each token's behaviour log-prob from `generate(..., output_logits=True)`'s raw logits
through a log-softmax. It loads the newest weights `RUN/weights/latest.json` names and writes that version into
every span. The learner names a version there only once the checkpoint of its iteration is whole on disk, so
before the first iteration's checkpoint the engine plays the starting checkpoint as version 0.

Two loops, the same number of rounds of B episodes each, measured in one run:

- `round`: each round the engine samples B episodes from the newest version and appends them to the file, then
  runs `ftw-jax lm learn --episodes F --model START [--resume RUN]` to completion (a new process each round:
  import, load, compile, rebuild the pool).
- `follow`: one `ftw-jax lm learn ... --follow true` started once; the engine polls `latest.json`, reloads when
  the version changes, samples B, appends them (whole lines). It runs at most `--ahead` rounds ahead of the
  learner (1: it samples round r while the learner learns round r - 1, so episodes arrive one iteration
  stale; 0: it waits for the weights learnt from every earlier round, as the round-by-round loop does). At the
  end the learner is sent SIGTERM and must exit with 143 (128 + SIGTERM: the CLI's interrupt, checkpointed).

Per round: the version the engine sampled with, the reward mean of the round's episodes, the learner's
`pool_staleness_mean`, `elite_staleness_mean`, `elite_log_weight_mean`, `elite_ess_fraction` and `sampler_gap`
from `metrics.jsonl` (the last in the JSON rows alone: the engine's log-probs against the learner's, nats per
token, on episodes of the learner's current version; None where there were none, as when following a version
behind; past `--sampler-gap-limit`, 0.1, the learner stops with exit 3 and the loop with it), and seconds.
The script re-runs itself with the engine's Python (`--worker`), which writes the raw results; this process
writes the starting checkpoint and, from the raw results, the markdown table (stdout and `OUT/engine_loop.md`)
and `OUT/engine_loop.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import time

VOCAB = 16
PROMPT = [1, 2, 3, 4]
NEW_TOKENS = 4
STATS = (
    "pool_staleness_mean", "elite_staleness_mean", "elite_log_weight_mean", "elite_ess_fraction", "sampler_gap"
)  # fmt: skip


def learner_args(args: argparse.Namespace, episodes: pathlib.Path, start: pathlib.Path) -> list[str]:
    """The `lm learn` options both loops share."""
    return [
        "lm", "learn", "--episodes", str(episodes), "--model", str(start),
        "--max-length", str(len(PROMPT) + NEW_TOKENS), "--episodes-per-iteration", str(args.batch),
        "--pool-capacity", str(args.pool), "--num-batches", str(args.num_batches),
        "--batch-size", str(args.minibatch), "--num-elites", str(args.elites),
        "--updates-per-iteration", str(args.updates), "--learning-rate", str(args.learning_rate),
        "--optimizer", "adam", "--save-every", "1", "--seed", str(args.seed),
    ]  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# The engine (runs with the engine's Python: torch and transformers, no jax)


class Engine:
    """transformers' Qwen2 at the newest version `RUN/weights/latest.json` names (the start before the first)."""

    def __init__(self, start: pathlib.Path, target: int, seed: int):
        import torch
        import transformers

        transformers.utils.logging.disable_progress_bar()
        self.torch, self.transformers = torch, transformers
        self.start, self.target, self.seed = start, target, seed
        self.version, self.model = -1, None

    def newest(self, run: pathlib.Path | None) -> tuple[int, pathlib.Path]:
        latest = None if run is None else run / "weights" / "latest.json"
        if latest is None or not latest.exists():
            return 0, self.start
        named = json.loads(latest.read_text())
        return int(named["version"]), run / "weights" / named["path"]  # type: ignore[operator]

    def reload(self, run: pathlib.Path | None) -> float:
        """Loads the newest weights if their version changed; returns the seconds it took (0 if it did not)."""
        version, folder = self.newest(run)
        if version == self.version:
            return 0.0
        started = time.perf_counter()
        model = self.transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=self.torch.float32)
        self.model, self.version = model.eval(), version
        return time.perf_counter() - started

    def sample(self, count: int) -> list[dict]:
        """`count` episodes from the loaded version: tokens, one span with the behaviour log-probs, the reward."""
        torch = self.torch
        assert self.model is not None
        prompt = torch.tensor([PROMPT] * count)
        with torch.no_grad():
            out = self.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                repetition_penalty=1.0,
                max_new_tokens=NEW_TOKENS,
                eos_token_id=None,  # every episode is exactly NEW_TOKENS long
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
        generated = out.sequences[:, len(PROMPT) :]
        logp = torch.stack([torch.log_softmax(step.float(), dim=-1) for step in out.logits], dim=1)
        logp = logp.gather(-1, generated.unsqueeze(-1)).squeeze(-1)  # [count, NEW_TOKENS], raw = sampled
        records = []
        for row in range(count):
            tokens = out.sequences[row].tolist()
            records.append(
                {
                    "tokens": tokens,
                    "spans": [
                        {
                            "start": len(PROMPT),
                            "end": len(tokens),
                            "version": self.version,
                            "logprobs": [min(0.0, value) for value in logp[row].tolist()],
                        }
                    ],
                    "reward": float(tokens[len(PROMPT)] == self.target),
                }
            )
        return records


def append(path: pathlib.Path, records: list[dict]) -> None:
    """Appends whole lines in one write (a follower reads a line once its newline is there)."""
    with path.open("a") as file:
        file.write("".join(json.dumps(record) + "\n" for record in records))
        file.flush()


def metrics_rows(run: pathlib.Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def add_version_times(run: pathlib.Path, rows: list[dict], began: float) -> None:
    """Each round's `written_s`: when the weights learnt from its episodes appeared (the version folder's mtime),
    in seconds since the loop began; `round_s`: since the previous round's (the loop's start for the first)."""
    previous = 0.0
    for row in rows:
        written = (run / "weights" / f"version-{row['learner_version']:06d}").stat().st_mtime - began
        row.update(written_s=written, round_s=written - previous)
        previous = written


def loop_summary(engine: Engine, run: pathlib.Path, rows: list[dict], epoch: float, seconds: float) -> dict:
    """What both loops report: their rows (with each version's time), seconds, versions written, seconds per one."""
    versions = engine.newest(run)[0]
    add_version_times(run, rows, epoch)
    return {"rows": rows, "seconds": seconds, "versions": versions, "seconds_per_version": seconds / versions}


def round_row(number: int, version: int, records: list[dict], metrics: dict | None, seconds: float) -> dict:
    row = {
        "round": number,
        "version_sampled": version,
        "reward_mean": sum(record["reward"] for record in records) / len(records),
        "learner_version": None if metrics is None else metrics["version"],
        "engine_seconds": seconds,
    }
    row.update({name: None if metrics is None else metrics.get(name) for name in STATS})
    return row


def round_by_round(args: argparse.Namespace, start: pathlib.Path, work: pathlib.Path, engine: Engine) -> dict:
    episodes, runs = work / "round.jsonl", work / "runs"
    run = runs / "round"
    engine.torch.manual_seed(engine.seed)  # both loops draw the same first round
    rows, learn_seconds, began, epoch = [], [], time.perf_counter(), time.time()
    for number in range(1, args.rounds + 1):
        round_began = time.perf_counter()
        engine.reload(run if number > 1 else None)
        records = engine.sample(args.batch)
        append(episodes, records)
        command = [args.learner_python, "-m", "ftw_jax.cli", *learner_args(args, episodes, start)]
        command += ["--resume", str(run)] if number > 1 else ["--out", str(runs), "--name", "round"]
        learn_began = time.perf_counter()
        with (work / "round-learn.log").open("a") as log:
            subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)
        learn_seconds.append(time.perf_counter() - learn_began)
        metrics = metrics_rows(run)
        if len(metrics) != number:
            raise SystemExit(f"round {number}: metrics.jsonl has {len(metrics)} rows")
        rows.append(round_row(number, engine.version, records, metrics[-1], time.perf_counter() - round_began))
        print(f"round  {rows[-1]}", flush=True)
    summary = loop_summary(engine, run, rows, epoch, time.perf_counter() - began)
    return {
        **summary,
        "learner_seconds": learn_seconds,
        "learner_seconds_per_version": sum(learn_seconds) / summary["versions"],
    }


def follow(args: argparse.Namespace, start: pathlib.Path, work: pathlib.Path, engine: Engine) -> dict:
    episodes, runs = work / "follow.jsonl", work / "runs"
    run = runs / "follow"
    episodes.touch()
    command = [args.learner_python, "-m", "ftw_jax.cli", *learner_args(args, episodes, start)]
    command += ["--follow", "true", "--poll-seconds", "0.05", "--out", str(runs), "--name", "follow"]
    engine.version = -1  # load the start afresh
    engine.torch.manual_seed(engine.seed)
    began, epoch = time.perf_counter(), time.time()
    log = (work / "follow-learn.log").open("w")
    learner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    rows, waits, records_of = [], [], {}

    def learnt(count: int) -> dict | None:
        """Waits until the learner has learnt `count` batches and named their weights in latest.json (once their
        checkpoint is whole); their last metrics row."""
        while True:
            metrics = metrics_rows(run)
            if len(metrics) >= count and (count == 0 or engine.newest(run)[0] >= metrics[count - 1]["version"]):
                return metrics[count - 1] if count else None
            if learner.poll() is not None:
                raise SystemExit(f"the learner exited with {learner.returncode}; see {log.name}")
            time.sleep(0.02)

    try:
        for number in range(1, args.rounds + 1):
            round_began = time.perf_counter()
            learnt(max(0, number - 1 - args.ahead))
            waits.append(time.perf_counter() - round_began)
            engine.reload(run)
            records_of[number] = engine.sample(args.batch)
            append(episodes, records_of[number])
            rows.append(round_row(number, engine.version, records_of[number], None, time.perf_counter() - round_began))
        last = learnt(args.rounds)
        total = time.perf_counter() - began
        metrics = metrics_rows(run)
    finally:
        if learner.poll() is None:
            learner.send_signal(signal.SIGTERM)
        try:
            code = learner.wait(timeout=120)
        except subprocess.TimeoutExpired:
            learner.kill()
            code = learner.wait()
        log.close()
    if code != 128 + signal.SIGTERM:
        raise SystemExit(f"the learner exited with {code} after SIGTERM, not 143; see {log.name}")
    for row, metric in zip(rows, metrics):
        row.update({"learner_version": metric["version"], **{name: metric.get(name) for name in STATS}})
        print(f"follow {row}", flush=True)
    assert last is not None
    return {
        **loop_summary(engine, run, rows, epoch, total),
        "engine_wait_seconds": waits,
        "learner_exit_code": code,
        "interrupted_cleanly": "interrupted" in (work / "follow-learn.log").read_text(),
    }


def worker(args: argparse.Namespace) -> None:
    import torch
    import transformers

    torch.set_num_threads(1)  # two cores: one for the engine, one for the learner
    work, start = args.work, args.work / "start"
    engine = Engine(start, args.target, args.seed)
    results = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "round": round_by_round(args, start, work, engine),
        "follow": follow(args, start, work, engine),
    }
    (work / "raw.json").write_text(json.dumps(results, indent=2) + "\n")


# ----------------------------------------------------------------------------------------------------------------
# The driver (runs with the project's Python)


def write_start(folder: pathlib.Path, seed: int) -> None:
    import jax
    import jax.numpy as jnp

    from ftw_jax.lm import save
    from ftw_jax.lm.config import tiny_config
    from ftw_jax.lm.model import CausalLM

    config = tiny_config(VOCAB)
    params = CausalLM(config).init(jax.random.key(seed), jnp.zeros((1, len(PROMPT)), jnp.int32))
    save(folder, config, params)


def cell(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(results: dict) -> str:
    lines = [
        "| loop | round | version sampled | reward | pool staleness | elite staleness | elite log w | elite ESS | s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for loop in ("round", "follow"):
        for row in results[loop]["rows"]:
            lines.append(
                f"| {loop} | {row['round']} | {row['version_sampled']} | {row['reward_mean']:.2f} | "
                f"{cell(row['pool_staleness_mean'])} | {cell(row['elite_staleness_mean'])} | "
                f"{cell(row['elite_log_weight_mean'], 3)} | {cell(row['elite_ess_fraction'])} | {row['round_s']:.1f} |"
            )
    lines.append("")
    lines.append("| loop | versions | seconds | s / version | reward, first 3 rounds | reward, last 3 rounds |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    for loop in ("round", "follow"):
        part = results[loop]
        rewards = [row["reward_mean"] for row in part["rows"]]
        lines.append(
            f"| {loop} | {part['versions']} | {part['seconds']:.1f} | {part['seconds_per_version']:.2f} | "
            f"{sum(rewards[:3]) / len(rewards[:3]):.2f} | {sum(rewards[-3:]) / len(rewards[-3:]):.2f} |"
        )
    return "\n".join(lines)


class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, but for those without one (their help says what happens)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    """The options, each with what it sets and its default (the worker's own are hidden)."""
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Writes OUT/engine_loop.json and OUT/engine_loop.md and prints the table; the committed results "
        "were made with --out results/engine-loop (docs/lm.md, 'A reference loop, measured'). The learner's "
        "options: B = --episodes-per-iteration, N = --pool-capacity, J = --num-batches, C = --batch-size, "
        "K = --num-elites, U = --updates-per-iteration (ftw-jax lm learn --help).",
        formatter_class=DefaultsShown,
    )
    path = pathlib.Path
    p.add_argument("--out", type=path, default=path("runs/engine-loop"), help="where the results go (git-ignored)")
    p.add_argument("--engine-python", help="a Python with torch and transformers (default: --venv's, built if missing)")
    p.add_argument("--venv", type=path, default=path("runs/parity-venv"), help="the engine's environment, built once")
    p.add_argument(
        "--scratch", type=path, default=path("runs/engine-loop"), help="checkpoints, episodes, logs (emptied first)"
    )
    p.add_argument("--rounds", type=int, default=10, help="rounds of B episodes, in each loop")
    p.add_argument("--batch", type=int, default=16, help="B, episodes per round (= per learner iteration)")
    p.add_argument("--pool", type=int, default=32, help="N, the pool's capacity")
    p.add_argument("--num-batches", type=int, default=2, help="J, minibatches per update")
    p.add_argument("--minibatch", type=int, default=8, help="C, pool entries drawn per minibatch")
    p.add_argument("--elites", type=int, default=2, help="K, entries kept per minibatch")
    p.add_argument("--updates", type=int, default=2, help="U, updates per iteration (a version each)")
    p.add_argument("--learning-rate", type=float, default=1e-3, help="Adam's learning rate")
    p.add_argument("--ahead", type=int, default=1, help="follow: rounds the engine may run ahead of the learner")
    p.add_argument("--target", type=int, default=6, help="the token id whose generation first is rewarded (< 16)")
    p.add_argument("--seed", type=int, default=0, help="the starting weights', the engine's and the learner's seed")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", type=path, help=argparse.SUPPRESS)
    p.add_argument("--learner-python", help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = parser().parse_args()
    if args.worker:
        worker(args)
        return

    if args.engine_python is None:
        from lm_parity import build_venv

        engine_python = str(build_venv(args.venv.resolve()))
    else:
        engine_python = args.engine_python
    out = args.out.resolve()
    work = args.scratch.resolve()
    if work.exists():
        shutil.rmtree(work)  # a fresh run each time: the episodes files and run folders are appended to
    work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    write_start(work / "start", args.seed)
    started = time.perf_counter()
    forwarded = [arg for arg in sys.argv[1:] if not arg.startswith("--engine-python")]
    if "--engine-python" in sys.argv:
        index = sys.argv.index("--engine-python")
        forwarded = sys.argv[1:index] + sys.argv[index + 2 :]
    env = {**os.environ, "PYTHONPATH": ""}  # the engine's Python imports nothing from the project
    subprocess.run(
        [engine_python, __file__, *forwarded, "--worker", "--work", str(work), "--learner-python", sys.executable],
        check=True,
        env=env,
    )
    results = json.loads((work / "raw.json").read_text())
    results.update(
        {
            "command": " ".join(["python", "experiments/lm/engine_loop.py", *sys.argv[1:]]),
            "settings": {
                key: value
                for key, value in vars(args).items()
                if key not in ("worker", "work", "out", "learner_python")
            },
            "task": {"vocab": VOCAB, "prompt": PROMPT, "new_tokens": NEW_TOKENS, "target": args.target},
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
            "wall_seconds": time.perf_counter() - started,
        }
    )
    results["settings"].update(venv=str(args.venv), scratch=str(args.scratch))
    markdown = table(results)
    (out / "engine_loop.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "engine_loop.md").write_text(markdown + "\n")
    print(markdown)
    print(
        f"\nper version: round by round {results['round']['seconds_per_version']:.2f} s, following "
        f"{results['follow']['seconds_per_version']:.2f} s; all in {results['wall_seconds']:.0f} s"
    )


if __name__ == "__main__":
    main()
