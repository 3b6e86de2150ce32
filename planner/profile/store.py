"""Reading and writing profile files: the only code that touches them.

`save` writes atomically (planner.output.write_atomic), so a profile interrupted at any
moment is either the previous complete file or the new one, never a torn write.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from planner.errors import ConfigError
from planner.output import write_atomic
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
    write_atomic(path, profile.model_dump_json(indent=1) + "\n", what="profile")
