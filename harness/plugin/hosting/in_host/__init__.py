"""What runs in a plugin host's process (and its keeper): imports nothing of ``in_harness/``."""
