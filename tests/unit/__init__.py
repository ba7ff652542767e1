"""Tests in this process, a folder per group of looper (tests/test_layout.py
GROUPS) and experiments/, each file named after the module it tests where
there is one. A few start a process or train for seconds: marked slow."""
