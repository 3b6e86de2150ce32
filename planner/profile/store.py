"""Reading and writing profile files: the only code that touches them.

`save` writes atomically (a temporary file in the same directory, flushed to disk, then
renamed over the target with os.replace), so a profile interrupted at any moment is either
the previous complete file or the new one, never a torn write.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from pydantic import ValidationError

from planner.errors import ConfigError
from planner.profile.schema import Profile
from planner.spec import validation_message


def load(path: Path) -> Profile:
    """The profile in `path`; ConfigError naming the field when it fails its schema."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read profile {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"profile {path} is not valid JSON: {exc}") from None
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, f"profile {path}")) from None


def save(path: Path, profile: Profile) -> None:
    """Write `profile` to `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = profile.model_dump_json(indent=1) + "\n"
    umask = os.umask(0)
    os.umask(umask)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            os.fchmod(handle.fileno(), 0o666 & ~umask)  # not mkstemp's private 0600
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
