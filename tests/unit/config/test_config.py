"""Config defaults, declared fields (experiments' too) and their overrides,
one-line validation errors, resolution, JSON round trip."""

import copy
import json
import sys

from absl import flags
from ml_collections import config_flags
import pytest

from looper import config as lc
from looper import references
from looper.data import splits
from tests.fixtures import tiny
from tests.fixtures.configs import configured


@pytest.mark.parametrize("field,value,message", [
    ("train.steps", -1, "config.train.steps=-1: must be a whole number >= 0;"
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
    ("train.spike_factor", 0.5, "config.train.spike_factor=0.5: must be 0"
     " (off) or a factor > 1; set --config.train.spike_factor"),
    ("optimizer.clip_global_norm", -1.0, "config.optimizer.clip_global_norm="
     "-1.0: must be a norm >= 0; set --config.optimizer.clip_global_norm"),
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
    ("distribution.network", "privat", "config.distribution.network="
     "'privat' is not one of loopback, private, public; did you mean"
     " 'private'? set --config.distribution.network"),
    ("data.train_split", "train[:x]", "config.data.train_split='train[:x]' is"
     " not a split; write 'train', 'test[:8000]', 'test[8000:]' or"
     " 'train[:90%]'"),
    ("model_fn", "tests.fixtures.tiny",
     "config.model_fn='tests.fixtures.tiny' is not"
     " 'module:name'; write it like 'experiments.mnist:model_fn' or"
     " 'experiments/mnist.py:model_fn'"),
    ("model_fn", "tests.fixtures.tiny:nope",
     "config.model_fn='tests.fixtures.tiny:nope': 'tests.fixtures.tiny' has"
     " no attribute 'nope'; check the name after ':'"),
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


def test_every_declared_field_is_validated():
  """validate's kinds are default_config's declarations: each declared
  field out of its bounds (-1, or 1 for a bool) fails naming itself."""
  lc.validate(tiny.get_config())
  fields = list(lc.declared(lc.default_config()))
  assert fields
  for path, field in fields:
    c = tiny.get_config()
    section, _, name = path.rpartition(".")
    with c[section].ignore_type():
      c[section][name] = 1 if field.get_type() is bool else -1
    with pytest.raises(lc.ConfigError) as e:
      lc.validate(c)
    assert str(e.value).startswith(f"config.{path}="), path
    assert str(e.value).endswith(f"; set --config.{path}"), path
  assert lc.default_config().eval.steps is None  # the whole eval split


def _declaring():
  """tiny's config with a field of its own, declared as experiments do."""
  c = tiny.get_config()
  c.model.layers = lc.whole(4, low=2)
  return c


# ml_collections itself refuses 1.5 and "3" for an int field (not True, nor
# None); ignore_type() lets them in, as a config built with type_safe=False.
@pytest.mark.parametrize("value", [1, 0, -3, True, 1.5, "3", None])
def test_a_declared_experiment_field_is_validated(value):
  c = _declaring()
  with c.model.ignore_type():
    c.model.layers = value
  with pytest.raises(lc.ConfigError) as e:
    lc.validate(c)
  assert str(e.value) == (f"config.model.layers={value!r}: must be a whole"
                          " number >= 2; set --config.model.layers")


def test_declared_kinds_word_their_bounds():
  c = _declaring()
  lc.validate(configured(c, {"model.layers": 2}))  # the bound itself
  for field, value, must in [
      ("checkpoint.every_secs", -0.5, "a number of seconds >= 0"),
      ("distribution.worker_timeout_secs", 0, "a number of seconds > 0"),
      ("data.bucket", -1, "a whole number >= 0")]:
    c = configured(tiny.get_config(), {field: value})
    with pytest.raises(lc.ConfigError) as e:
      lc.validate(c)
    shown = float(value) if "seconds" in must else value
    assert str(e.value) == (f"config.{field}={shown!r}: must be {must}; set"
                            f" --config.{field}")
  c = tiny.get_config()
  with c.train.ignore_type():
    c.train.jit_compile = 1
  with pytest.raises(lc.ConfigError) as e:
    lc.validate(c)
  assert str(e.value) == ("config.train.jit_compile=1: must be True or False;"
                          " set --config.train.jit_compile")


_DECLARING_FILE = """\
from tests.unit.config import test_config

def get_config():
  return test_config._declaring()
"""


def _parsed(tmp_path, *overrides):
  """test_config._declaring() through config_flags, as looper.main parses
  --config (locked), with `overrides` (--config.FIELD=VALUE)."""
  path = tmp_path / "declaring.py"
  path.write_text(_DECLARING_FILE)
  argv = ["looper", f"--config={path}", *overrides]
  flag_values = flags.FlagValues()
  config = config_flags.DEFINE_config_file(
      "config", flag_values=flag_values, lock_config=True, sys_argv=argv)
  flag_values(argv)
  return config.value


def test_overrides_of_declared_fields_keep_their_types(tmp_path):
  c = _parsed(tmp_path, "--config.model.layers=3", "--config.train.steps=7",
              "--config.eval.timeout_secs=5", "--config.train.jit_compile")
  assert (c.model.layers, c.train.steps, c.eval.timeout_secs) == (3, 7, 5.0)
  assert [type(v) for v in (c.model.layers, c.train.steps,
                            c.eval.timeout_secs, c.train.jit_compile)] == [
                                int, int, float, bool]
  lc.validate(c)
  c.model.layers = 5  # locked: a field keeps taking values, none is added
  with pytest.raises(AttributeError):
    c.model.depth = 2
  with pytest.raises(flags.IllegalFlagValueError):  # an int's parser
    _parsed(tmp_path, "--config.model.layers=2.5")
  c = _parsed(tmp_path, "--config.model.layers=1")
  with pytest.raises(lc.ConfigError) as e:
    lc.validate(c)
  assert str(e.value) == ("config.model.layers=1: must be a whole number >= 2;"
                          " set --config.model.layers")


def test_declarations_leave_plain_values_in_json_and_copies():
  c = configured(_declaring(), {"model.layers": 3})
  saved = json.loads(references.to_json(c))
  assert (saved["model"]["layers"], saved["train"]["steps"]) == (3, 40)
  assert saved["eval"]["timeout_secs"] == 3600.0
  resolved = c.copy_and_resolve_references()
  assert resolved.to_dict() == c.to_dict()
  assert not list(lc.declared(resolved))  # values only, as the JSON
  copied = copy.deepcopy(c)  # a deep copy keeps the declarations
  copied.model.layers = 1
  with pytest.raises(lc.ConfigError, match=r"^config\.model\.layers=1: "):
    lc.validate(copied)


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


def test_eval_sets_their_order_and_the_monitor_set():
  """One set of bare names without data.eval_splits; else the sets by name
  (as any copy of the config has them), the same from config.json."""
  c = tiny.get_config()
  assert splits.eval_sets(c) == {"": "test"}
  assert splits.monitor_set(c) == ""
  c.data.eval_splits = {"val": "test[:50%]", "test": "test[50%:]"}
  for each in (c, copy.deepcopy(c), json.loads(references.to_json(c))):
    assert list(splits.eval_sets(each).items()) == [
        ("test", "test[50%:]"), ("val", "test[:50%]")]
    assert splits.monitor_set(each) == "val"  # 'val' if a set has it
    assert lc.split_field(each, "test[:50%]") == "data.eval_splits['val']"
  c.data.eval_splits = {"ood": "test[:50%]", "dev": "test[50%:]"}
  assert splits.monitor_set(c) == "dev"  # else the first by name
  c.eval.monitor_set = "ood"
  lc.validate(c)
  assert splits.monitor_set(c) == "ood"
  logs = {"dev/loss": 1.0, "dev/accuracy": 0.5, "ood/loss": 2.0}
  assert splits.set_logs(logs, "ood") == {"loss": 2.0}
  assert splits.set_logs({"loss": 1.0}, "") == {"loss": 1.0}


def test_json_names_functions_so_resolve_loads_them_back():
  saved = json.loads(references.to_json(tiny.get_config()))
  assert saved["model_fn"] == "tests.fixtures.tiny:model_fn"
  assert saved["trainer"] == "looper.train.trainer:Trainer"
  assert saved["metrics"] == ["accuracy"]
  assert references.resolve(saved["model_fn"], "model_fn") is tiny.model_fn
  by_path = references.resolve("tests/fixtures/tiny.py:make_data", "x")
  x, y = by_path(5, seed=0)
  assert (x == tiny.make_data(5, seed=0)[0]).all()


def test_a_misspelt_override_is_one_line_with_the_nearest_field(monkeypatch):
  """Through the parser users go through (looper.main's flags), in-process."""
  from looper.cli import parsing  # pylint: disable=g-import-not-at-top,unused-import
  from looper import main  # pylint: disable=g-import-not-at-top,unused-import
  argv = ["looper", "--config=tests/fixtures/tiny.py", "--config.train.stpes=5"]
  # config_flags registers the --config.* overrides it finds in sys.argv.
  monkeypatch.setattr(sys, "argv", argv)
  with pytest.raises(SystemExit) as e:
    parsing.parse_flags(argv)
  assert str(e.value) == ("looper: --config.train.stpes: the config has no"
                          " field 'stpes'; did you mean"
                          " --config.train.steps?")


def test_tool_flags_parse_with_absl_and_fail_in_one_line(capsys):
  from looper.cli import launch  # pylint: disable=g-import-not-at-top
  from looper.cli import runs  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit) as e:
    launch.main(["--workers=0", "--", "--config=tests/fixtures/tiny.py"])
  usage, line = str(e.value).splitlines()[-2:]
  assert usage.startswith("(also: python -m looper.cli.launch")
  assert line.startswith("looper: flag --workers=0: ")
  with pytest.raises(SystemExit) as e:
    runs.main([])
  assert str(e.value).endswith("\nlooper: give at least one DIR")
  with pytest.raises(SystemExit) as e:
    runs.main(["--help"])
  assert e.value.code == 0
  assert capsys.readouterr().out.startswith("usage: looper runs")


def test_launch_gives_each_worker_one_loopback_cluster():
  from looper.cli import launch  # pylint: disable=g-import-not-at-top
  configs = [json.loads(c) for c in launch.tf_configs(3)]
  addresses = configs[0]["cluster"]["worker"]
  assert all(c["cluster"] == {"worker": addresses} for c in configs)
  assert [c["task"] for c in configs] == [
      {"type": "worker", "index": i} for i in range(3)]
  assert len(set(addresses)) == 3
  assert all(a.startswith("127.0.0.1:") for a in addresses)
