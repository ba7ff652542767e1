"""TensorFlow Datasets as a looper `dataset_fn`: a TFDS dataset in one line.

Synopsis::

    # pip install "looper[tfds]"
    from looper import config as lc
    from looper.data import tfds_adapter

    def get_config():
      c = lc.default_config()
      c.model_fn = model_fn          # takes the TFDS features as they come
      c.dataset_fn = "looper.data.tfds_adapter:dataset_fn"
      tfds_adapter.add_fields(c, name="mnist", keys=("image", "label"))
      c.data.train_split = "train[:90%]"   # TFDS slicing, passed through
      c.data.eval_split = "train[90%:]"
      c.train.epochs = 2                   # or c.train.steps
      return c

    # Then any TFDS dataset with the same features, from the command line:
    #   --config.data.tfds_name=fashion_mnist --config.data.dir=/data/tfds

Each split is `tfds.load(data.tfds_name, split=split, data_dir=data.dir or
None, shuffle_files=False)`: one pass in a fixed order, which looper
shuffles, shards and batches (element mode, exact on any replica count).
Its feature dicts become (inputs, label): inputs is the feature
`data.tfds_keys[0]`, or a dict of features when several keys precede the
label key, which is the last; integer labels become int32 (what TPUs want).
Scale or otherwise preprocess in the model (keras.layers.Rescaling(1 /
255) for uint8 images): an export for serving then carries it too.
"""

import ml_collections
import tensorflow as tf

from looper import autograph
from looper import errors
from looper import fields
from looper.data import splits

INSTALL = 'pip install "looper[tfds]"'


def add_fields(c: ml_collections.ConfigDict, *, name: str = "",
               keys: tuple = ("image", "label"), download: bool = True
               ) -> None:
  """Adds `data.tfds_name`, `data.tfds_keys` and `data.tfds_download`.

  Args:
    c: the config (`data.dir` already exists: TFDS' data_dir when set).
    name: a TFDS name, optionally versioned: 'mnist', 'mnist:3.0.1'.
    keys: the input feature(s), then the label feature.
    download: prepare a dataset missing from the data dir (downloading it);
      False: fail instead (offline machines).
  """
  c.data.tfds_name = name
  c.data.tfds_keys = tuple(keys)
  c.data.tfds_download = fields.boolean(download)


def dataset_fn(config: ml_collections.ConfigDict,
               split: str) -> tf.data.Dataset:
  """Returns `split` of the TFDS dataset `config.data.tfds_name`.

  Args:
    config: reads `data.tfds_name`, `data.tfds_keys`, `data.tfds_download`,
      `data.dir` (see `add_fields`) and the split fields, to name them in
      errors.
    split: a TFDS split, sliced as TFDS slices it: 'train', 'test[:50%]'.

  Returns:
    A dataset of (inputs, label) examples in the files' order.

  Raises:
    ConfigError: tensorflow-datasets is not installed; a field is missing
      or wrong; the dataset, split or a key does not exist; the dataset is
      not in data.dir and cannot be prepared there.
  """
  data = config.data
  for field in ("tfds_name", "tfds_keys", "tfds_download"):
    if field not in data:
      raise errors.ConfigError(
          f"config.data.{field} is not set; call looper.data.tfds_adapter."
          "add_fields(c, name=..., keys=...) in get_config()")
  if not data.tfds_name:
    raise errors.ConfigError(
        "config.data.tfds_name is empty; set --config.data.tfds_name to a"
        " TFDS dataset, e.g. mnist")
  keys = tuple(data.tfds_keys)
  if len(keys) < 2 or not all(isinstance(k, str) for k in keys):
    raise errors.ConfigError(
        f"config.data.tfds_keys={data.tfds_keys!r} must name the input"
        " feature(s), then the label feature; e.g. ('image', 'label')")
  field = splits.split_field(config, split)
  dataset = _load(_import_tfds(), data, split, field)
  features = dataset.element_spec
  missing = [k for k in keys if k not in features]
  if missing:
    raise errors.ConfigError(
        f"config.data.tfds_keys={keys!r}: {data.tfds_name} has no feature"
        f" {missing[0]!r}; its features are {', '.join(sorted(features))}")
  return dataset.map(_example_fn(keys[:-1], keys[-1], features),
                     num_parallel_calls=tf.data.AUTOTUNE)


def _import_tfds():
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise errors.ConfigError(
        "config.dataset_fn=looper.data.tfds_adapter:dataset_fn needs"
        f" tensorflow-datasets, which is not installed; {INSTALL}") from None
  return tfds


def _load(tfds, data: ml_collections.ConfigDict, split: str, field: str):
  """tfds.load, each failure one line naming the field to change."""
  where = (f"config.data.dir={data.dir!r}" if data.dir
           else "TFDS' default data dir (config.data.dir is empty)")
  try:
    return tfds.load(data.tfds_name, split=split, data_dir=data.dir or None,
                     download=data.tfds_download, shuffle_files=False)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise errors.ConfigError(
        f"config.data.tfds_name={data.tfds_name!r}: no such TFDS dataset"
        f" ({errors.first_line(e)}); set --config.data.tfds_name to a"
        " name in tfds.list_builders()") from None
  except AssertionError as e:  # TFDS asserts the prepared files exist
    raise errors.ConfigError(
        f"{data.tfds_name} is not prepared in {where}"
        f" ({errors.first_line(e)}); point --config.data.dir at the"
        " folder holding it, or set --config.data.tfds_download=True") from None
  except ValueError as e:
    # TFDS says 'Unknown split ...' or 'Requested slice ... incompatible'.
    if not any(w in str(e).lower() for w in ("split", "slice")):
      raise
    raise errors.ConfigError(
        f"config.{field}={split!r}: {errors.first_line(e)}; write a split"
        f" of {data.tfds_name}, optionally sliced like 'train[:90%]'"
        ) from None
  except Exception as e:  # pylint: disable=broad-except
    # Preparing can fail in many ways (network, disk, a builder's own
    # dependencies); the user's fix is the same.
    raise errors.ConfigError(
        f"config.data.tfds_name={data.tfds_name!r}: TFDS could not prepare it"
        f" in {where} ({errors.first_line(e)}); prepare it on a machine"
        " with network and point --config.data.dir at it") from None


def _example_fn(input_keys: tuple, label_key: str, features: dict):
  """The map from a TFDS feature dict to (inputs, label)."""
  spec = features[label_key]
  to_int32 = (isinstance(spec, tf.TensorSpec) and spec.dtype.is_integer and
              spec.dtype != tf.int32)

  @autograph.plain
  def example(feature_dict):
    label = feature_dict[label_key]
    if to_int32:
      label = tf.cast(label, tf.int32)
    if len(input_keys) == 1:
      return feature_dict[input_keys[0]], label
    return {k: feature_dict[k] for k in input_keys}, label

  return example
