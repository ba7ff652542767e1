"""tests/fixtures/forks.py: a run forked from the suite's fork server is the
run a fresh `python -m looper.main` makes, its screen too (1 replica, 2
replicas, a TF_CONFIG worker), and its process a Popen's; the server forks
only while TensorFlow's runtime has not started."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from looper.cli import launch
from tests.fixtures import forks
from tests.fixtures.events import curve, scalars
from tests.fixtures.paths import PYTHONPATH, ROOT
from tests.fixtures.processes import LOOPBACK_ENV, looper_lines

pytestmark = [pytest.mark.slow,  # looper in processes
              pytest.mark.skipif(os.environ.get("LOOPER_TEST_FORKS") == "0",
                                 reason="LOOPER_TEST_FORKS=0: no forks")]

RUN = [sys.executable, "-m", "looper.main", "--config=tests/fixtures/tiny.py",
       "--config.train.steps=12", "--config.train.steps_per_loop=4",
       "--config.model.dropout=0.3", "--config.model.keras_random=True"]


def _env(**more):
  return dict(os.environ, PYTHONPATH=PYTHONPATH, **LOOPBACK_ENV, **more)


def masked(stderr: str, workdir) -> str:
  """A run's stderr without what differs between any two runs: clock
  times, the wall time, speeds (and the input-bound hint they give), the
  measured peak, goodput's shares, the workdir, ports and PIDs."""
  text = stderr.replace(str(workdir), "<workdir>")
  for pattern, mask in [
      (r"^\d\d:\d\d:\d\d ", "<time> "),
      # A train row's steps/s and ETA (its last two columns).
      (r"^(<time> train step +\d+/\d+ .*?) +\S+ +\S+$", r"\1 <speed>"),
      # The input-bound advice (its wrapped lines too), given by speed.
      (r"^<time> input-bound: .*\n(           .*\n)*", ""),
      (r" in \d+:\d\d:\d\d \(this attempt", " in <wall> (this attempt"),
      (r"^  (MFU|goodput)( +).*$", r"  \1\2<measured>"),
      (r"127\.0\.0\.1:\d+", "127.0.0.1:<port>"),
      (r"\bpid \d+", "pid <pid>")]:
    text = re.sub(pattern, mask, text, flags=re.M)
  return text


def one_worker(port: int) -> str:
  return json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}"]},
                     "task": {"type": "worker", "index": 0}})


def test_a_forked_run_is_a_fresh_processs_run(tmp_path):
  """Each config forked and fresh, all at once: the same curves and eval,
  the same stderr but for what differs between any two runs."""
  ports = launch.free_ports(2)
  configs = {  # name: (flags, TF_CONFIG of the fresh run, of the forked)
      "one": ((), None, None),
      "two": (("--config.distribution.num_cpu_devices=2",), None, None),
      "worker": (("--config.distribution.strategy=multi_worker",
                  "--config.distribution.network=private"),
                 one_worker(ports[0]), one_worker(ports[1]))}
  procs = {}
  for name, (flags, *tf_configs) in configs.items():
    for kind, tf_config in zip(("fresh", "forked"), tf_configs):
      more = {} if tf_config is None else {"TF_CONFIG": tf_config}
      start = subprocess.Popen if kind == "fresh" else forks.popen
      procs[name, kind] = start(
          [*RUN, *flags, f"--workdir={tmp_path}/{name}-{kind}"], cwd=ROOT,
          env=_env(**more), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          text=True)
  assert isinstance(procs["one", "forked"], forks.Forked)
  ended = {key: proc.communicate(timeout=300)
           for key, proc in procs.items()}
  for (name, kind), proc in procs.items():
    assert proc.returncode == 0, (name, kind, ended[name, kind][1][-2000:])
  for name in configs:
    fresh, forked = tmp_path / f"{name}-fresh", tmp_path / f"{name}-forked"
    # Dropout draws from Keras' seeded generator: the same numbers, bitwise.
    np.testing.assert_array_equal(curve(forked / "train"),
                                  curve(fresh / "train"), err_msg=name)
    assert (scalars(forked / "eval", "loss") ==
            scalars(fresh / "eval", "loss")), name
    (out, err), (fresh_out, fresh_err) = (ended[name, "forked"],
                                          ended[name, "fresh"])
    assert out == fresh_out, name
    assert " train step 12/12 " in err, (name, err[-2000:])
    assert masked(err, forked).splitlines() == masked(
        fresh_err, fresh).splitlines(), name


# In a forked child: no runtime, one thread; then a thread; then an op.
_HAZARDS = """
import threading, time
import tensorflow as tf
from tests.fixtures import forks
threads = forks._threads()
print(forks.fork_hazard(threads))
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
print(forks.fork_hazard(threads))
tf.constant(1.0) + 1
print(forks.fork_hazard(threads))
"""


def test_the_server_forks_only_before_tensorflow_starts():
  """fork_hazard, which the server asks before each fork (refusing it in
  one line otherwise), sees a thread started and an op run."""
  said = forks.run([sys.executable, "-c", _HAZARDS], cwd=ROOT, env=_env(),
                   timeout=120)
  assert said.returncode == 0, said.stderr[-2000:]
  none, thread, runtime = said.stdout.splitlines()
  assert none == "None"
  assert re.fullmatch(r"1 thread\(s\) started in the fork server since its"
                      r" imports \(tids \d+\); start none before forking",
                      thread), thread
  assert runtime == ("TensorFlow's eager context has started in the fork"
                     " server (an op ran); keep ops out of the imports of"
                     " forks.PRELOADED")


def test_exit_codes_signals_and_environment_are_a_processs(tmp_path):
  bad = forks.run([*RUN, "--config.train.steps=-1", f"--workdir={tmp_path}"],
                  cwd=ROOT, env=_env(), timeout=300)
  assert bad.returncode == 1
  assert looper_lines(bad.stderr) == [bad.stderr.splitlines()[-1]]
  assert "train.steps" in bad.stderr.splitlines()[-1]
  code = "import os, sys; print(os.environ['TF_CONFIG'], sys.argv[1:])"
  said = forks.run([sys.executable, "-c", code, "a", "b"], cwd=ROOT,
                   env=_env(TF_CONFIG="{}"), timeout=60)
  assert (said.returncode, said.stdout) == (0, "{} ['a', 'b']\n")
  sleeper = forks.popen([sys.executable, "-c", "import time; time.sleep(60)"],
                        cwd=ROOT, env=_env())
  assert sleeper.poll() is None
  with pytest.raises(subprocess.TimeoutExpired):
    sleeper.wait(timeout=0.1)
  sleeper.kill()
  assert sleeper.wait(timeout=30) == -signal.SIGKILL
  # What a fork would not reproduce (HOME is read at import) is a process.
  other_home = forks.popen([sys.executable, "-c", "pass"], cwd=ROOT,
                           env=_env(HOME=str(tmp_path / "home")))
  assert isinstance(other_home, subprocess.Popen)
  assert other_home.wait(timeout=60) == 0
