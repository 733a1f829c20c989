"""Where effects are counted lives in the kit's proof package, where the try-out finds it too."""

from {{ cookiecutter.project_slug }}_proof.sinks import Effects

__all__ = ["Effects"]
