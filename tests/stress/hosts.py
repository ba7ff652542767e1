"""Three hosts against one process, in element, array and file mode.

Synopsis::

    python -m tests.stress.hosts                    # as root, ~1 minute
    python -m tests.stress.hosts --modes=elements
    python -m tests.stress.hosts --cuts=1,0         # + cut links, ~2 minutes

tests/e2e/multiworker/test_hosts.py's check, by hand: three workers, each
on its own host (a network namespace), give one process's per-step losses
(rtol 1e-5), eval counts every example once, the chief alone writes. The
suite runs it in array and file mode; 3 workers in element mode against
one process are test_slurm.py's three tasks there (the same code path but
the addresses), and are run on hosts here. `--cuts`: then test_hosts' cut
links, a link cut per host listed (the suite cuts the worker's, 1; 0 is
the chief's), a blip, and the rerun bit-exact. Needs root (namespaces).
"""

import argparse
import os
import pathlib
import shutil
import sys
import tempfile

from tests.fixtures import private_home
from tests.fixtures.processes import LOOPBACK_ENV


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--modes", default="elements,arrays,files",
                      help="comma-separated: elements, arrays, files")
  parser.add_argument("--cuts", default="",
                      help="comma-separated hosts to cut (0 chief, 1 worker)")
  flags = parser.parse_args(argv)
  wanted = flags.modes.split(",")
  # As the test session: loopback only, a HOME of its own (before Keras).
  os.environ.update(LOOPBACK_ENV)
  private_home.enter()
  from tests.e2e.multiworker import test_hosts  # pylint: disable=g-import-not-at-top
  root = pathlib.Path(tempfile.mkdtemp(prefix="looper-hosts-"))
  try:
    modes = test_hosts.write_modes(root / "shards")
    test_hosts.three_hosts_equal_one_process(root,
                                             {m: modes[m] for m in wanted})
    if flags.cuts:
      cuts = [int(c) for c in flags.cuts.split(",")]
      (root / "cuts").mkdir()
      test_hosts.cuts_then_a_blip_end_exact(root / "cuts", modes, cuts)
      print(f"cut hosts {cuts} ended in one line each; the rerun is exact")
  finally:
    shutil.rmtree(root, ignore_errors=True)
    private_home.leave()
  print(f"3 hosts equal one process in {', '.join(wanted)} mode")
  return 0


if __name__ == "__main__":
  sys.exit(main())
