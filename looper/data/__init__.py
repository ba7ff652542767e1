"""looper's input: from an experiment's `dataset_fn` to per-replica batches.

Synopsis::

    from looper.data import sources
    source = sources.make(split, field, config.data,
                          lambda: dataset_fn(config, split))
    strategy.distribute_datasets_from_function(
        lambda ctx: source.train(ctx, batch_size=128, seed=0,
                                 shuffle_buffer=10_000, position=0))

The modules, bottom up (each imports only those above it in this list):

| module | owns |
|---|---|
| `splits` | split names ('test[:8000]'), which config field names a split |
| `batch` | a batch: its numbers (`Batch`: per update, micro-batch, replica; checked over the replicas) and its parts |
| `checks` | what an example and a split must be (one-line errors) |
| `elements` | element mode: seeded per-epoch shuffle, each pipeline's block of a global batch, eval padding + masks |
| `buckets` | element mode for variable-length inputs (`data.bucket`) |
| `arrays` | array mode: numpy arrays (or `windows.Windows`) shuffled by index, O(1) resume |
| `windows` | a virtual array for array mode: row i a window of a resident 1-D stream, gathered per batch |
| `shards` | file mode: TFRecord shards, virtual-shard groups, the writer |
| `sources` | the `Source` protocol and `make`, which picks the mode |
| `service` | the train split through a tf.data service (`data.service`): refusals, start-up check, job names |
| `datasets` | finding a dataset's files: data.dir, cache, download |
| `tfds_adapter` | a TensorFlow Datasets dataset as a `dataset_fn` |

Every mode is exact on any replica and worker count and resumes from a
count of global examples consumed (the Trainer's data position); through a
tf.data service (`service`) the train split is read at most once per pass
instead. Nothing
here knows models, optimizers or the training loop.
"""
