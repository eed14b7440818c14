"""Stop signals obeyed at every phase, within seconds, in one line: the watcher on its own (a main thread that never
reaches a boundary, one that does, a second signal), then the command line while JAX loads and while `train`,
`compare`, `sweep`, `lm learn` and `lm retrieval-qa` compile (a run stopped while it writes a checkpoint:
tests/test_faults.py)."""

import json
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

from ftw_jax import cli

WATCHED = """
import sys, threading, time
from ftw_jax.running import signals

with signals.watching() as watcher:
    watcher.grace = lambda: float(sys.argv[1])
    watcher.finish = lambda signum: print("finished after", signum, flush=True)
    print("ready", flush=True)
    if sys.argv[2] == "stuck":  # never at a boundary, as a main thread in XLA (compiling, a long period)
        threading.Event().wait()
    try:
        while True:
            signals.raise_if_stopped()
            time.sleep(0.01)
    except signals.Interrupted as stop:
        time.sleep(0.5)  # for a second signal to arrive meanwhile
        print("stopped at a boundary by", stop.signum, flush=True)
        sys.exit(128 + stop.signum)
"""


def watched(grace: float, main_thread: str, *sent: int) -> tuple[float, subprocess.CompletedProcess]:
    """A process that takes the stop signals and then waits (`main_thread`: "stuck" or at a boundary), sent
    `sent` 50 ms apart once ready: (seconds from the first signal to its end, what it did)."""
    process = subprocess.Popen(
        [sys.executable, "-c", WATCHED, str(grace), main_thread], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    started = time.monotonic()
    for signum in sent:
        process.send_signal(signum)
        time.sleep(0.05)
    out, err = process.communicate(timeout=30)
    done = subprocess.CompletedProcess(process.args, process.returncode, out.decode(), err.decode())
    return time.monotonic() - started, done


def test_a_main_thread_that_reaches_no_boundary_is_ended_by_the_watcher_after_the_grace():
    seconds, done = watched(1.0, "stuck", signal.SIGTERM)
    assert (done.returncode, done.stdout, done.stderr) == (143, "finished after 15\n", "")
    assert 0.9 < seconds < 5


def test_a_second_signal_ends_it_without_the_grace():
    seconds, done = watched(60.0, "stuck", signal.SIGINT, signal.SIGINT)
    assert (done.returncode, done.stdout, done.stderr) == (130, "finished after 2\n", "")
    assert seconds < 5


def test_a_main_thread_at_a_boundary_stops_there_and_a_second_signal_raises_nothing():
    _, done = watched(60.0, "at a boundary", signal.SIGINT, signal.SIGINT)
    assert (done.returncode, done.stdout, done.stderr) == (130, "stopped at a boundary by 2\n", "")


def test_importing_the_package_takes_no_signal_nor_jax_and_main_gives_them_back(tmp_path, capsys):
    probe = "import signal, sys, ftw_jax.cli; print('jax' in sys.modules, signal.getsignal(signal.SIGTERM) == 0)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout == "False True\n"  # SIG_DFL
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert cli.main(["train", "--env", "bandit", "--kl-coef-final", "nan", "--out", str(tmp_path)]) == 2
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert signal.set_wakeup_fd(-1) == -1  # none left set
    assert "error:" in capsys.readouterr().err


class Command:
    """`ftw-jax ARGS` in a process of its own; its stderr read as it comes, `waited_for` a line of it."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ftw_jax.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    def waited_for(self, start: str, seconds: float = 300) -> None:
        deadline = time.monotonic() + seconds
        while not any(line.startswith(start) for line in self.lines):
            assert self.process.poll() is None and time.monotonic() < deadline, "".join(self.lines)
            time.sleep(0.01)

    def stopped(self, signum: int) -> tuple[float, int, str]:
        """Sends `signum`: (seconds to the process's end, its exit status, its stderr from then on)."""
        seen = len(self.lines)
        started = time.monotonic()
        self.process.send_signal(signum)
        self.process.wait(timeout=60)
        seconds = time.monotonic() - started
        # stderr is the reader's to the end: `communicate` would read it too, and take lines the reader had not
        # reached yet (on a loaded machine, all of them)
        self.reader.join(timeout=10)
        assert self.process.stdout is not None and self.process.stderr is not None
        self.process.stdout.close()
        self.process.stderr.close()
        return seconds, self.process.returncode, "".join(self.lines[seen:])


def signal_caught(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (Linux: /proc/PID/status)."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (signum - 1) & 1)


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(), reason="reads /proc")
def test_a_stop_while_jax_loads_ends_at_once_in_one_line(tmp_path):
    command = Command("train", "--env", "bandit", "--out", str(tmp_path))
    while not signal_caught(command.process.pid, signal.SIGTERM):  # taken by main, which imports JAX next
        assert command.process.poll() is None
        time.sleep(0.005)
    seconds, status, err = command.stopped(signal.SIGINT)
    assert (status, err, command.lines) == (130, "\ninterrupted\n", ["\n", "interrupted\n"])
    assert seconds < 5
    assert list(tmp_path.iterdir()) == []  # no run folder was made


TRAIN = ["train", "--env", "bandit", "--seeds", "0,1", "--iterations", "8", "--eval-every", "2", "--no-plot", "--json"]


@pytest.mark.slow
def test_a_train_stopped_while_compiling_ends_within_seconds_and_resumes(tmp_path, capsys):
    folder = tmp_path / "run"
    command = Command(*TRAIN, "--no-compile-cache", "--out", str(tmp_path), "--name", "run")
    command.waited_for("training bandit")  # then it compiles
    seconds, status, err = command.stopped(signal.SIGTERM)
    assert status == 143 and "Traceback" not in err and not any("compiled in" in line for line in command.lines)
    assert seconds < 10
    assert not (folder / ".lock").exists()
    resume = err.strip().splitlines()[-1].strip()
    assert resume.startswith("ftw-jax train") and resume.endswith(f"--resume {folder}")
    assert cli.main(resume.split()[1:]) == 0
    assert json.loads(capsys.readouterr().out)["iterations"] == 8


def lm_learn_files(folder: pathlib.Path) -> list[str]:
    """`lm learn`'s flags for a tiny random model over the text search task's words and 8 episodes of it."""
    import jax
    import jax.numpy as jnp

    from ftw_jax.envs.text_search import TextSearchTask
    from ftw_jax.lm.config import tiny_config
    from ftw_jax.lm.load import save
    from ftw_jax.lm.model import CausalLM

    task = TextSearchTask(step_limit=48)
    config = tiny_config(task.vocabulary_size)
    save(folder / "model", config, CausalLM(config).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
    task.tokenizer().backend.save(str(folder / "model" / "tokenizer.json"))
    span = {"start": 3, "end": 6, "version": 0, "logprobs": [-0.5, -1.0, -0.1]}
    lines = [{"tokens": [1, 9, 10, 7, 30, 8], "spans": [span], "reward": i % 2, "id": str(i)} for i in range(8)]
    (folder / "episodes.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    flags = ["--episodes", str(folder / "episodes.jsonl"), "--model", str(folder / "model")]
    flags += ["--max-length", str(task.max_steps + 1), "--episodes-per-iteration", "8", "--pool-capacity", "16"]
    flags += ["--sampler-gap-limit", "0"]  # made-up log-probs
    return [*flags, "--num-batches", "4", "--batch-size", "4", "--num-elites", "1", "--monitor-entries", "4"]


def lm_train_files(folder: pathlib.Path) -> list[str]:
    """`lm retrieval-qa` flags over a small world in Search-R1's formats and a tiny chat checkpoint."""
    from ftw_jax.agent.retrieval_qa.synthetic import tokenizer_texts, write_synthetic
    from ftw_jax.lm.tiny import write_tiny_checkpoint

    paths = write_synthetic(folder / "world", people=40, distractors=20, seed=1)
    model = write_tiny_checkpoint(folder / "model", tokenizer_texts(paths, ("train_jsonl",)), 600)
    flags = ["--model", str(model), "--questions", str(paths["train"])]
    flags += ["--test-questions", str(paths["test"]), "--corpus", str(paths["corpus"]), "--response-tokens", "12"]
    flags += ["--information-tokens", "48", "--prompt-tokens", "256", "--episodes-per-iteration", "4"]
    return [*flags, "--pool-capacity", "8", "--num-batches", "2", "--batch-size", "4", "--eval-questions", "4"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "compiles_after"),
    [
        (["compare", "--env", "bandit", "--algos", "ftw,ppo", "--seeds", "0", "--eval-every", "4"], "comparing"),
        (["sweep", "--env", "cartpole", "--grid", "C=4,8 K=1,2", "--iterations", "6", "--eval-every", "3"], "sweep"),
        (["lm", "learn"], "learning from"),
        (["lm", "retrieval-qa"], "iteration    0  test exact match"),  # the rollout and update compile next
    ],
    ids=["compare", "sweep", "lm learn", "lm retrieval-qa"],
)
def test_a_command_stopped_while_compiling_ends_within_seconds_resumable(command, compiles_after, tmp_path):
    if command == ["lm", "learn"]:
        command = [*command, *lm_learn_files(tmp_path)]
    if command == ["lm", "retrieval-qa"]:
        command = [*command, *lm_train_files(tmp_path)]
    folder = tmp_path / "run"
    running = Command(*command, "--no-compile-cache", "--json", "--out", str(tmp_path), "--name", "run")
    running.waited_for(compiles_after)
    seconds, status, err = running.stopped(signal.SIGTERM)
    assert status == 143 and "Traceback" not in err, err
    assert seconds < 10
    assert not (folder / ".lock").exists() and (folder / "config.json").exists()
    assert err.strip().splitlines()[-1].strip().endswith(f"--resume {folder}")
