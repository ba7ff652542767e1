"""The command line: what `looper <mode>` and its tools parse and print.

| module | owns |
|---|---|
| `parsing` | absl's parser for `looper.main` with one-line errors; `parse_tool_flags` for the tools |
| `launch` | `looper launch`: N local worker processes (TF_CONFIG, GPU shares) |
| `runs` | `looper runs`: a table of finished workdirs |
| `describe` | `looper describe`: data, model and config of an experiment |
| `tpu_check` | `looper check`: will it compile and feed on a TPU (checked on a CPU) |
| `data_service` | `looper data_service`: a tf.data service dispatcher or worker (`--config.data.service`) |
| `shards` | `python -m looper.cli.shards write`: an experiment's splits as TFRecord shards |

`looper.main` dispatches to these and to `looper.run`; nothing here trains.
"""
