"""What every config section shares: the ``Section`` base (camelCase keys, typos rejected,
no coercion), ``ConfigError`` (one line naming the file and key path), and ``TokenRef``, a
secret given from the environment or inline and never repeated in a message."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic.alias_generators import to_camel

from broker.manifest import FieldError


class ConfigError(ValueError):
    """A configuration the operator got wrong: one line, ``<file>: <key path>: <problem>``."""


class Section(BaseModel):
    """camelCase keys as in the YAML, typos rejected, no silent coercion ("8080" is no port)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", strict=True, frozen=True)


class TokenRef(Section):
    """A bearer token, read from the environment (``env``) or written inline (``value``)."""

    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)
    value: SecretStr | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> TokenRef:
        if (self.env is None) == (self.value is None):
            raise FieldError([], "give exactly one of: env, value")
        return self

    def resolve(self, environ: Mapping[str, str]) -> SecretStr:
        """The token; raises FieldError (path relative to this TokenRef) when unusable."""
        if self.value is not None:
            token = self.value
        elif self.env is not None and self.env in environ:
            token = SecretStr(environ[self.env])
        else:
            raise FieldError(["env"], f"environment variable {self.env} is not set")
        if not token.get_secret_value():
            raise FieldError(["value" if self.value is not None else "env"], "token is empty")
        return token
