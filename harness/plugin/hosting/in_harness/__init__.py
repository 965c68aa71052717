"""What runs in the harness's process, a plugin host as it holds it: nothing of ``in_host/``."""
