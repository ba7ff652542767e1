"""The peak MFU divides by: the probes' cache (the best of records taken
apart, raised by a loop above it), where the cache lives, the datasheet
table, and MFU never above 1 in the Controller.

The probes are fakes (a list of FLOP/s) and the wall clock a number: no
timing, but one bound check of the real probe.
"""

import json
import logging
import os
import re
import types

import pytest
import tensorflow as tf

from looper.control import actions
from looper.measure import peak_flops
from tests.fixtures import tiny
from tests.unit.control import test_controller

START = 1.8e9  # a wall-clock time: 2027-01-15 08:00 UTC


class FakeProbe:
  """Returns its FLOP/s in turn; counts the calls."""

  def __init__(self, *values):
    self.values, self.dtypes = list(values), []

  def __call__(self, dtype):
    self.dtypes.append(dtype)
    return self.values[len(self.dtypes) - 1]


class Wall:
  now = START

  def __call__(self):
    return self.now


def test_a_figure_is_the_best_of_probes_taken_an_hour_apart(tmp_path):
  """Quiet 199, busy 87 and 105 (this machine's float32, measured): the
  busy first probe does not stay the figure."""
  path, wall = str(tmp_path / "cache" / "peak.json"), Wall()
  probe = FakeProbe(87e9, 199e9, 105e9)
  figures = []
  hour = peak_flops.SPACING
  for after in (0, 60, hour, 2 * hour, 9 * hour):
    wall.now = START + after
    figures.append(peak_flops.Probe("CPU, float32", "float32", path,
                                    measure=probe, now=wall).figure())
  # A run within the hour reads the cache; after PROBES records, no more.
  assert figures == [87e9, 87e9, 199e9, 199e9, 199e9]
  assert probe.dtypes == ["float32"] * 3
  kept = json.loads((tmp_path / "cache" / "peak.json").read_text())
  assert kept == {"CPU, float32": [
      {"flops_per_sec": 199e9, "at": START + 3600, "how": "probe"},
      {"flops_per_sec": 105e9, "at": START + 7200, "how": "probe"},
      {"flops_per_sec": 87e9, "at": START, "how": "probe"}]}
  again = peak_flops.Probe("CPU, float32", "float32", path, now=wall)
  assert again.describe() == (
      f"the best of 3 probes, a probe (2027-01-15 09:00 UTC); cached in"
      f" {path}")


def test_an_older_loopers_single_figure_is_probed_again(tmp_path):
  path = tmp_path / "peak.json"
  path.write_text(json.dumps({"CPU, float32": 87e9, "other": 1.0}))
  probe = peak_flops.Probe("CPU, float32", "float32", str(path),
                           measure=FakeProbe(120e9), now=Wall())
  assert probe.figure() == 120e9
  assert json.loads(path.read_text())["other"] == 1.0  # others' kept
  assert probe.describe().startswith(
      "the best of 2 probes, a probe (2027-01-15 08:00 UTC); cached in")


