"""The crash points live in the package, where the try-out (operations try-out) finds them too."""

from {{ cookiecutter.project_slug }}.crash_points import CRASH_POINTS, PauseOrders, die, pausing, with_crash_point

__all__ = ["CRASH_POINTS", "PauseOrders", "die", "pausing", "with_crash_point"]
