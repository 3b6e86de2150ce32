"""The files the planner writes where the user says: one that exists is refused unless the
user forces it, and each is written whole or not at all (a temporary file in the same
folder, flushed to disk, renamed over the target)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from planner.errors import OutputExistsError, PlannerError


def refuse_existing(*paths: Path | None, force: bool = False, hint: str | None = None) -> None:
    """Refuse, in one error naming them, those of `paths` that exist (None: not asked for),
    unless `force`; `hint` says what to do instead (default: pass --force)."""
    existing = [str(path) for path in paths if path is not None and os.path.lexists(path)]
    if force or not existing:
        return
    one = len(existing) == 1
    hint = hint or f"pass --force to overwrite {'it' if one else 'them'}, or choose another path"
    raise OutputExistsError(f"{', '.join(existing)} exist{'s' if one else ''}: {hint}")


def write_atomic(path: Path, text: str, *, executable: bool = False, what: str = "") -> None:
    """Write `text` (UTF-8) to `path` in an existing folder: the finished file or the previous
    one, never a torn write, with a new file's permissions (and execute bits when `executable`).
    PlannerError names the `what` file when it cannot be written."""
    path = Path(path)
    umask = os.umask(0)
    os.umask(umask)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), (0o777 if executable else 0o666) & ~umask)  # not mkstemp's 0600
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise PlannerError(f"cannot write {what + ' ' if what else ''}{path}: {exc.strerror or exc}") from None
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp: str | None) -> None:
    """Delete the temporary file of a write that did not finish."""
    if tmp is not None:
        Path(tmp).unlink(missing_ok=True)