def test_a_loop_above_the_probed_peak_measures_again_once(tmp_path):
  """The new figure is the best of the loop and a new probe; the cache
  holds it, and the next run's header says so."""
  c, default = tiny.get_config(), tf.distribute.get_strategy()
  path = str(tmp_path / "peak.json")
  probe = FakeProbe(87e9, 120e9)
  machine = peak_flops.of_run(c.train, default, path, measure=probe)
  assert machine.flops_per_sec == 87e9
  assert re.fullmatch(r"the measured float32 matmul peak of this CPU's \d+"
                      r" cores: a probe \(\d{4}-\d\d-\d\d \d\d:\d\d UTC\);"
                      " cached in " + re.escape(path), machine.source)
  said = machine.beaten(150e9)
  assert machine.flops_per_sec == 150e9  # the loop beat the new probe too
  assert said.startswith("measured it again (120 GFLOP/s); MFU is of 150"
                         " GFLOP/s from here on: the best of 2 probes and"
                         " 1 loop, a loop (")
  assert machine.beaten(160e9) == (
      "MFU is of 160 GFLOP/s from here on: the best of 1 probe and 2 loops,"
      f" a loop ({peak_flops._when(machine.probe.records[0]['at'])}); cached in"
      f" {path}")
  assert probe.dtypes == ["float32", "float32"]  # once again, not twice
  kept = json.loads((tmp_path / "peak.json").read_text())
  assert [(r["how"], r["flops_per_sec"]) for r in kept[machine.probe.key]
          ] == [("loop", 160e9), ("loop", 150e9), ("probe", 120e9)]
  # The next run: the cache's figure, nothing measured; bfloat16 apart.
  assert peak_flops.of_run(c.train, default, path,
                           measure=FakeProbe()).flops_per_sec == 160e9
  c.train.precision = "mixed_bfloat16"
  bf16 = FakeProbe(30e9)
  assert peak_flops.of_run(c.train, default, path,
                           measure=bf16).flops_per_sec == 30e9
  assert bf16.dtypes == ["bfloat16"]


def test_a_given_peak_becomes_the_loops_speed_and_nothing_is_cached(
    tmp_path):
  c = tiny.get_config()
  c.train.peak_flops = 2.5e11  # the config wins: nothing measured
  given = peak_flops.of_run(c.train, tf.distribute.get_strategy(),
                            str(tmp_path / "p"), measure=FakeProbe())
  assert given == peak_flops.Peak(2.5e11, "train.peak_flops=2.5e+11")
  two_hosts = peak_flops.Peak(1e11, "train.peak_flops=1e+11", devices=2)
  assert two_hosts.source == "train.peak_flops=1e+11 x 2"
  two_hosts.beaten(3e11)
  assert (two_hosts.flops_per_sec, two_hosts.per_device) == (3e11, 1.5e11)
  assert two_hosts.source == (
      "a loop's speed, above train.peak_flops=1e+11 x 2")
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("cluster,machines", [
    ({"worker": ["127.0.0.1:2001", "localhost:2002"]}, 1),  # looper launch
    ({"chief": ["host-a:2000"], "worker": ["host-a:2001", "Host-B:2001"]}, 2),
])
def test_workers_sharing_a_machine_count_its_cores_once(tmp_path, cluster,
                                                         machines):
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster), task_type="worker", task_id=0)
  strategy = types.SimpleNamespace(cluster_resolver=resolver)  # a CPU run's
  peak = peak_flops.of_run(tiny.get_config().train, strategy,
                           str(tmp_path / "p"), measure=FakeProbe(100e9))
  assert (peak.devices, peak.flops_per_sec) == (machines, machines * 100e9)
  times = f" x {machines}" if machines > 1 else ""
  assert peak.source.startswith(
      "the measured float32 matmul peak of this CPU's"
      f" {len(os.sched_getaffinity(0))} cores{times}: a probe ("), peak.source


class SpeedingTrainer(test_controller.FakeTrainer):
  """Each loop's FLOPs per step from a list; a second a step."""

  def __init__(self, clock, flops_per_step):
    super().__init__(clock=clock, secs_per_step=1.0)
    self.flops_per_step = list(flops_per_step)

  def train(self, steps):
    losses, logs = super().train(steps)
    return losses, {**logs, "flops": self.flops_per_step.pop(0) * steps}


