"""Who is calling: the tenant of a call, from its bearer token (CTI-1), never from a request field.

``[auth] tenants`` lists each tenant with the SHA-256 of its token; the token itself is never
configured or stored. With no tenants configured, every call belongs to :data:`DEFAULT_TENANT`.
"""

from __future__ import annotations

from typing import cast

import grpc

from sidecar.errors import Unauthenticated
from sidecar.settings import DEFAULT_TENANT, AuthSettings, TenantCredential


class TenantOf:
    """CTI-1: the tenant of a call comes from its bearer token, never from a request field."""

    def __init__(self, tenants: tuple[TenantCredential, ...]) -> None:
        self._auth = AuthSettings(tenants)

    def __call__(self, context: grpc.ServicerContext) -> str:
        if not self._auth.tenants:
            return DEFAULT_TENANT
        for name, value in context.invocation_metadata():
            if name == "authorization":
                # Only a key ending in "-bin" carries bytes: this one's value is text.
                scheme, _, token = cast(str, value).partition(" ")
                tenant = self._auth.tenant_of_token(token) if scheme.lower() == "bearer" else None
                if tenant is None:
                    raise Unauthenticated("the bearer token names no tenant")
                return tenant
        raise Unauthenticated("the call carries no 'authorization: Bearer <token>' metadata")
