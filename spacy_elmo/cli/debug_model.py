"""`spacy-elmo debug-model`: spaCy's `debug model` for components that listen to `elmo`.

spaCy's command updates the analysed component alone; it knows to update the upstream first
only for components named `tok2vec` or `transformer`. Here every `elmo` component the analysed
one listens to is updated on the same docs first, so the listeners get real layers (wiring).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import _util as opt
from .command import command


@command(
    "debug-model",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def debug_model(
    ctx: typer.Context,
    config_path: Path = typer.Argument(..., help="Training config file.", exists=True),
    component: str = typer.Argument(..., help="Pipeline component whose model is analysed."),
    layers: str = typer.Option("", "--layers", "-l", help="Comma-separated layer IDs to print."),
    dimensions: bool = typer.Option(False, "--dimensions", "-DIM", help="Show dimensions."),
    parameters: bool = typer.Option(False, "--parameters", "-PAR", help="Show parameters."),
    gradients: bool = typer.Option(False, "--gradients", "-GRAD", help="Show gradients."),
    attributes: bool = typer.Option(False, "--attributes", "-ATTR", help="Show attributes."),
    print_step0: bool = typer.Option(False, "--print-step0", "-P0", help="Before training."),
    print_step1: bool = typer.Option(False, "--print-step1", "-P1", help="After initializing."),
    print_step2: bool = typer.Option(False, "--print-step2", "-P2", help="After training."),
    print_step3: bool = typer.Option(False, "--print-step3", "-P3", help="Final predictions."),
    use_gpu: int = opt.GPU,
    code: Optional[Path] = opt.CODE,
) -> None:
    """Analyse a component's model like `spacy debug model`, with its elmo upstream running.

    Extra `--section.key value` arguments override the config, as in spaCy's commands.
    """
    from spacy import util
    from spacy.cli._util import parse_config_overrides, setup_gpu, string_to_list
    from spacy.cli.debug_model import debug_model as spacy_debug_model
    from spacy.schemas import ConfigSchemaTraining
    from thinc.api import fix_random_seed, set_gpu_allocator

    from ..pipeline.component import Elmo, feed_listeners_of

    opt.device(use_gpu)  # no GPU: one clear error, before spaCy's "Using GPU"
    opt.import_code(code)
    setup_gpu(use_gpu)
    print_settings = {
        "dimensions": dimensions,
        "parameters": parameters,
        "gradients": gradients,
        "attributes": attributes,
        "layers": string_to_list(layers, intify=True),
        "print_before_training": print_step0,
        "print_after_init": print_step1,
        "print_after_training": print_step2,
        "print_prediction": print_step3,
    }
    raw_config = util.load_config(
        config_path, overrides=parse_config_overrides(ctx.args), interpolate=False
    )
    allocator = raw_config.interpolate()["training"]["gpu_allocator"]
    if use_gpu >= 0 and allocator:
        set_gpu_allocator(allocator)
    nlp = util.load_model_from_config(raw_config)
    config = nlp.config.interpolate()
    training = util.registry.resolve(config["training"], schema=ConfigSchemaTraining)
    if training["seed"] is not None:
        fix_random_seed(training["seed"])
    if component not in nlp.component_names:
        raise ValueError(f"no component '{component}' in {nlp.component_names}")
    fed = [
        name
        for name, pipe in nlp.pipeline
        if isinstance(pipe, Elmo) and feed_listeners_of(pipe, component)
    ]
    if fed:
        typer.echo(f"'{component}' listens to {', '.join(fed)}: updated first on the same docs")
    spacy_debug_model(config, training, nlp, nlp.get_pipe(component), print_settings=print_settings)
