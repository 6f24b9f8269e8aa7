"""Entry point: the ``pyramid-gguf`` click group.

Every command is a :class:`~.options.PyramidCommand`: a
:class:`~pyramid_gguf.core.errors.UserError` becomes one line on stderr (``Error: ...``) and exit
status 1, never a traceback. The groups do the same for a malformed command line (an unknown
command, with the closest one suggested, or an unknown option), and turn Ctrl-C into a quiet
exit 130, also while llama.cpp is loading a model (:mod:`.interrupts`).
"""

from __future__ import annotations

import click

from .group import PyramidGroup


@click.group(cls=PyramidGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pyramid-gguf")
def main() -> None:
    """Pyramid speculative decoding for GGUF models: draft -> qualifier -> target."""


def _register() -> None:
    from . import bench, calibrate, models, plan, rpc_server, run, serve, traces, tune

    main.add_command(run.run)
    main.add_command(models.models)
    main.add_command(models.pull)
    main.add_command(models.derive)
    main.add_command(plan.plan)
    main.add_command(bench.bench)
    main.add_command(tune.tune)
    main.add_command(calibrate.calibrate)
    main.add_command(traces.traces)
    main.add_command(serve.serve)
    main.add_command(rpc_server.rpc_server)


_register()
