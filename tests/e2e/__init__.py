"""Tests that start looper's processes (all in the slow lane): commands/ as a
user types them, replicas/ one process per device count, restarts/ a run
stopped or killed and rerun, multiworker/ TF_CONFIG clusters, hosts and
Slurm, experiments/ the shipped experiments end to end."""
