"""looper.options.metrics: metric names that would collide in the logs."""

import pytest

from looper import config as lc
from looper.options import metrics
from tests.fixtures import catalogue


# --- Metric names that collide with looper's own log keys ------------------


@pytest.mark.parametrize("name", ["examples", "examples_per_sec",
                                  "learning_rate", "loss", "steps_per_sec",
                                  "grad_norm"])
def test_metric_names_looper_reports_are_rejected(name):
  with pytest.raises(lc.ConfigError, match=catalogue.line(
      "metric-named-as-looper-reports", name=name)):
    metrics.check_metric_names(["accuracy", name])


def test_metric_names_must_be_distinct():
  metrics.check_metric_names(["accuracy", "top5_accuracy", "my_loss"])
  with pytest.raises(lc.ConfigError) as e:
    metrics.check_metric_names(["accuracy", "top5_accuracy", "accuracy"])
  assert str(e.value) == (
      "config.metrics: two metrics are named 'accuracy', so one would hide"
      " the other in the logs; give each its own name")
