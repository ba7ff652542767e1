"""The train split through a tf.data service: other machines' CPUs feed it.

Synopsis::

    # Beside the run (looper.cli.data_service), then train through them:
    looper data_service --role=dispatcher --port=5050
    looper data_service --role=worker --dispatcher=localhost:5050 --port=5051
    looper train --config=... --workdir=... --config.data.service=localhost:5050

    service.check_config(config.data)    # the address; data.bucket refused
    service.check_source(source, config.data)  # array mode, Python ops, zip
    service.wait_ready(address, 60)      # a dispatcher with a worker, or raises
    remote = service.Remote(source, config.data, seed=0, job="looper-...",
                            position=0)
    strategy.distribute_datasets_from_function(
        lambda ctx: remote.train(ctx, batch_size=128))

What runs where: the service's workers run the split's pipeline (read,
parse or decode, shuffle) up to this pipeline's share of a global batch;
the trainer receives those batches and splits them per replica. Processing
mode DYNAMIC, the only one that lets a worker join or leave while a run
trains (OFF gives each worker the whole split, FILE/DATA need a fixed
worker list): the dispatcher hands out the split's pieces (an example of
element mode's source; a file of file mode, each pass in a seeded order) as
workers ask, each once per pass. A worker lost mid-run loses what it held
(at most its buffers); the others go on.

| | through the service | locally |
|---|---|---|
| eval, data position, checkpoints | exact, local-run readable | exact |
| each example per pass | at most once (once without a fault) | once |
| batch composition and order | as the workers deliver | seeded |
| resume | a new pass (no saved iterator) | where it stopped |

Array mode (the arrays would be copied into the graph each worker gets),
`data.bucket` (padding per global batch), Python ops (a worker in another
process cannot run this process's Python) and `Dataset.zip` (DYNAMIC splits
each zipped input on its own: mispaired examples) are refused, one line
each. The job's name is unique per run attempt and per reopening (a name
reused joins the old job's stream) and shared by every worker of a
multi-worker run, which then split one job.
"""

import re
import secrets
import time

import grpc
import ml_collections
import tensorflow as tf

from looper import compat
from looper.data import arrays
from looper.data import checks
from looper.data import shards
from looper.errors import ConfigError

_ADDRESS = re.compile(r"(grpc://)?([\w.-]+|\[[0-9a-fA-F:]+\]):(\d{1,5})")
_ENDLESS = 2**62  # passes of an endless job (tf.data's ranges need an end)
CONTRACT = (
    "data.service={address}: the train split comes from the tf.data service"
    " (job {job}); exact: eval (local), the data position and checkpoints (a"
    " local run reads them); each example at most once per pass (exactly"
    " once without a lost worker); not exact: batch composition and order;"
    " a resume starts a new pass")


def address(data: ml_collections.ConfigDict) -> str:
  """data.service (of the `data` block) as HOST:PORT ('' when the input is
  local)."""
  found = _ADDRESS.fullmatch(data.service)
  return f"{found.group(2)}:{found.group(3)}" if found else ""


def check_config(data: ml_collections.ConfigDict) -> None:
  """data.service (of the `data` block) is HOST:PORT, and no field asks for
  what it cannot.

  Raises:
    ConfigError: a malformed address; data.bucket set.
  """
  value, found = data.service, _ADDRESS.fullmatch(data.service)
  if not found or not 0 < int(found.group(3)) < 65536:
    raise ConfigError(
        f"config.data.service={value!r} is not HOST:PORT; give the address"
        " `looper data_service --role=dispatcher` printed, e.g."
        " --config.data.service=localhost:5050")
  if data.bucket:
    raise ConfigError(
        f"config.data.bucket={data.bucket} pads each global batch to"
        f" its length bucket, which the tf.data service's workers cannot"
        f" (config.data.service={value!r}); set --config.data.bucket=0 or"
        " --config.data.service=''")


def check_source(source, data: ml_collections.ConfigDict) -> None:
  """The train split's source can run on the service's workers.

  Raises:
    ConfigError: array mode, or a pipeline running Python or zipping
      datasets; the line names the split, the cause and the fix.
  """
  split, where = source.split, f"config.data.service={data.service!r}"
  shards_fix = ("write the split as shards (python -m looper.cli.shards write"
                " --config=... --out=DIR) and set --config.data.shards_dir=DIR")
  if isinstance(source, arrays.Arrays):
    raise ConfigError(
        f"{where}: split {split!r} comes as numpy arrays, which would be"
        f" copied into the graph every service worker gets; {shards_fix}, or"
        " set --config.data.service=''")
  ops = checks.ops_in(source.examples())
  python = checks.python_calls(ops)
  if python:
    raise ConfigError(
        f"{where}: split {split!r} (data.train_split) runs Python through"
        f" {' and '.join(python)}, which a service worker in another process"
        f" cannot run; build the pipeline from tf.data and tf ops only, or"
        f" {shards_fix}")
  if "ZipDataset" in ops:
    raise ConfigError(
        f"{where}: split {split!r} (data.train_split) pairs datasets with"
        f" tf.data.Dataset.zip, which the service splits one input at a time"
        f" (examples would be mispaired); make each example from one dataset,"
        f" e.g. from_tensor_slices((x, y)), or {shards_fix}")


