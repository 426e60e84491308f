"""The one base of the errors that end a command with one line, ``fleet:
MESSAGE``, and an exit status.

An error a user can act on derives from :class:`FleetError` (beside the builtin it always was, so
``except ValueError`` still catches it): ``str()`` is its whole message on one line, without the
``fleet:``, and ``exit_status`` what the command exits with (fleet/exitcodes.py). The command line
turns it into the line and the status in one place (``fleet/cli/main.py``); below the CLI it is
raised, never printed.

The controller's alone: the agent runs on the nodes without fleet installed, so its errors
(fleet/agent/, and what travels with it: the policy, the planner, safenames) keep their own bases.
"""

from __future__ import annotations

from . import exitcodes


class FleetError(Exception):
    """A one-line message and the exit status it ends a command with: USAGE (bad arguments,
    inventory, playbook; nothing was touched) unless the class says otherwise."""

    exit_status: int = exitcodes.USAGE
