"""Parsing as srun, clush and nsys do it: fleet's options end at the first word of the workload.

``fleet profile [OPTIONS] COMMAND...`` and ``fleet exec [OPTIONS] TARGETS [OPTIONS] COMMAND...``
read their own options up to the command's first word; everything from there on is the
workload's, with or without ``--`` (``fleet exec all ls -x /`` runs ``ls -x /``). An option fleet
does not know before that word is an error with click's did-you-mean, never part of the workload.
"""

from __future__ import annotations

import click


def seconds(ctx, param, value):
    """A number of seconds (a click callback, beside a FloatRange: it lets NaN through)."""
    if value is not None and value != value:
        raise click.BadParameter(f"{value} is not a number of seconds")
    return value


class WorkloadCommand(click.Command):
    """A command whose last argument is a workload (nargs=-1, UNPROCESSED) that starts at the
    first word after ``leading`` positional arguments (exec's TARGETS), options before it."""

    def __init__(self, *args, leading: int = 0, **kwargs):
        kwargs.setdefault("context_settings", {})["allow_interspersed_args"] = False
        super().__init__(*args, **kwargs)
        self.leading = leading

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        options, positionals, workload = split_workload(ctx, args, self.leading)
        # Everything after "--" is positional for click: the leading arguments, then the workload.
        return super().parse_args(ctx, [*options, "--", *positionals, *workload])


def _takes_value(ctx: click.Context) -> dict[str, bool]:
    """Each option name of the context's command and whether a separate value follows it."""
    names: dict[str, bool] = {}
    for p in ctx.command.get_params(ctx):
        if isinstance(p, click.Option):
            value = not (p.is_flag or p.count)
            for name in (*p.opts, *p.secondary_opts):
                names[name] = value
    return names


def split_workload(ctx: click.Context, args: list[str], leading: int) -> tuple[list[str], list[str],
                                                                               list[str]]:
    """(fleet's options, the leading positionals, the workload) of ``args``.

    An unknown option stays among fleet's options, so that click refuses it by name."""
    known = _takes_value(ctx)
    options: list[str] = []
    positionals: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            rest = args[i + 1:]
            take = max(0, leading - len(positionals))
            return options, positionals + rest[:take], rest[take:]
        if word.startswith("-") and word != "-":
            options.append(word)
            if known.get(word) and i + 1 < len(args):  # "--tool ncu": the value is the option's
                options.append(args[i + 1])
                i += 1
        elif len(positionals) < leading:
            positionals.append(word)
        else:
            return options, positionals, args[i:]
        i += 1
    return options, positionals, []


def refuse_options(ctx: click.Context, names: list[str], why: str) -> None:
    """Exit 2 naming those of ``names`` (parameter names) that were given on the command line."""
    from .context import fail

    given = [p for p in ctx.command.params if p.name in names and
             ctx.get_parameter_source(p.name) not in (click.core.ParameterSource.DEFAULT, None)]
    if given:
        spelled = ", ".join("/".join(p.opts) for p in given)
        fail(f"{spelled}: {why}")


class Day(click.ParamType):
    """A calendar day, YYYY-MM-DD, handed on as that text (the catalog compares ISO timestamps)."""

    name = "YYYY-MM-DD"

    def convert(self, value, param, ctx):
        import datetime

        try:
            return datetime.date.fromisoformat(str(value)).isoformat()
        except ValueError:
            self.fail(f"{value!r} is not a date; write it as YYYY-MM-DD, e.g. 2024-05-31", param,
                      ctx)
