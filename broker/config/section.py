"""What every config section shares: the ``Section`` base (camelCase keys, typos rejected,
no coercion), ``ConfigError`` (one line naming the file and key path), and ``TokenRef``, a
secret given from the environment, inline or in a file, never repeated in a message."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic.alias_generators import to_camel

from broker.manifest import FieldError


class ConfigError(ValueError):
    """A configuration the operator got wrong: one line, ``<file>: <key path>: <problem>``."""


class Section(BaseModel):
    """camelCase keys as in the YAML, typos rejected, no silent coercion ("8080" is no port)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", strict=True, frozen=True)


class TokenRef(Section):
    """A secret (a token, a password, a key), read from the environment (``env``), written
    inline (``value``) or read from a file (``file``: a mounted Secret; one trailing newline
    dropped)."""

    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)
    value: SecretStr | None = None
    file: str | None = Field(default=None, min_length=1, max_length=4096)

    @model_validator(mode="after")
    def _exactly_one(self) -> TokenRef:
        if sum(x is not None for x in (self.env, self.value, self.file)) != 1:
            raise FieldError([], "give exactly one of: env, value, file")
        return self

    def resolve(self, environ: Mapping[str, str]) -> SecretStr:
        """The token; raises FieldError (path relative to this TokenRef) when unusable."""
        key = "value" if self.value is not None else "file" if self.file is not None else "env"
        if self.value is not None:
            token = self.value
        elif self.file is not None:
            token = SecretStr(self.read_file())
        elif self.env is not None and self.env in environ:
            token = SecretStr(environ[self.env])
        else:
            raise FieldError(["env"], f"environment variable {self.env} is not set")
        if not token.get_secret_value():
            raise FieldError([key], "token is empty")
        return token

    def read_file(self) -> str:
        """The file's text without its trailing newline ("" for no file); FieldError
        naming ``file`` (never its content) when it cannot be read."""
        if self.file is None:
            return ""
        try:
            text = Path(self.file).read_text(encoding="utf-8")
        except OSError as exc:
            raise FieldError(["file"], f"cannot read {self.file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise FieldError(["file"], f"{self.file} is not UTF-8 text") from None
        return text.removesuffix("\n").removesuffix("\r")
