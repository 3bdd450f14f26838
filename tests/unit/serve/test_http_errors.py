"""A request to no route is answered in OpenAI's format, listing every route the server has."""

from __future__ import annotations

from fastapi.routing import APIRoute

from tests.unit.serve.conftest import KEY

AUTH = {"Authorization": f"Bearer {KEY}"}


def test_a_404_lists_every_route_of_the_router(served):
    client = served[0]
    response = client.get("/v1/nowhere", headers=AUTH)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "not_found"
    routes = [route for route in client.app.routes if isinstance(route, APIRoute)]
    assert len(routes) >= 10
    for route in routes:
        for method in route.methods - {"HEAD"}:
            assert f"{method} {route.path}" in error["message"]
