"""Where effects are counted lives in the package, where the try-out (operations try-out) finds it too."""

from {{ cookiecutter.project_slug }}.sinks import Effects

__all__ = ["Effects"]
