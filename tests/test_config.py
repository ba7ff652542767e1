"""Config defaults, one-line validation errors, resolution, JSON round trip."""

import json
import sys

import pytest

from looper import config as lc
from looper import refs
from tests import tiny


@pytest.mark.parametrize("field,value,message", [
    ("train.steps", 0, "config.train.steps=0: must be a whole number >= 1;"
     " set --config.train.steps"),
    ("train.batch_size", -8, "config.train.batch_size=-8: must be a whole"
     " number >= 1; set --config.train.batch_size"),
    ("eval.every_steps", -1, "config.eval.every_steps=-1: must be a whole"
     " number >= 0; set --config.eval.every_steps"),
    ("eval.steps", 0, "config.eval.steps=0: must be >= 1, or None for the"
     " whole eval split"),
    ("optimizer.name", "adm", "config.optimizer.name='adm' is not one of sgd,"
     " adam, adamw; did you mean 'adam'? set --config.optimizer.name"),
    ("optimizer.learning_rate", 0.0, "config.optimizer.learning_rate=0.0:"
     " must be > 0"),
    ("optimizer.warmup_steps", 100, "config.optimizer.warmup_steps=100: must"
     " be <= train.steps=40"),
    ("distribution.strategy", "mirorred", "config.distribution.strategy="
     "'mirorred' is not one of auto, default, one_device, mirrored,"
     " multi_worker, tpu; did you mean 'mirrored'? set"
     " --config.distribution.strategy"),
    ("distribution.strategy", "tpu", "config.distribution.tpu='': strategy"
     " 'tpu' needs the TPU name or address (use 'local' on a TPU VM)"),
    ("distribution.all_reduce", "ncl", "config.distribution.all_reduce="
     "'ncl' is not one of auto, nccl, ring; did you mean 'nccl'? set"
     " --config.distribution.all_reduce"),
    ("data.train_split", "train[:x]", "config.data.train_split='train[:x]' is"
     " not a split; write 'train', 'test[:8000]', 'test[8000:]' or"
     " 'train[:90%]'"),
    ("model_fn", "tests.tiny", "config.model_fn='tests.tiny' is not"
     " 'module:name'; write it like 'experiments.mnist:model_fn' or"
     " 'experiments/mnist.py:model_fn'"),
    ("model_fn", "tests.tiny:nope", "config.model_fn='tests.tiny:nope':"
     " 'tests.tiny' has no attribute 'nope'; check the name after ':'"),
    ("dataset_fn", None, "config.dataset_fn is not set; assign a function in"
     " get_config() or a 'module:function' string"),
])
def test_bad_values_give_one_line_naming_field_and_fix(field, value, message):
  c = tiny.get_config()
  section, _, name = field.rpartition(".")
  (c[section] if section else c)[name] = value
  with pytest.raises(lc.ConfigError) as e:
    lc.validate(c)
  assert str(e.value) == message


def test_defaults_validate_and_have_the_documented_names():
  c = tiny.get_config()
  lc.validate(c)
  for field in ("seed", "train.steps", "train.batch_size",
                "train.steps_per_loop", "eval.every_steps", "eval.batch_size",
                "eval.steps", "optimizer.name", "optimizer.learning_rate",
                "optimizer.schedule", "checkpoint.every_steps",
                "checkpoint.keep", "distribution.strategy",
                "distribution.num_cpu_devices", "distribution.tpu",
                "distribution.all_reduce", "train.deterministic",
                "data.dir", "data.train_split", "data.eval_split"):
    section, _, name = field.rpartition(".")
    assert name in (c[section] if section else c), field
  assert lc.default_config().eval.steps is None


@pytest.mark.parametrize("split,n,want", [
    ("test", 10, ("test", slice(None, None))),
    ("test[:8000]", 10000, ("test", slice(None, 8000))),
    ("test[8000:]", 10000, ("test", slice(8000, None))),
    ("train[10%:90%]", 60000, ("train", slice(6000, 54000))),
    ("train[-5:]", 100, ("train", slice(-5, None))),
])
def test_split_slices(split, n, want):
  assert lc.split_slice(split, n) == want


def test_empty_split_is_an_error():
  with pytest.raises(lc.ConfigError, match=r"selects no examples of the 10 in"
                     r" 'test'; widen the slice"):
    lc.split_slice("test[20:]", 10, field="data.eval_split")


def test_json_names_functions_so_resolve_loads_them_back():
  saved = json.loads(refs.to_json(tiny.get_config()))
  assert saved["model_fn"] == "tests.tiny:model_fn"
  assert saved["trainer"] == "looper.trainer:Trainer"
  assert saved["metrics"] == ["accuracy"]
  assert refs.resolve(saved["model_fn"], "model_fn") is tiny.model_fn
  by_path = refs.resolve("tests/tiny.py:make_data", "x")
  x, y = by_path(5, seed=0)
  assert (x == tiny.make_data(5, seed=0)[0]).all()


def test_a_misspelt_override_is_one_line_with_the_nearest_field(monkeypatch):
  """Through the parser users go through (looper.main's flags), in-process."""
  from looper import flag_errors, main  # pylint: disable=g-import-not-at-top,unused-import
  argv = ["looper", "--config=tests/tiny.py", "--config.train.stpes=5"]
  # config_flags registers the --config.* overrides it finds in sys.argv.
  monkeypatch.setattr(sys, "argv", argv)
  with pytest.raises(SystemExit) as e:
    flag_errors.parse_flags(argv)
  assert str(e.value) == ("looper: --config.train.stpes: the config has no"
                          " field 'stpes'; did you mean"
                          " --config.train.steps?")


def test_tool_flags_parse_with_absl_and_fail_in_one_line(capsys):
  from looper import launch, runs  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as e:
    launch.main(["--workers=0", "--", "--config=tests/tiny.py"])
  usage, line = str(e.value).splitlines()[-2:]
  assert usage.startswith("(also: python -m looper.launch")
  assert line.startswith("looper: flag --workers=0: ")
  with pytest.raises(SystemExit) as e:
    runs.main([])
  assert str(e.value).endswith("\nlooper: give at least one DIR")
  with pytest.raises(SystemExit) as e:
    runs.main(["--help"])
  assert e.value.code == 0
  assert capsys.readouterr().out.startswith("usage: looper runs")


def test_launch_gives_each_worker_one_loopback_cluster():
  from looper import launch  # pylint: disable=g-import-not-at-top
  configs = [json.loads(c) for c in launch.tf_configs(3)]
  addresses = configs[0]["cluster"]["worker"]
  assert all(c["cluster"] == {"worker": addresses} for c in configs)
  assert [c["task"] for c in configs] == [
      {"type": "worker", "index": i} for i in range(3)]
  assert len(set(addresses)) == 3
  assert all(a.startswith("127.0.0.1:") for a in addresses)
