"""The default trial starter: each slot's next trial has imported TensorFlow ahead.

Synopsis::

    starter = warm.Warm()
    starter.prepare(env=env, cpus=cpus)   # a process imports TensorFlow now
    proc = starter.start(argv, env=env, stdout=log, stderr=log, cpus=cpus)
    starter.close()                       # ends the unused ones

    python -m looper.sweep.warm           # such a process (reads its argv)

A fresh `python -m looper.main` spends ~4.5 s of a core importing
TensorFlow, Keras and looper before its first step, a third of a 200-step
MNIST trial; in a shell loop those seconds are serial. `prepare` starts a
process that does that import (`console.start`, as looper.main does,
quietly) and then waits on its standard input; `start` hands it the
trial's arguments and log as one JSON line, and it runs `looper.main` as
`python -m` would (`runpy`: exit status, signals and atexit as there). So a
slot's first trial imports while the sweep reads its space, and each next
one while the trial before it trains. Only what a prepared process
reproduces exactly is handed over: `python -m looper.main` with the very
environment and CPUs it was prepared with, and without TensorFlow's
start-up lines (--verbosity); anything else starts as `trials.Popen` does.
"""

import json
import os
import subprocess
import sys

from looper.sweep import trials

MODULE = "looper.main"


class Warm(trials.Popen):
  """A starter with prepared processes (module doc)."""

  def __init__(self):
    self.ready = {}  # (env, cpus) -> a prepared process

  @staticmethod
  def _key(env, cpus):
    return tuple(sorted(env.items())), tuple(cpus or ())

  def prepare(self, *, env, cpus=None) -> None:
    """Starts a process for the next trial with `env` and `cpus`."""
    key = self._key(env, cpus)
    if key not in self.ready:
      self.ready[key] = super().start(
          [sys.executable, "-m", __name__], env=env, stdout=os.devnull,
          stderr=os.devnull, cpus=cpus, stdin=subprocess.PIPE)

  def start(self, argv, *, env, stdout: str, stderr: str, cpus=None):
    from looper import console  # pylint: disable=g-import-not-at-top
    proc = self.ready.pop(self._key(env, cpus), None)
    if (proc is not None and argv[:3] == [sys.executable, "-m", MODULE] and
        stdout == stderr and not console.wants_tensorflow_logs(argv)):
      try:
        proc.stdin.write(json.dumps({"argv": argv[3:], "log": stdout})
                         .encode() + b"\n")
        proc.stdin.close()
        return proc
      except BrokenPipeError:  # it died preparing: start afresh
        pass
    if proc is not None:
      proc.kill()
      proc.wait()
    return super().start(argv, env=env, stdout=stdout, stderr=stderr,
                         cpus=cpus)

  def close(self) -> None:
    """Ends the prepared processes no trial took (they ran nothing)."""
    for proc in self.ready.values():
      proc.kill()
      proc.wait()
    self.ready.clear()


def _serve() -> int:
  """A prepared process (module doc): import, wait, run the trial."""
  # pylint: disable=g-import-not-at-top
  import runpy
  import time
  from looper import console
  from looper.measure import goodput
  # pylint: enable=g-import-not-at-top
  console.start(verbose=False)
  line = sys.stdin.readline()
  if not line:
    return 0  # the sweep ended without a trial for it
  goodput.handed_over = time.monotonic()  # not its wait: the trial's start
  request = json.loads(line)
  sys.stdin.close()  # as a fresh trial's: nothing to read
  os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
  fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  for stream in (1, 2):
    os.dup2(fd, stream)
  os.close(fd)
  sys.argv = [sys.argv[0], *request["argv"]]
  runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
  return 0


if __name__ == "__main__":
  sys.exit(_serve())
