"""Load application settings from a JSON file, with defaults, types and readable errors."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 2
    debug: bool = False
    log_level: str = "info"
    upload_dir: str = "uploads"
    max_upload_mb: float = 10.0

    LEVELS = ("debug", "info", "warning", "error")

    def validate(self) -> "Settings":
        if not 0 < self.port < 65536:
            raise SettingsError(f"port must be between 1 and 65535, got {self.port}")
        if self.workers < 1:
            raise SettingsError(f"workers must be at least 1, got {self.workers}")
        if self.log_level not in self.LEVELS:
            raise SettingsError(f"log_level must be one of {', '.join(self.LEVELS)}, got {self.log_level!r}")
        if self.max_upload_mb <= 0:
            raise SettingsError("max_upload_mb must be positive")
        return self


def _coerce(name: str, kind: type, raw):
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return raw.lower() in ("1", "true", "yes", "on")
        raise SettingsError(f"{name} must be true or false, got {raw!r}")
    try:
        return kind(raw)
    except (TypeError, ValueError):
        raise SettingsError(f"{name} must be a {kind.__name__}, got {raw!r}") from None


def load(path: str | os.PathLike | None = None, env_prefix: str = "APP_") -> Settings:
    """Defaults, then the JSON file (if any), then environment variables such as APP_PORT=9000."""
    values = {}
    if path is not None:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise SettingsError(f"settings file {path} does not exist") from None
        except json.JSONDecodeError as err:
            raise SettingsError(f"{path}: line {err.lineno}: {err.msg}") from None
        if not isinstance(data, dict):
            raise SettingsError(f"{path} must hold a JSON object")
        values.update(data)
    known = {f.name: f for f in fields(Settings)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise SettingsError(f"unknown settings: {', '.join(unknown)}")
    for name in known:
        env = os.environ.get(env_prefix + name.upper())
        if env is not None:
            values[name] = env
    kinds = {"host": str, "port": int, "workers": int, "debug": bool, "log_level": str,
             "upload_dir": str, "max_upload_mb": float}
    typed = {name: _coerce(name, kinds[name], raw) for name, raw in values.items()}
    return Settings(**typed).validate()
