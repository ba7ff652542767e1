"""A run's input: the splits' sources, the data position, train and eval data.

Synopsis::

    batch = batch_lib.of(config.train, config.eval,
                         strategy.num_replicas_in_sync)
    input = Input(config.data, strategy, batch, seed=config.seed,
                  dataset_fn=references.bound(config, "dataset_fn"))
                                         # data.*: batches of `batch`
    input.examples("test")               # one checked pass of (inputs, label)
    input.size("train")                  # examples in one pass (counted once)
    input.check_slice("test[:50%]")      # holds that slice of 'test', or
                                         # one line naming its field
    input.short_split("train")           # a warning: a batch repeats examples
    input.eval_sets                      # {set name: split} (data.eval_splits)
    input.field("test[:50%]")            # 'data.eval_split': what names it
    input.faster()                       # what to try if training waits
    batches = input.train_iterator()     # per-replica train batches, from
                                         # the data position on; kept
    input.advance(batches=k)             # in the loop: k batches consumed
    input.seek(position)                 # reopen at `position` examples
    count, steps, data = input.eval_data("test")  # one eval pass, repeated

The data position is the count of global train examples consumed: a
variable the checkpoint holds (`checkpoint_items`), so a resumed run opens
the stream where it stopped, on any replica and worker count (every mode
of `sources` resumes from it). This is the only object that calls
`config.dataset_fn`; the Trainer, the Evaluator and the checks before a run
(`dry_run`, `describe`, `tpu_check`, `export`) read the data through it.
It knows no model or optimizer; its batch sizes are the run's `Batch`
(looper.data.batch), given to it: it reads its block, `data` (declared
here: `config()`, checked here: `check`), and is given the seed and the
experiment's dataset_fn with its config bound (the one hook that takes
the whole config: `dataset_fn(config, split)`).

With config.data.service set, the train stream comes from a tf.data
service (`service`): a new job each time it opens, at most once per pass,
a resume starting a new pass; the position still counts, eval stays here.
"""

from typing import Callable

from absl import logging
import ml_collections
import tensorflow as tf

from looper import compat
from looper import fields
from looper.data import batch as batch_lib
from looper.data import checks
from looper.data import elements
from looper.data import service
from looper.data import sources
from looper.data import splits
from looper.errors import ConfigError


def config() -> ml_collections.ConfigDict:
  """The `data` block: each field's default (its doc above it)."""
  c = ml_collections.ConfigDict()
  c.dir = ""  # where the experiment's dataset_fn reads its files
  c.train_split = "train"
  c.eval_split = "test"
  # Eval sets {name: split}, each exact, logged '<name>/<metric>' (see
  # looper.data.splits); replaces eval_split (leave it 'test' or '').
  c.eval_splits = fields.object_field(None)
  c.shuffle_buffer = fields.whole(10_000, low=0)  # 0: keep the dataset's order
  # Read each split from shards_dir/<split>, written by `python -m
  # looper.cli.shards write`, instead of calling dataset_fn (file mode).
  c.shards_dir = ""
  # File mode: the files are dealt into this many fixed groups; a global
  # batch takes train.batch_size / virtual_shards examples from each, so it
  # is the same on any topology whose replica count divides this.
  c.virtual_shards = fields.whole(64)
  c.cache = fields.boolean(False)  # file mode: keep parsed examples in memory
  # Element mode, examples whose inputs vary in length (a dimension of
  # unknown size): a global batch takes examples of one length bucket and
  # is padded to it, a multiple of this many; at most max length / bucket
  # shapes (XLA programs). 0: every example has one static shape.
  c.bucket = fields.whole(0, low=0)
  # Train-time weight of each class id, multiplied into the examples' own
  # sample weights: a sequence by class id, or a dict {id: weight} (others
  # 1). Empty: off. Eval is not rebalanced (as in Keras).
  c.class_weights = fields.object_field(())
  # Train from the tf.data service with this dispatcher (looper.data.service).
  c.service = ""  # HOST:PORT; '': the train input runs here
  c.service_timeout_secs = fields.seconds(60, positive=True)  # wait at start
  return c


def check(data: ml_collections.ConfigDict) -> None:
  """The `data` block's own rules (the eval sets against eval.monitor_set
  and the loss's outputs span blocks: looper.config); ConfigError on the
  first."""
  fields.check_declared(data, "data")
  weights = data.class_weights
  values = list(weights.values()) if isinstance(weights, dict) else weights
  fields.check(isinstance(weights, (dict, tuple, list)) and
               all(fields.number(v) and 0 <= v < float("inf")
                   for v in values) and
               (not isinstance(weights, dict) or
                all(str(k).isdigit() for k in weights)),
               "data.class_weights", weights,
               "give a weight >= 0 per class id: a sequence (1.0, 5.0) or a"
               " dict {1: 5.0}")
  splits.parse_split(data.train_split, "data.train_split")


