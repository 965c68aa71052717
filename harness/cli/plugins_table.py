"""``idrs-bench plugins``: the loaded plugins as a table (or JSON), where each runs (this
process or a plugin host, harness/README.md, and how the host is confined), the checks
of third-party plugins that are not run, and the plugins not loaded: refused (another
plugin contract) or failed, with what each would provide where that is known;
``plugins install PATH`` and ``plugins uninstall NAME``
(:mod:`harness.plugin.private_install`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.cli.console import terminal

if TYPE_CHECKING:
    from harness.plugin.manager import PluginManager


def add_plugins_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``plugins`` (and its actions ``install``, ``uninstall``) to ``idrs-bench``."""
    plugins = sub.add_parser(
        "plugins", help="list loaded plugins and what they provide; install one confined",
        usage="%(prog)s [--json] [install PATH|WHEEL | uninstall NAME]",
    )  # fmt: skip
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.set_defaults(handler=plugins_command)
    actions = plugins.add_subparsers(title="actions", metavar="{install,uninstall}")
    install = actions.add_parser(
        "install", prog="idrs-bench plugins install",
        help="build (confined, without network) and install a plugin into a private prefix "
        "that only its confined plugin host imports",
    )  # fmt: skip
    install.add_argument("path", metavar="PATH|WHEEL", type=Path,
                         help="the plugin's source folder, sdist or wheel")  # fmt: skip
    install.set_defaults(handler=install_command)
    uninstall = actions.add_parser("uninstall", prog="idrs-bench plugins uninstall",
                                   help="remove a plugin installed so")  # fmt: skip
    uninstall.add_argument("name", metavar="NAME", help="its distribution's name")
    uninstall.set_defaults(handler=uninstall_command)
    return plugins


def warn_plugin_failures(manager: PluginManager) -> None:
    """Each plugin that failed to load or register, as a warning on stderr."""
    manager.registry  # noqa: B018 - building it records registration failures
    for failure in manager.failures:
        Console(stderr=True, soft_wrap=True).print(
            f"[yellow]warning:[/yellow] {escape(failure.origin())} {escape(failure.why())}"
        )


def plugins_command(args: argparse.Namespace) -> int:
    """``idrs-bench plugins``: every plugin, where it runs, what it provides; failures."""
    from harness.plugin.manager import PluginManager

    with PluginManager() as manager:
        return _plugins_table(args, manager)


def _plugins_table(args: argparse.Namespace, manager) -> int:
    """``idrs-bench plugins`` with its plugin manager."""
    rows = manager.describe()
    failures = [
        {"plugin": f.plugin, "error": f.error, "stage": f.stage, "distribution": f.distribution,
         "version": f.version,
         "provides": None if f.provides is None else {k: list(v) for k, v in f.provides.items()}}
        for f in manager.failures
    ]  # fmt: skip
    if args.json:
        print(json.dumps({"plugins": rows, "failures": failures, "checks_not_run": manager.not_run},
                         indent=2))  # fmt: skip
        return 0
    table = Table(title="idrs-bench plugins")
    for column in ("plugin", "version", "runs in", "hooks", "provides"):
        table.add_column(column)
    for row in rows:
        provides = "\n".join(
            f"{kind}: {', '.join(names)}" for kind, names in sorted(row["provides"].items())
        )
        hooks = "\n".join(h.removeprefix("idrs_register_") for h in row["hooks"])
        where = row["runs_in"]
        if "confinement" in row:
            where += f" ({row['confinement']}{', private prefix' if row.get('private') else ''})"
        table.add_row(escape(row["name"]), escape(row["version"]), escape(where), hooks,
                      escape(provides))  # fmt: skip
    console = terminal()
    console.print(table)
    for check in manager.not_run:
        console.print(f"not run: check {escape(check)} (verdicts are the harness's own checks')")
    for failure in manager.failures:
        provides = "; ".join(f"{kind}: {', '.join(names)}"
                             for kind, names in sorted((failure.provides or {}).items()))  # fmt: skip
        console.print(
            f"[red]not loaded[/red] {escape(failure.origin())} {escape(failure.why())}"
            + (f" (it provides {escape(provides)})" if provides else "")
        )
    return 0


def install_command(args: argparse.Namespace) -> int:
    """``idrs-bench plugins install PATH``."""
    from harness.plugin.private_install import install

    name, version, prefix = install(args.path)
    print(f"installed {name} {version} into {prefix} (imported only by its confined plugin "
          "host; `idrs-bench plugins` lists its plugins)")  # fmt: skip
    return 0


def uninstall_command(args: argparse.Namespace) -> int:
    """``idrs-bench plugins uninstall NAME``."""
    from harness.plugin.private_install import uninstall

    print(f"removed {uninstall(args.name)}")
    return 0
