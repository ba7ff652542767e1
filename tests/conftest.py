"""Shared test helpers: repo paths, running looper in a process, events."""

import contextlib
import gc
import gzip
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request

from absl import logging as absl_logging
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The real MNIST test set, in the repository (experiments/data/mnist).
MNIST_DIR = ROOT / "experiments" / "data" / "mnist"

# Nothing may leave this machine: TPUClusterResolver and the preemption
# handler probe the GCE metadata server, so point it at a dead loopback port.
LOOPBACK_ENV = {"GCE_METADATA_IP": "127.0.0.1:9",
                "GCE_METADATA_HOST": "127.0.0.1:9",
                "TF_CPP_MIN_LOG_LEVEL": "2"}
os.environ.update(LOOPBACK_ENV)
# TensorFlow counts CPU:0's bytes (tf.config.experimental.get_memory_info,
# reset_memory_stats) only in a BFC allocator: oneDNN's, on by default on
# CPUs with AVX-512 VNNI/BF16 or AMX only (an Intel Xeon, not an AMD EPYC),
# or this one, read when the first CPU device is made: for a fresh process.
MEMORY_STATS_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}


# Freeing a run's TensorFlow objects (tf.data iterators, traced functions)
# stalls for seconds, in a garbage collection inside a later test or at
# exit (measured, 2-core CPU under load: the fast lane 143 s with
# collection, 90 s without; a test alone 1 s that took 19 s in the lane).
# The test session keeps every object to its end and skips the
# interpreter's teardown, where the same frees would stall: pytest's exit
# status is kept and the process ends there, after every report is written.
_SESSION = {}


def pytest_configure(config):  # pylint: disable=unused-argument
  gc.disable()
  # INFO lines, as looper.main sets them for a run: tests that read them
  # (caplog) must not depend on an earlier test having run looper.main in
  # this process (pytest-xdist deals the files to workers in any order).
  absl_logging.set_verbosity(absl_logging.INFO)


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  _SESSION["status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):  # pylint: disable=unused-argument
  if "status" in _SESSION:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_SESSION["status"])


_CAPABILITIES = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}  # capability.h


def lacks(*capabilities: str) -> list[str]:
  """Which of these Linux capabilities this process does not hold: root in
  a container may lack them (a missing prerequisite, where a test skips)."""
  try:
    with open("/proc/self/status") as f:
      held = int(f.read().split("CapEff:")[1].split()[0], 16)
  except (OSError, IndexError):
    return list(capabilities)
  return [c for c in capabilities if not held >> _CAPABILITIES[c] & 1]