def wait_ready(target: str, timeout_secs: float) -> None:
  """Returns once the dispatcher at `target` (HOST:PORT) answers and has a
  worker; one line within `timeout_secs` otherwise (tf.data itself would
  wait an hour for a dispatcher, and forever for a worker).

  Raises:
    ConfigError: nothing answered, something other than a dispatcher
      answered, or the dispatcher has no worker.
  """
  field = f"config.data.service={target!r}"
  deadline = time.monotonic() + timeout_secs
  try:
    compat.ask_dispatcher(target, "GetVersion", timeout_secs)
  except grpc.RpcError as e:
    if e.code() == grpc.StatusCode.UNIMPLEMENTED:
      raise ConfigError(
          f"{field} answers but is not a tf.data dispatcher (a worker's"
          " port?); give the dispatcher's HOST:PORT") from None
    raise ConfigError(
        f"{field}: no tf.data dispatcher answered within"
        f" data.service_timeout_secs={timeout_secs:g}; start one (looper"
        f" data_service --role=dispatcher --port=PORT) or fix"
        f" --config.data.service") from None
  while not compat.ask_dispatcher(
      target, "GetWorkers", max(deadline - time.monotonic(), 0.1)):
    if time.monotonic() >= deadline:
      raise ConfigError(
          f"{field}: the dispatcher has no worker after"
          f" data.service_timeout_secs={timeout_secs:g}; start one (looper"
          f" data_service --role=worker --dispatcher={target} --port=PORT)"
          " or raise --config.data.service_timeout_secs")
    time.sleep(0.1)


def job_name(strategy: tf.distribute.Strategy, opening: int) -> str:
  """A job name no earlier attempt used: random, made by the chief and
  read by the other workers of a multi-worker run (its coordination
  service's key-value store), so they all split one job. `opening` counts
  this process' reopenings (the same on every worker: they reopen in step)."""
  if not compat.in_multi_worker_mode(strategy):
    return f"looper-{secrets.token_hex(8)}"
  chief = strategy.extended.should_checkpoint
  return compat.shared_value(
      f"looper/data_service/job/{opening}",
      f"looper-{secrets.token_hex(8)}" if chief else None)


class Remote:
  """The train split's stream from the service, for one run attempt.

  Args:
    source: the split's source (element or file mode, `check_source`d).
    data: the `data` block (service, shuffle_buffer).
    seed: the run's seed (config.seed).
    job: the job's name (`job_name`); every pipeline of the run shares it.
    position: the data position the stream opens at: it seeds the passes,
      so each attempt shuffles anew.
    passes: how many passes the job makes (None: endless).
  """

  def __init__(self, source, data: ml_collections.ConfigDict, *, seed: int,
               job: str, position: int, passes: int | None = None):
    self.source, self.job = source, job
    self.address = address(data)
    self.shuffle_buffer, self.seed = data.shuffle_buffer, seed
    self.position = position
    self.passes = _ENDLESS if passes is None else passes

  def train(self, ctx: tf.distribute.InputContext, *,
            batch_size: int) -> tf.data.Dataset:
    """This pipeline's per-replica batches: the workers batch its share of a
    global batch, it splits them among its replicas."""
    block = batch_size // ctx.num_input_pipelines
    remote = self.examples().batch(block, drop_remainder=True).prefetch(
        tf.data.AUTOTUNE)  # on the worker: batches ready before asked for
    # Uncompressed: decompressing would cost the trainer's CPUs, which the
    # service is there to spare.
    return remote.apply(tf.data.experimental.service.distribute(
        tf.data.experimental.service.ShardingPolicy.DYNAMIC,
        f"grpc://{self.address}", job_name=self.job,
        compression=None)).rebatch(
            ctx.get_per_replica_batch_size(batch_size),
            drop_remainder=True).prefetch(tf.data.AUTOTUNE)

  def examples(self) -> tf.data.Dataset:
    """What the workers run: `passes` shuffled passes over the examples."""
    buffer = self.shuffle_buffer
    if self.source.size:
      buffer = min(buffer, self.source.size)
    seed = self.seed * 1_000_003 + self.position
    if isinstance(self.source, shards.Files):  # one stream over all passes
      return _shuffled(self._files(seed), buffer, seed)
    # The dispatcher splits the source; each worker shuffles its pieces.
    return _shuffled(self.source.examples(), buffer, seed).repeat(
        self.passes)

  def _files(self, seed: int) -> tf.data.Dataset:
    """File mode: the dispatcher hands out (pass, file) indices, each pass's
    files in an order seeded by (seed, pass); workers read them."""
    paths, files = tf.constant(self.source.paths), len(self.source.paths)
    shuffled = bool(self.shuffle_buffer)

    def path(i):
      index = i % files
      if shuffled:
        index = tf.random.experimental.index_shuffle(
            index, tf.stack([tf.constant(seed, tf.int64), i // files]),
            files - 1)
      return paths[index]

    indices = min(files * self.passes, _ENDLESS)
    # A few files read at once, in parallel and in no fixed order: a
    # worker's reads overlap and its pieces mix.
    return tf.data.Dataset.range(indices).map(path).interleave(
        tf.data.TFRecordDataset, cycle_length=min(files, 4),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=False).map(
            self.source.parse, num_parallel_calls=tf.data.AUTOTUNE)


def _shuffled(dataset: tf.data.Dataset, buffer: int, seed: int
              ) -> tf.data.Dataset:
  # An explicit seed: every worker of a run must send the same graph (a
  # job serves one dataset), and a new attempt (another position) gets
  # another order.
  return dataset.shuffle(buffer, seed=seed) if buffer else dataset
