"""Errors raised for bad user input; the CLI turns each into one line on stderr and exit 2."""


class PlannerError(ValueError):
    """A problem with what the user asked for: the message names the numbers and the fix."""


class UnknownPresetError(PlannerError):
    """A model or GPU name that is neither a built-in preset nor a readable file."""


class ConfigError(PlannerError):
    """A model, cluster, profile or plan file that fails its schema."""


class LayoutError(PlannerError):
    """A parallel layout that cannot exist: degrees that do not divide, batches that do not split."""


class ScheduleError(PlannerError):
    """A pipeline schedule that is invalid or not defined for the requested shape."""


class NoFeasiblePlanError(PlannerError):
    """No layout in the searched space fits in memory."""


class ExportError(PlannerError):
    """A plan the target runtime cannot run."""


class OutputExistsError(PlannerError):
    """An output file that already exists, and no --force to overwrite it."""