def run_looper(*args: str, timeout: float = 300,
               code: str | None = None) -> subprocess.CompletedProcess:
  """Runs `python -m looper.main ARGS` in its own process (own strategy);
  `code`: `python -c CODE ARGS` instead (code that runs looper.main)."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV)
  env.pop("TF_CONFIG", None)
  program = ["-m", "looper.main"] if code is None else ["-c", code]
  return subprocess.run(
      [sys.executable, *program, *args], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=timeout, check=False)


def popen_looper(*args: str, log=None) -> subprocess.Popen:
  """Starts `python -m looper.main ARGS`; end it! Its stderr is piped
  (text), or written to the file `log` (then `proc.log` is that path: a
  pipe nobody reads yet would stall it)."""
  env = dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV)
  env.pop("TF_CONFIG", None)
  if log is None:
    return subprocess.Popen([sys.executable, "-m", "looper.main", *args],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
  with open(log, "w") as f:
    proc = subprocess.Popen([sys.executable, "-m", "looper.main", *args],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=f)
  proc.log = pathlib.Path(log)
  return proc


def checkpoint_tensors(prefix) -> dict[str, np.ndarray]:
  """Every saved value of a checkpoint but its save counter, by key."""
  import tensorflow as tf
  reader = tf.train.load_checkpoint(str(prefix))
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if "save_counter" not in k and k != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def run_ok(*args: str, timeout: float = 300,
           code: str | None = None) -> subprocess.CompletedProcess:
  proc = run_looper(*args, timeout=timeout, code=code)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def run_here(*args: str) -> dict:
  """What `run_ok(*args)` runs, in this process: one replica, no start-up
  of a new TensorFlow (about 3 s a run), for the one-process references.
  `args`: --config=FILE, --config.FIELD=VALUE, --workdir=DIR, --mode=M."""
  import ast  # pylint: disable=g-import-not-at-top
  from looper import names, run  # pylint: disable=g-import-not-at-top
  flags = dict(arg[2:].split("=", 1) for arg in args)
  config = names.resolve(flags.pop("config") + ":get_config", "config")()
  fields = {}
  for name, value in flags.items():
    if name.startswith("config."):
      try:
        fields[name[len("config."):]] = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        fields[name[len("config."):]] = value
  assert "distribution.num_cpu_devices" not in fields, "one replica only"
  return run.run(configured(config, fields), flags["workdir"],
                 flags.get("mode", "train_and_eval"))


def scalars(logdir, tag: str) -> dict[int, float]:
  """{step: value} of a TF2 scalar summary, read back from event files."""
  from tensorboard.backend.event_processing import event_accumulator
  import tensorflow as tf
  acc = event_accumulator.EventAccumulator(
      str(logdir), size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  events = acc.Tensors(tag) if tag in acc.Tags()["tensors"] else []
  # TensorBoard shows every event it keeps: after a replay (resume from an
  # older checkpoint) each step must still have exactly one.
  steps = [e.step for e in events]
  assert len(steps) == len(set(steps)), f"{tag}: a step written twice"
  return {e.step: float(tf.make_ndarray(e.tensor_proto)) for e in events}


def curve(logdir, tag: str = "loss") -> np.ndarray:
  """The per-step values of `tag`, checking that steps are 1..N exactly once."""
  values = scalars(logdir, tag)
  assert sorted(values) == list(range(1, len(values) + 1)), sorted(values)
  return np.array([values[s] for s in sorted(values)])


def configured(config, fields=(), **by_keyword):
  """`config` with fields set as `--config.FIELD=VALUE` sets them.

  `fields` maps dotted names ({"train.steps": 5}); keywords spell the dot
  as "__" (train__steps=5). ml_collections' update_from_flattened_dict
  checks each name and type like the command line does. The one way the
  tests override a config.
  """
  config.update_from_flattened_dict(
      {**dict(fields), **{k.replace("__", "."): v
                          for k, v in by_keyword.items()}})
  return config


@pytest.fixture
def tiny_config():
  from tests import tiny
  return tiny.get_config()


def start_workers(args, num_workers: int, logdir, *, only=None):
  """Starts looper workers of one TF_CONFIG cluster on 127.0.0.1.

  Each worker's stderr goes to `logdir/worker{i}.log` (files, not pipes: a
  full pipe would stall a worker nobody reads yet). `only`: start just
  these task indices (the others never come up). Returns the Popens; end
  them with `finish`.
  """
  from looper.cli import launch
  configs = launch.tf_configs(num_workers)
  procs = []
  for index in (range(num_workers) if only is None else only):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **LOOPBACK_ENV)
    env["TF_CONFIG"] = configs[index]
    with open(pathlib.Path(logdir) / f"worker{index}.log", "w") as log:
      procs.append(subprocess.Popen(
          [sys.executable, "-m", "looper.main", *args], cwd=ROOT, env=env,
          stdout=subprocess.DEVNULL, stderr=log))
    procs[-1].log = pathlib.Path(logdir) / f"worker{index}.log"
  return procs


def wait_for(path, text: str, timeout: float = 120) -> None:
  """Polls the log file `path` until it holds `text`."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if text in path.read_text():
      return
    time.sleep(0.2)
  raise AssertionError(f"{text!r} not in {path}:\n{path.read_text()[-2000:]}")


def looper_lines(log: str) -> list[str]:
  """The one-line errors (`looper: ...`) in a process's stderr."""
  return [l for l in log.splitlines() if l.startswith("looper:")]


