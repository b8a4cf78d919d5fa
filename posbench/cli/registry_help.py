"""Help filled in from the registries (a plugin's too) when the help is shown, not when the command line is built:
importing them takes seconds (torch), which ``posbench compare`` never pays (``posbench.cli.registry_texts`` makes
it).
"""

from __future__ import annotations

from typing import Any, ClassVar

from typer.core import TyperCommand


class RegistryHelp(TyperCommand):
    """A command whose options' help is made when shown (``fills``: option name -> the name of the function of
    ``posbench.cli.registry_texts`` giving it)."""

    fills: ClassVar[dict[str, str]] = {}

    def format_help(self, ctx: Any, formatter: Any) -> None:
        from posbench.cli import registry_texts  # torch: this help names every registered class

        for param in self.params:
            if param.name in self.fills:
                param.help = getattr(registry_texts, self.fills[param.name])()
        return super().format_help(ctx, formatter)