def test_mfu_is_never_above_one_and_a_faster_loop_is_said_once(
    tmp_path, caplog):
  speeds = [50e9, 150e9, 140e9, 200e9, 90e9]
  clock = test_controller.Clock()
  probe = FakeProbe(100e9, 130e9)
  machine = peak_flops.Peak(100e9, "measured", probe=peak_flops.Probe(
      "CPU, float32", "float32", str(tmp_path / "peak.json"), measure=probe,
      now=Wall()))
  machine.probe.figure()
  ctl, _, _ = test_controller.make(
      total=10, steps_per_loop=2, trainer=SpeedingTrainer(clock, speeds),
      peak=machine, clock=clock)
  mfu = []
  ctl.add_actions(report=[actions.Action(
      lambda now: mfu.append(now.loop.logs["mfu"]), every_loop=True)])
  with caplog.at_level(logging.WARNING):
    ctl.train()
  # Against 100, then 150 (loop 2: above the probe of 130), then 200.
  assert mfu == pytest.approx([0.5, 1.0, 140 / 150, 1.0, 90 / 200])
  assert max(mfu) <= 1
  assert len(probe.dtypes) == 2
  assert [r.getMessage()[:62] for r in caplog.records] == [
      "A loop ran at 150 GFLOP/s, above the peak MFU was of (100 GFLOP/s)"
      [:62]]
  assert machine.probe.best == 200e9


def test_the_cache_lives_where_the_environment_says():
  home = {"HOME": "/home/u"}
  where = peak_flops.cache_path
  assert where(home) == "/home/u/.cache/looper/peak_flops.json"
  assert where({**home, "XDG_CACHE_HOME": "/xdg"}) == (
      "/xdg/looper/peak_flops.json")
  assert where({**home, "XDG_CACHE_HOME": "relative"}) == (
      "/home/u/.cache/looper/peak_flops.json")  # the XDG spec ignores it
  assert where({**home, "XDG_CACHE_HOME": "/xdg",
                "LOOPER_CACHE_DIR": "/mine"}) == "/mine/peak_flops.json"


class SlowingClock:
  """Each read `step` seconds after the last; a sleep halves the step.
  Steps of 2**-k seconds: the differences are exact."""

  def __init__(self, step):
    self.now, self.step, self.slept = 0.0, step, []

  def __call__(self):
    self.now += self.step
    return self.now

  def sleep(self, secs):
    self.slept.append(secs)
    self.step /= 2


def test_the_probe_stops_at_a_size_whose_call_takes_half_its_time():
  """A clock at 1/64 s a read: a call 'takes' 1/64 s, half of per_size,
  so 256 is the last size, timed until per_size has passed."""
  clock = SlowingClock(2**-6)
  flops_per_call = peak_flops.CHAIN * 2 * 256 ** 3
  assert peak_flops.measure("float32", rounds=1, per_size=2**-5,
                            clock=clock) == flops_per_call / 2**-6
  assert clock.now == 4 * 2**-6  # start, a call (2), the check
  assert peak_flops.measure("float32", rounds=1) > 1e8  # a real one


def test_a_probe_is_the_best_of_its_rounds_gap_apart():
  """Calls of 1/32 s, then (after a sleep) 1/64 s: the best is the second
  round's (each stops at 256: a call takes half of per_size or more)."""
  clock = SlowingClock(2**-5)
  flops_per_call = peak_flops.CHAIN * 2 * 256 ** 3
  assert peak_flops.measure("float32", rounds=2, gap=0.7, per_size=2**-5,
                            clock=clock, sleep=clock.sleep) == (
                                flops_per_call / 2**-6)
  assert clock.slept == [0.7]


def test_datasheet_table_picks_the_first_match_and_tf32():
  assert peak_flops.datasheet("NVIDIA H100 PCIe", "bfloat16") == 756e12
  assert peak_flops.datasheet("NVIDIA H100 80GB HBM3", "float16") == 989e12
  assert peak_flops.datasheet("NVIDIA A100-SXM4-80GB", "float32") == 156e12
  tf.config.experimental.enable_tensor_float_32_execution(False)
  try:
    assert peak_flops.datasheet("NVIDIA A100-SXM4-80GB", "float32") == 19.5e12
  finally:
    tf.config.experimental.enable_tensor_float_32_execution(True)
  assert peak_flops.datasheet("v5litepod", "float32") == 197e12
  assert peak_flops.datasheet("Intel(R) Xeon(R)", "bfloat16") is None
