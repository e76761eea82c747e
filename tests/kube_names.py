"""Names as the API server checks them (kubernetes/kubernetes
``staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go``): ``IsDNS1123Label``
(63), ``IsDNS1123Subdomain`` (253), ``IsQualifiedName`` (an optional DNS subdomain prefix and
``/``, a name part of 63), ``IsValidLabelValue`` (63, may be empty) and ``IsValidPortName``
(IANA service names, 15), each returning the server's messages."""

from __future__ import annotations

import re

from kube_schema import Cause, invalid

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(_LABEL)
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_QUALIFIED = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_PORT_NAME = re.compile(r"[-a-z0-9]+")
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
    "'-', and must start and end with an alphanumeric character"
)
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
    "characters, '-' or '.', and must start and end with an alphanumeric character"
)
QUALIFIED_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character"
)
VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, "
    "'-', '_' or '.', and must start and end with an alphanumeric character"
)


def dns_label(value: str) -> list[str]:
    out = ["must be no more than 63 characters"] if len(value) > 63 else []
    return out + ([] if _DNS_LABEL.fullmatch(value) else [LABEL_MSG])


def dns_subdomain(value: str) -> list[str]:
    out = ["must be no more than 253 characters"] if len(value) > 253 else []
    return out + ([] if _DNS_SUBDOMAIN.fullmatch(value) else [SUBDOMAIN_MSG])


def qualified_name(value: str) -> list[str]:
    prefix, slash, name = value.rpartition("/")
    if value.count("/") > 1:
        return [
            "a qualified name must consist of alphanumeric characters with an optional "
            "DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    out = [f"prefix part {m}" for m in dns_subdomain(prefix)] if slash else []
    if not name:
        return [*out, "name part must be non-empty"]
    if len(name) > 63:
        out.append("name part must be no more than 63 characters")
    return out + ([] if _QUALIFIED.fullmatch(name) else [QUALIFIED_MSG])


def label_value(value: str) -> list[str]:
    out = ["must be no more than 63 characters"] if len(value) > 63 else []
    return out + ([] if _LABEL_VALUE.fullmatch(value) else [VALUE_MSG])


def port_name(value: str) -> list[str]:
    checks = [
        (len(value) <= 15, "must be no more than 15 characters"),
        (
            _PORT_NAME.fullmatch(value) is not None,
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
        ),
        ("--" not in value, "must not contain consecutive hyphens"),
        (re.search("[a-z]", value) is not None, "must contain at least one letter (a-z)"),
        (
            not value.startswith("-") and not value.endswith("-"),
            "must not begin or end with a hyphen",
        ),
    ]
    return [message for ok, message in checks if not ok]


def each(path: str, value: str, problems: list[str]) -> list[Cause]:
    return [invalid(path, value, p) for p in problems]
