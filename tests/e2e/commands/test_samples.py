"""The sample output README.md shows is what its command prints today.

A sample is a ```text block of log lines (its first: 'HH:MM:SS looper
MODE: ...') after the sh block holding its `looper` command. The test runs
that command shrunk (fewer steps, the same kinds of lines) and compares
line by line: times, rates (and the input-bound advice they give) and
every other number masked (a shrunk run reaches other values, another CPU
other last digits), each run of spaces (right-aligned columns) as one; a
'...' line of the sample stands for any lines of the run. Column widths
are held by test_console and tests/unit/workdir/test_lines.py.
"""

import re
import shlex

import pytest

from tests.fixtures.paths import ROOT
from tests.fixtures.processes import run_ok

pytestmark = pytest.mark.slow  # a process

# README's quickstart sample shrunk: its loops, an evaluation and a save
# between them, the profiler's one-step loops, a last loop, evaluation and
# save, in 40 steps.
# A given peak (its MFU line is masked): a probe on a loaded CPU can read
# below a loop's speed, and the run then prints a line measuring it again.
SHRUNK = ("--config.train.steps=40", "--config.train.steps_per_loop=10",
          "--config.eval.every_steps=20", "--config.checkpoint.every_steps=20",
          "--config.profile.start_step=30", "--config.profile.num_steps=2",
          "--config.train.peak_flops=1e15")


def samples(text: str) -> list[tuple[list[str], list[str]]]:
  """(the `looper` command's words, the sample's lines) of each sample in
  the markdown `text`: the last `looper` command of the sh blocks before
  it."""
  found, command = [], None
  for language, block in re.findall(r"```(\w+)\n(.*?)```", text, re.S):
    if language == "sh":
      joined = block.replace("\\\n", " ").splitlines()
      command = next((shlex.split(l.split("#")[0]) for l in reversed(joined)
                      if l.startswith("looper ")), command)
    elif language == "text" and re.match(r"\d\d:\d\d:\d\d looper ", block):
      found.append((command, block.splitlines()))
  return found


def masked(line: str) -> str:
  """`line` with what differs between runs of one command masked (module
  doc): the measured peak's source and goodput's shares whole."""
  line = re.sub(r"^(  (MFU|goodput) +).*", r"\1<measured>", line)
  line = re.sub(r"\d\d:\d\d:\d\d", "<time>", line)
  line = re.sub(r"\d[\d,.]*(e[+-]?\d+)?k?", "#", line)
  return " ".join(line.split())


def assert_shows(sample: list[str], lines: list[str]) -> None:
  """The sample's lines, masked, are the run's in order; a '...' line
  stands for any lines (none too)."""
  chunks = [[]]
  for line in sample:
    if line == "...":
      chunks.append([])
    else:
      chunks[-1].append(masked(line))
  run = [masked(l) for l in lines]
  at = 0
  for i, chunk in enumerate(chunks):
    if i == 0:  # the run's first lines
      found = 0 if run[:len(chunk)] == chunk else None
    else:
      found = next((j for j in range(at, len(run) - len(chunk) + 1)
                    if run[j:j + len(chunk)] == chunk), None)
    assert found is not None, (
        f"the sample's lines {chunk} are not the run's from its line {at}:"
        f" {run[at:]}")
    at = found + len(chunk)
  assert at == len(run), f"the run goes on after the sample: {run[at:]}"


def test_readme_s_sample_is_what_its_command_prints(tmp_path):
  [(command, sample)] = samples((ROOT / "README.md").read_text())
  assert command[:2] == ["looper", "train_and_eval"], command
  workdir = next(w.split("=", 1)[1] for w in command
                 if w.startswith("--workdir="))
  args = [f"--mode={command[1]}", *(
      w.replace(workdir, str(tmp_path / "run")) for w in command[2:]),
          *SHRUNK]
  stderr = run_ok(*args).stderr.replace(str(tmp_path / "run"), workdir)
  # The input-bound advice (and its wrapped lines) comes of a speed.
  stderr = re.sub(r"^\S+ input-bound: .*\n( {11}.*\n)*", "", stderr,
                  flags=re.M)
  lines = stderr.splitlines()
  assert_shows(sample, lines)
  # The lines a Keras user reads fit 120 columns.
  assert max(len(l) for l in sample if l.startswith("  last eval") or
             re.match(r"\d\d:\d\d:\d\d (train |eval |\s)", l)) <= 120
