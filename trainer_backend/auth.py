"""API keys and who owns what.

The server stores a digest of each key, never the key, and tags every session, model, checkpoint and future with
it: another key cannot see them. With no keys configured the server runs open: it accepts any key, and still
keeps each key's things apart. Open mode is only allowed on a loopback address.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass

from trainer_backend.errors import AuthenticationError, UserInputError

ANONYMOUS_OWNER = "anonymous"


def owner_of_key(api_key: str) -> str:
    return "key-" + hashlib.sha256(api_key.encode()).hexdigest()[:32]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class KeyPolicy:
    """The keys the server accepts; empty means open mode (any key accepted, each key its own owner)."""

    keys: frozenset[str] = frozenset()

    def check_bind(self, host: str) -> None:
        """Refuse to serve without keys on an address other machines can reach."""
        if not self.keys and not is_loopback(host):
            raise UserInputError(
                f"refusing to serve on {host} without API keys: pass --api-key (or TRAINER_BACKEND_API_KEYS) "
                "or bind to 127.0.0.1"
            )

    def owner(self, api_key: str | None) -> str:
        """The owner a request acts for; raises AuthenticationError for a missing or unknown key."""
        if not self.keys:
            return owner_of_key(api_key) if api_key else ANONYMOUS_OWNER
        if not api_key:
            raise AuthenticationError("missing API key: send it in the X-API-Key header")
        if api_key not in self.keys:
            raise AuthenticationError("unknown API key")
        return owner_of_key(api_key)