# The line a worker ends with when another was killed (errors.cluster_error),
# its cause whichever way the loss reached it first: missed heartbeats, the
# connection to it reset or closed, or, when the killed task's port had
# closed before the next RecvBuf dialled it (seen on a loaded 2-core CPU),
# refused. All are the same event; each names the lost task.
LOST_WORKER_1 = (
    r"looper: lost worker /job:worker/replica:0/task:1 \((it stopped sending"
    r" heartbeats|Connection reset by peer|Socket closed|Connection"
    r" refused)\); this worker stopped too. Restart all workers with the"
    r" same command to resume from the last checkpoint")


def finish(procs, timeout: float) -> list[str]:
  """Waits for every process (killing all at `timeout`); returns the logs."""
  import time
  deadline = time.monotonic() + timeout
  try:
    for proc in procs:
      proc.wait(timeout=max(1.0, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:
    pass  # killed below; the caller's asserts on returncode say so
  finally:
    for proc in procs:
      proc.kill()
      proc.wait()
  return [proc.log.read_text() for proc in procs]


# Runs in a fresh interpreter outside the repo: only TensorFlow is there.
_SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
x = np.load(sys.argv[2])
_, kwargs = serve.structured_input_signature
out = {"input": [kwargs["inputs"].shape.as_list(), kwargs["inputs"].dtype.name],
       "looper_imported": any(m.startswith("looper") for m in sys.modules)}
for n in (1, 7, 64):
  out[n] = serve(inputs=tf.constant(x[:n]))["logits"].numpy().tolist()
print(json.dumps(out))
"""


def serve_in_fresh_process(export_dir, x, tmp_path) -> dict:
  """An export's logits for x[:1], x[:7], x[:64] (keys '1', '7', '64'), its
  input [shape, dtype] and whether looper got imported, from a process
  with TensorFlow only (no PYTHONPATH, cwd outside the repo)."""
  np.save(pathlib.Path(tmp_path) / "x.npy", x)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  proc = subprocess.run(
      [sys.executable, "-c", _SERVE, str(export_dir),
       str(pathlib.Path(tmp_path) / "x.npy")],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
      check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.splitlines()[-1])


def restored_trainer(config, prefix):
  """A one-device Trainer of `config` holding checkpoint `prefix`."""
  from looper.workdir import checkpoint  # pylint: disable=g-import-not-at-top
  from looper.train import distribute  # pylint: disable=g-import-not-at-top
  from looper import names  # pylint: disable=g-import-not-at-top
  from looper import workdir  # pylint: disable=g-import-not-at-top
  trainer = names.resolve(config.trainer, "trainer")(
      config, distribute.strategy_for(config))
  ckpt = checkpoint.Checkpointer(
      workdir.Workdir(str(pathlib.Path(prefix).parents[1])),
      trainer.checkpoint_items(), keep=3, chief=True, task_id=0)
  assert ckpt.restore(str(prefix)) == str(prefix)
  return trainer


@pytest.fixture
def no_network(monkeypatch):
  """Fails the test on any download attempt (urllib, which Keras uses)."""
  import urllib.request  # pylint: disable=g-import-not-at-top

  def fail(*args, **kwargs):
    raise AssertionError(f"unexpected download: {args} {kwargs}")
  monkeypatch.setattr(urllib.request, "urlopen", fail)


@contextlib.contextmanager
def loopback_server(directory):
  """Serves `directory` over HTTP on 127.0.0.1; yields its base URL."""
  import http.server  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top

  class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, directory=str(directory), **kwargs)

    def log_message(self, *args):  # keep pytest's output clean
      pass

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def tensorboard_server(logdir):
  """TensorBoard serving `logdir` on 127.0.0.1 at a port it picks; yields
  its URL; the process is ended by PID however the test ends."""
  proc = subprocess.Popen(
      [sys.executable, "-m", "tensorboard.main", f"--logdir={logdir}",
       "--host=127.0.0.1", "--port=0"],
      env=dict(os.environ, **LOOPBACK_ENV), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)
  try:
    deadline, output = time.monotonic() + 120, []
    while time.monotonic() < deadline:
      line = proc.stdout.readline()  # TensorBoard prints its URL, or dies
      output.append(line)
      found = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
      if found or not line:
        break
    assert found, "".join(output)[-2000:]
    yield found.group(1)
  finally:
    proc.kill()
    proc.wait()


def fetch(url, path, body=None):
  """The JSON at `url + path` (POSTed `body` if given)."""
  request = urllib.request.Request(
      url + path, data=None if body is None else json.dumps(body).encode(),
      headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(request, timeout=60) as response:
    data = response.read()
    if response.headers.get("Content-Encoding") == "gzip":  # the profile's
      data = gzip.decompress(data)
    return json.loads(data)


# Three loops of 6000 tiny steps (under a second each on an AMD EPYC): a
# stop lands inside the third, which must end at once rather than finish.
STOPPED_RUN = ("--config=tests/tiny.py", "--config.train.steps=18000",
               "--config.train.steps_per_loop=6000",
               "--config.checkpoint.every_steps=0",
               "--config.eval.every_steps=0")


@pytest.fixture(scope="session")
def unstopped(tmp_path_factory):
  """The workdir of STOPPED_RUN run to its end, once a session."""
  whole = tmp_path_factory.mktemp("unstopped")
  run_here(*STOPPED_RUN, f"--workdir={whole}")
  return whole


def stop_and_resume(tmp_path, whole, stop, reason: str,
                    before_resume=None) -> int:
  """STOPPED_RUN stopped by `stop(proc)` inside its third loop, then
  resumed (after `before_resume()`, if given): exit 0 with one "Stopped by
  `reason`" line and a save at that step, the resumed run equal to `whole`
  (`unstopped`: every step's loss, the last checkpoint), and the stop in
  the goodput records (nothing recomputed). Returns the step it stopped
  at."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from looper import workdir  # pylint: disable=g-import-not-at-top
  from looper.train import goodput  # pylint: disable=g-import-not-at-top
  from looper.workdir import jsonl  # pylint: disable=g-import-not-at-top
  args, split = STOPPED_RUN, tmp_path / "split"
  proc = popen_looper(*args, f"--workdir={split}")
  try:
    for line in proc.stderr:
      # After the second loop: the first loop's end also traces the summary
      # writers, which on a busy machine can hold the next loop's start
      # past the stop (a stop between loops, not the cut this checks).
      if "train step 12000/18000" in line:
        break
    # Half a loop into the third at the second's speed on this CPU, as its
    # metrics line (written before the progress line) has it; the third
    # starts right after the progress line.
    loop2 = [l for l in jsonl.read(str(split / "metrics.jsonl"))
             if l["kind"] == "train" and l["step"] == 12000]
    assert loop2, "no metrics line of step 12000: the run ended"
    time.sleep(0.5 * 6000 / loop2[0]["steps_per_sec"])
    sent = time.monotonic()
    stop(proc)
    rest = proc.communicate(timeout=120)[1]
    seconds = time.monotonic() - sent
  finally:
    proc.kill()
  assert proc.returncode == 0, rest[-2000:]
  stopped = [l for l in rest.splitlines() if "Stopped by" in l]
  assert len(stopped) == 1, rest[-2000:]
  assert f"Stopped by {reason} at step " in stopped[0]
  step = int(stopped[0].split(" at step ")[1].split(";")[0])
  assert 12000 < step < 18000, step  # cut inside the third loop
  prefix = split / "checkpoints" / f"ckpt-{step}"
  assert f"saved {prefix};" in stopped[0]
  assert tf.train.latest_checkpoint(str(split / "checkpoints")) == str(prefix)
  print(f"{reason} to exit: {seconds:.2f} s, stopped at step {step}")

  if before_resume:
    before_resume()
  run_ok(*args, f"--workdir={split}")
  np.testing.assert_array_equal(curve(split / "train"), curve(whole / "train"))
  want = checkpoint_tensors(whole / "checkpoints" / "ckpt-18000")
  got = checkpoint_tensors(split / "checkpoints" / "ckpt-18000")
  assert sorted(want) == sorted(got)
  for key in want:
    np.testing.assert_array_equal(want[key], got[key], err_msg=key)
  first, second = goodput.read(workdir.Workdir(str(split)))
  assert (first["ended"], first["reached"]) == (f"stopped by {reason}", step)
  assert (second["first_step"], second["steps"],
          second["recomputed_steps"]) == (step, 18000 - step, 0)
  return step