class Input:
  """The data a run reads (see module doc).

  Args:
    data: the `data` block.
    strategy: the run's strategy.
    batch: the run's batch sizes (train batches of micro_batch_size, eval
      of eval_batch_size, eval_steps at most per pass).
    dataset_fn: fn(split) -> the split's examples: the experiment's
      dataset_fn with its config bound (`references.bound(config,
      "dataset_fn")`), as the Run gives it.
    seed: the run's seed (config.seed): the train order's.
  """

  def __init__(self, data: ml_collections.ConfigDict,
               strategy: tf.distribute.Strategy, batch: batch_lib.Batch, *,
               dataset_fn: Callable[[str], tf.data.Dataset], seed: int = 0):
    self._data = data
    self.strategy = strategy
    self.batch = batch
    self._dataset_fn = dataset_fn
    self._seed = seed
    self._sources = {}  # split -> its input source, made once
    self._sizes = {}  # split -> its examples, counted once if need be
    self._iterator = None  # opened by train_iterator() at the position
    self._openings = 0  # train streams opened: tf.data service jobs named
    if data.service:
      service.check_config(data)
    with strategy.scope():
      self.position = tf.Variable(
          0, name="position", dtype=tf.int64, trainable=False,
          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  def source(self, split: str) -> sources.Source:
    """`split`'s input source (see `sources`): what dataset_fn returned."""
    if split not in self._sources:
      self._sources[split] = sources.make(
          split, self.field(split), self._data,
          lambda: self._dataset_fn(split))
      if self._data.service and split == self._data.train_split:
        service.check_source(self._sources[split], self._data)
    return self._sources[split]

  @property
  def train_split(self) -> str:
    """The split training reads (data.train_split)."""
    return self._data.train_split

  @property
  def eval_sets(self) -> dict[str, str]:
    """{set name: split} (looper.data.splits): the eval sets it reads."""
    return splits.sets_of(self._data)

  def field(self, split: str) -> str:
    """The config field naming `split` ('data.train_split'), for errors."""
    return splits.field_of(self._data, split)

  def size(self, split: str, *, recount: bool = False) -> int:
    """Examples in one pass over `split`: its source's, or counted by one
    pass (element mode) the first time it is asked for, or again with
    `recount` (a pass held other examples than counted)."""
    if recount or split not in self._sizes:
      self._sizes[split] = self.source(split).size or checks.num_examples(
          self.examples(split), split, self.field(split))
    return self._sizes[split]

  def check_slice(self, split: str, *, count: bool = True) -> None:
    """Raises ConfigError (one line naming the field) if `split`, named with
    a slice ('test[:50%]'), does not hold that slice's count of examples of
    its split ('test'): a dataset_fn that loads a split by its name alone
    returns all of it under every slice's name. dataset_fn slices (TFDS
    does, and `splits.split_slice` for arrays); this counts both.
    `count=False`: not if counting `split` takes a pass (element mode's
    train split: a pass over the train data only for this). Not in file
    mode, whose slices may be of files (experiments/tfrecord_images.py),
    and whose data.shards_dir holds what was written under each name."""
    name, start, stop = splits.parse_split(split)
    if ((start, stop) == (None, None) or self.source(split).mode == "file" or
        not (count or self._known_size(split))):
      return
    field = self.field(split)
    whole = self._known_size(name)
    if whole is None and not count:
      return  # the whole split too would take a pass
    whole = whole or self.size(name)
    if name not in (self._data.train_split, *self.eval_sets.values()):
      self._sources.pop(name, None)  # only its size was needed
    want = len(range(whole)[splits.split_slice(split, whole, field)[1]])
    got = self._known_size(split) or self.size(split)
    if got != want:
      raise ConfigError(
          f"config.{field}={split!r} holds {got} examples, but that slice of"
          f" the {whole} in {name!r} holds {want}; make config.dataset_fn"
          " return only the slice, e.g. x[lc.split_slice(split, len(x))[1]]"
          " (README: 'An experiment is one file')")

  def short_split(self, split: str) -> str:
    """One warning line if an update holds more examples than the train
    split `split` has, so each repeats some (its size if known without a
    pass: the source's, counted, or tf.data's cardinality); else ''."""
    size = self._known_size(split)
    update = self.batch.global_batch_size
    if size is None or size >= update:
      return ""
    batch = ("train.batch_size" if self.batch.accum_steps == 1 else
             f"train.batch_size={self.batch.micro_batch_size} x"
             f" train.grad_accum_steps={self.batch.accum_steps}")
    return (f"config.{self.field(split)}={split!r} holds"
            f" {size} examples, fewer than one update's {update} ({batch}):"
            " every update repeats examples; lower --config.train.batch_size"
            " or widen the split")

  def _known_size(self, split: str) -> int | None:
    """`split`'s size if known without a pass: counted, the source's, or
    tf.data's cardinality."""
    return (self._sizes.get(split) or self.source(split).size or
            max(int(self.examples(split).cardinality()), 0) or None)

  def faster(self) -> str:
    """What to try when training waits for its batches, in the train
    input's mode (sources.FASTER)."""
    if self._data.service:
      return sources.FASTER["service"]
    return sources.FASTER[self.source(self._data.train_split).mode]

  def examples(self, split: str) -> tf.data.Dataset:
    """One pass over `split` as (inputs, label) examples, checked."""
    return checks.checked(self.source(split).examples(), split,
                          variable=bool(self._data.bucket))

  @property
  def element_spec(self):
    """The train examples' (inputs, label[, weight]) spec."""
    return self.examples(self._data.train_split).element_spec

  # --- Train ------------------------------------------------------------------

  @property
  def data_position(self) -> int:
    """Global train examples consumed (restored with the checkpoint)."""
    return int(self.position.numpy())

  def checkpoint_items(self) -> dict:
    return {"position": self.position}

  def train_data(self) -> tf.distribute.DistributedDataset:
    """Distributed train batches (each a micro-batch: batch.micro_batch_size
    over all replicas), from the position on."""
    data = self._data
    source = self.source(data.train_split)
    source.check(self.batch.replicas, self.batch.micro_batch_size,
                 "train.batch_size")
    position = self.data_position
    if data.service:
      return self._from_service(source, position)
    return self.strategy.distribute_datasets_from_function(
        lambda ctx: self._endless(source.train(
            ctx, batch_size=self.batch.micro_batch_size, seed=self._seed,
            shuffle_buffer=data.shuffle_buffer, position=position)))

  def _from_service(self, source, position: int):
    """The train batches from the tf.data service (see `service`): a new
    job each time the stream opens; eval stays here."""
    address = service.address(self._data)
    service.wait_ready(address, self._data.service_timeout_secs)
    job = service.job_name(self.strategy, self._openings)
    self._openings += 1
    logging.info("%s", service.CONTRACT.format(address=address, job=job))
    remote = service.Remote(source, self._data, seed=self._seed, job=job,
                            position=position)
    return self.strategy.distribute_datasets_from_function(
        lambda ctx: self._endless(remote.train(
            ctx, batch_size=self.batch.micro_batch_size)))

  def train_iterator(self):
    """The train batches' iterator, opened at the position on first use and
    kept (each `next` moves it on; `advance` records that)."""
    if self._iterator is None:
      self._iterator = iter(self.train_data())
    return self._iterator

  def advance(self, batches) -> None:
    """Records `batches` train batches consumed (in a tf.function too)."""
    self.position.assign_add(
        tf.cast(batches, tf.int64) * self.batch.micro_batch_size)

  def seek(self, position: int) -> None:
    """Reopens the train stream at `position` global examples."""
    self.position.assign(position)
    self._iterator = None

  # --- Eval -------------------------------------------------------------------

  def eval_data(self, split: str, *, recount: bool = False
                ) -> tuple[int, int, tf.distribute.DistributedDataset]:
    """(count, steps, data): one eval pass over `split` (an eval set's) is
    `steps` batches of batch.eval_batch_size, holding `count` real examples
    (the rest padding with mask 0); `data` repeats the pass without end.
    `recount`: count the split again, not the size counted before (see
    `size`)."""
    source = self.source(split)
    count, steps = elements.eval_plan(
        self.size(split, recount=recount), self.batch.eval_batch_size,
        self.batch.eval_steps)
    return count, steps, self.strategy.distribute_datasets_from_function(
        lambda ctx: self._endless(source.eval(
            ctx, batch_size=self.batch.eval_batch_size, count=count,
            steps=steps).repeat()))

  def _endless(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset`, which never ends, declared so where it matters: with
    several workers, tf.distribute asks every worker on each get_next
    whether it still has data (an all-reduce across them, its
    get_next_as_optional) for any stream whose end tf.data cannot see
    (flat_map, rebatch: all of looper's). Not in one process, where the
    check is never on for static shapes: there, freeing several Trainers'
    Mirrored iterators stalled 20 s or more with and without it, and in
    one measurement only with it."""
    # A TPU strategy says it is not multi-worker whatever its hosts
    # (TensorFlow 2.21), and checks its hosts when the batches' shapes are
    # not static (data.bucket): declared there too, where it costs nothing.
    if not (compat.in_multi_worker_mode(self.strategy) or
            isinstance(self.strategy, tf.distribute.TPUStrategy)):
      return dataset
    return dataset.apply(tf.data.experimental.assert_cardinality(
        tf.data.INFINITE_CARDINALITY))
