"""The machinery that runs third-party plugins apart, in plugin hosts: one folder per process.

- ``shared/``: what both processes import: the wire format (``wire``), the values it
  carries (``messages``), the requests (``host_protocol``), the keeper's records
  (``keeper_record``), what a confined host may reach (``policy``) and the kernel's means
  to enforce it (``landlock``, ``process_privileges``, ``withheld_data``), the memory
  cgroup (``memory_cgroup``).
- ``in_host/``: what runs in a plugin host's process (``python -m
  harness.plugin.hosting.in_host.host``): its entry point, its confinement, the requests
  it answers, its keeper, the driver probe's parts.
- ``in_harness/``: what runs in the harness's process: the host as the harness holds it
  (``host_process``, ``running_host``, ``host_client``), the exchange of a request and its
  limits, the host's output, folder and ending, the hosted components and their proxies,
  the opt-out of confinement, the confinement probe.

Neither side imports the other's code: only ``shared/`` (tests/test_layers.py).
"""
