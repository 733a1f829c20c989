"""The crash points live in the kit's proof package, where the try-out finds them too."""

from {{ cookiecutter.project_slug }}_proof.crash_points import CRASH_POINTS, PauseOrders, die, pausing, with_crash_point

__all__ = ["CRASH_POINTS", "PauseOrders", "die", "pausing", "with_crash_point"]
