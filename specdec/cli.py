"""What specdec's command lines share."""
from __future__ import annotations

import argparse
import importlib


class DEFAULTS(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows every option's default, also where the option has no help text."""

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and action.option_strings and action.default not in (None, argparse.SUPPRESS):
            action.help = "default: %(default)s"
        return super()._format_action(action)


def demo_module():
    """The Gradio app's module: `specdec.ui.demo` in an installed wheel, `components.demo` in a checkout."""
    for module in ("specdec.ui.demo", "components.demo"):
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] in ("gradio", "plotly"):
                raise ValueError("the app needs gradio and plotly: pip install 'specdec[app]'") from e
            if not module.startswith(e.name or "\0"):  # something the app imports is missing: a real error
                raise
    raise ValueError("the app is not installed: neither specdec.ui.demo nor components.demo can be imported")
