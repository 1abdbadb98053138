"""A plain Django view (no DRF) protected with ``@idempotent``: the README's partner endpoint.

Django does not log API clients in, so the scope names the caller from its token:
without one the answer is ``403 idempotency_scope_unavailable`` and nothing is written.
"""

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from idempotency import ScopeUnavailable, idempotent

# A demo token: a real project keeps its partners' tokens in a model or a secrets store.
API_TOKENS = {"partner-token-1": "acme"}


def token_scope(request: HttpRequest, operation: str) -> str:
    partner = API_TOKENS.get(request.headers.get("Authorization", "").removeprefix("Token "))
    if partner is None:
        raise ScopeUnavailable()
    return f"partner:{partner}:{operation}"


@csrf_exempt  # API clients send a token, not Django's CSRF cookie
@idempotent(scope=token_scope)
def partner_order(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"accepted": True}, status=201)
