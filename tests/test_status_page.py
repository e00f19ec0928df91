"""The controller's status page (`GET /status`) in headless Chromium, against a real controller.

The controller runs on uvicorn on a loopback port, asking for credentials, with fake agents
(`helpers.fake_fleet`) whose heartbeats report their assigned shards up, so replicas become
ready as they would. The page, as the operator sees it (the text of its cells, the colours of
its GPU strips), is compared with `GET /v1/admin/state` and `GET /v1/admin/events` read by the
test until they agree (bounded waits, never sleeps); then the fleet changes and the page
follows without a reload.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import ConsoleMessage, Page, Request

from helpers.browser import page
from helpers.controller import registration, runtime_of
from helpers.fake_fleet import Fleet, running_fleet
from helpers.live import live_controller
from helpers.services import wait_sync
from llmgw_twin.service.common.auth import new_token
from llmgw_twin.service.controller.routes import create_controller_app

SCREENSHOT = Path("/tmp/status-page.png")  # noqa: S108  (asked for outside the test's own tree)
MARKUP = '<img src=x onerror="document.body.dataset.pwned=1">'
"""Text an agent puts into a failure reason: the page must show it as text."""


def populate(f: Fleet) -> None:
    """Two fabrics (a1, a2 of 4 GPUs in ib-a; b1 of 8 in ib-b, its GPU 7 failed), a 2-node
    replica, two 1-node ones, and one that fits nowhere (16 GPUs on one node)."""
    f.add_node("a1", "ib-a", 4)
    f.add_node("a2", "ib-a", 4)
    f.add_node("b1", "ib-b", 8, failed=(7,))
    wait_sync(
        lambda: True if [n["failed_gpus"] for n in f.state()["nodes"]] == [[], [], [7]] else None,
        30,
        "b1's failed GPU heard",
    )
    for name, nodes, gpus in (("pair", 2, 4), ("small", 1, 2), ("huge", 1, 16)):
        body = {"engine": "sim", "nodes": nodes, "gpus_per_node": gpus, "model": "/models/m"}
        f.put(f"/v1/admin/profiles/{name}", body)
    f.put("/v1/admin/deployments/llama", {"profile": "pair", "replicas": 1})
    wait_sync(lambda: f.replicas("ready") or None, 30, "the 2-node replica ready")
    f.put("/v1/admin/deployments/tiny", {"profile": "small", "replicas": 2})
    f.put("/v1/admin/deployments/giant", {"profile": "huge", "replicas": 1})

    def settled() -> bool | None:
        states = sorted((r["model"], r["state"]) for r in f.replicas())
        want = [("giant", "pending"), ("llama", "ready"), ("tiny", "ready"), ("tiny", "ready")]
        unplaceable = any(e["kind"] == "replica.unplaceable" for e in f.events())
        return True if states == want and unplaceable else None

    wait_sync(settled, 30, "three replicas ready and one pending")


# --- the page as the operator sees it, and what it should show --------------------------------

VIEW_JS = """() => {
  const text = (e) => e.textContent;
  const rows = (sel) => Array.from(document.querySelectorAll(sel));
  return {
    conn: document.body.dataset.conn || null,
    nodes: rows('#fabrics > section').flatMap((f) => Array.from(f.querySelectorAll('tbody tr'))
      .map((tr) => [f.querySelector('h3 .name').textContent,
        ...Array.from(tr.children).slice(0, 5).map(text),
        Array.from(tr.querySelectorAll('.gpu')).map((g) => g.className)])),
    replicas: rows('#replicas tr').map((tr) => Array.from(tr.children).map(text)),
    pending: rows('#pending li').map(text),
    events: rows('#events li').map((li) => [li.children[1].textContent,
      li.children[2].textContent]),
  };
}"""


def view(p: Page) -> dict[str, Any]:
    out: dict[str, Any] = p.evaluate(VIEW_JS)
    return out


def reason_of(r: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """The state's own `reason` when it has one; for a pending replica, else, the reason of
    its latest `replica.unplaceable` event."""
    if isinstance(r.get("reason"), str) and r["reason"]:
        return str(r["reason"])
    if r["state"] != "pending":
        return ""
    mine = [e for e in events if e["kind"] == "replica.unplaceable"]
    said = [e["subjects"]["reason"] for e in mine if e["subjects"]["replica"] == r["replica"]]
    return str(said[-1]) if said else ""


def expected(state: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    nodes = {n["node"]: n for n in state["nodes"]}
    rows = []
    for fabric in state["fabrics"]:
        for name in fabric["nodes"]:
            n = nodes[name]
            used = sum(1 for g in n["gpus"] if g["replica"] is not None)
            strip = [
                "gpu gpu-"
                + (
                    "failed"
                    if g["index"] in n["failed_gpus"]
                    else "used"
                    if g["replica"]
                    else "free"
                )
                for g in n["gpus"]
            ]
            link = "up" if n["fabric_link_up"] else "down"
            if n["stale"]:  # a node not heard from: the last value heard, marked as such
                link = f"unknown (last heard {link})"
            counts = f"{used} / {n['gpu_count']}"
            health = (n["state"] or "unknown") + "".join(
                f" {x}" for x in ("cordoned", "draining") if n.get(x)
            )
            rows.append([fabric["fabric"], name, health, link, counts, str(len(n["failed_gpus"]))])
            rows[-1].append(strip)
    replicas, pending = [], []
    for r in state["replicas"]:
        up = sum(1 for s in r["shards"] if s["state"] in ("running", "serving"))
        shards = f"{up} / {len(r['shards'])}" if r["shards"] else ""
        unheard = [s["node"] for s in r["shards"] if nodes[s["node"]]["stale"]]
        if unheard:
            shards += f" (last heard: {', '.join(unheard)})"
        reason = reason_of(r, events)
        fabric, members = r["fabric"] or "", ", ".join(r["nodes"])
        shown = "ready, unroutable" if r["state"] == "ready" and not r["routable"] else r["state"]
        replicas.append([r["replica"], r["model"], shown, fabric, members, shards, reason])
        if r["state"] == "pending":
            pending.append(
                f"{r['replica']} ({r['model']}): {reason or 'waiting for a placement pass'}"
            )
    return {"nodes": rows, "replicas": sorted(replicas), "pending": sorted(pending)}


def agree(p: Page, f: Fleet, within_s: float = 30) -> dict[str, Any]:
    """Wait until the page shows what the admin API says (read again each time); the page's view."""
    last: list[Any] = []

    def probe() -> dict[str, Any] | None:
        state, events = f.state(), f.events()
        seen = view(p)
        want = expected(state, events)
        got = {k: sorted(seen[k]) if k != "nodes" else seen[k] for k in want}
        newest = events[-100:][::-1]
        listed = len(seen["events"]) == len(newest) and all(
            kind == e["kind"] and shows(text, e["subjects"])
            for (kind, text), e in zip(seen["events"], newest, strict=False)
        )
        last[:] = [want, got, listed]
        return seen if got == want and listed and seen["conn"] == "ok" else None

    try:
        return wait_sync(probe, within_s, "the page to show what the admin API says")
    except AssertionError as e:
        raise AssertionError(
            f"{e}: wanted {last[0]}, saw {last[1]}, events listed: {last[2]}"
        ) from None


def shows(text: str, subjects: dict[str, Any]) -> bool:
    """An event's row names each of its subjects (a long row is cut)."""
    if text.endswith("\u2026"):
        return True
    scalars = {k: v for k, v in subjects.items() if isinstance(v, str | int) and k != "argv"}
    return all(
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" in text for k, v in scalars.items()
    )


def watch(p: Page) -> tuple[list[Request], list[str]]:
    """Every request the page makes, and every console error or warning and page error."""
    requests: list[Request] = []
    problems: list[str] = []

    def console(m: ConsoleMessage) -> None:
        if m.type in ("error", "warning"):
            problems.append(f"console {m.type}: {m.text}")

    def request(r: Request) -> None:  # (a bound builtin cannot take Playwright's handler slot)
        requests.append(r)

    p.on("request", request)
    p.on("console", console)
    p.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    return requests, problems


def node_row(seen: dict[str, Any], node: str) -> list[Any]:
    return next(row for row in seen["nodes"] if row[1] == node)


def test_the_page_shows_the_fleet_and_follows_it_without_a_reload(tmp_path: Path) -> None:
    with running_fleet(tmp_path) as f, page() as p:
        populate(f)
        requests, problems = watch(p)
        answer = p.goto(f"{f.url}/status#token={f.admin}")
        assert answer is not None and answer.status == 200
        html, headers = answer.text(), answer.headers
        assert headers["content-type"].startswith("text/html")
        csp = headers["content-security-policy"]
        found = re.search(r"<script>(.*?)</script>", html, re.S)
        assert found is not None
        digest = base64.b64encode(hashlib.sha256(found.group(1).encode()).digest()).decode()
        assert f"script-src 'sha256-{digest}'" in csp
        for directive in ("default-src 'none'", "connect-src 'self'", "frame-ancestors 'none'"):
            assert directive in csp
        assert "unsafe" not in csp
        assert headers["x-frame-options"] == "DENY"
        for fleet_text in ("ib-a", "ib-b", "llama", "giant", f.admin):
            assert fleet_text not in html  # the page is static: the fleet comes through the API

        seen = agree(p, f)
        p.evaluate("window.loadedOnce = true")
        assert p.evaluate("location.hash") == ""  # the token left the address bar
        assert p.evaluate("sessionStorage.getItem('llmgw-twin.admin-token')") == f.admin
        assert p.evaluate("localStorage.length") == 0
        assert [row[:2] for row in seen["nodes"]] == [
            ["ib-a", "a1"],
            ["ib-a", "a2"],
            ["ib-b", "b1"],
        ]
        assert [row[2:5] for row in seen["nodes"]] == [["alive", "up", "4 / 4"]] * 2 + [
            ["alive", "up", "4 / 8"]
        ]
        assert node_row(seen, "b1")[5] == "1" and node_row(seen, "b1")[6][7] == "gpu gpu-failed"
        [giant] = [r for r in seen["replicas"] if r[1] == "giant"]
        assert giant[2] == "pending" and giant[6] != ""
        assert seen["pending"] == [f"{giant[0]} (giant): {giant[6]}"]
        kinds = [kind for kind, _ in seen["events"]]
        assert {"node.joined", "replica.ready", "replica.unplaceable"} <= set(kinds)

        # an agent's words in a failure reason are shown as text, never run as markup
        [victim, *_] = [r["replica"] for r in f.replicas("ready") if r["model"] == "tiny"]
        with f.agents.lock:
            f.agents.exits[victim] = MARKUP
        p.wait_for_function(
            "(markup) => Array.from(document.querySelectorAll('#events li'))"
            ".some((li) => li.textContent.includes(markup))",
            arg=MARKUP,
        )
        assert p.locator("#events img, #replicas img").count() == 0
        assert p.evaluate("document.body.dataset.pwned") is None

        # the fleet changes: a deployment scaled, a node in a new fabric, a node falls silent
        f.put("/v1/admin/deployments/tiny", {"profile": "small", "replicas": 3})
        f.add_node("c1", "ib-c", 2)
        with f.agents.lock:
            f.agents.beating.discard("a2")
        p.wait_for_function(
            """() => {
              const a2 = document.querySelector('#fabrics tr[data-node="a2"] td:nth-child(2)');
              const c1 = document.querySelector('[data-fabric="ib-c"] tr[data-node="c1"]');
              const tiny = Array.from(document.querySelectorAll('#replicas tr'))
                .filter((tr) => tr.children[1].textContent === 'tiny');
              return a2 && ['suspect', 'lost'].includes(a2.textContent) && c1 && tiny.length === 3;
            }"""
        )
        seen = agree(p, f)
        assert p.evaluate("window.loadedOnce") is True  # updated in place, never reloaded
        assert node_row(seen, "a2")[2] in ("suspect", "lost")
        # its link is not shown up in green: the last value heard, in grey, said to be so
        assert node_row(seen, "a2")[3] == "unknown (last heard up)"
        a2_link = p.locator('#fabrics tr[data-node="a2"] td:nth-child(3) span')
        assert a2_link.get_attribute("class") == "badge link-stale"
        a1_link = p.locator('#fabrics tr[data-node="a1"] td:nth-child(3) span')
        assert a1_link.get_attribute("class") == "badge link-up"
        assert node_row(seen, "c1")[:3] == ["ib-c", "c1", "alive"]
        p.screenshot(path=str(SCREENSHOT), full_page=True)

        admin_reads = [r for r in requests if "/v1/admin/" in r.url]
        assert admin_reads, "the page read nothing"
        for r in requests:
            assert f.admin not in r.url, r.url
        for r in admin_reads:
            assert r.all_headers().get("authorization") == f"Bearer {f.admin}", r.url
        assert any(re.search(r"/v1/admin/events\?after=[1-9]", r.url) for r in admin_reads)
        assert problems == []


def test_a_token_from_the_form_a_wrong_one_refused_and_a_forgotten_one(tmp_path: Path) -> None:
    with running_fleet(tmp_path) as f, page() as p:
        f.add_node("a1", "ib-a", 4)
        requests, problems = watch(p)
        p.goto(f"{f.url}/status")
        assert p.is_visible("#token-input")
        assert p.evaluate("document.body.dataset.conn") == "auth"

        wrong = new_token()
        p.fill("#token-input", wrong)
        p.click("#token-form button[type=submit]")
        p.wait_for_function(
            "() => document.getElementById('conn-label').textContent === 'token refused'"
        )
        assert "invalid credentials" in (p.text_content("#token-error") or "")
        assert p.is_visible("#token-input")
        assert view(p)["nodes"] == []

        p.fill("#token-input", f.admin)
        p.click("#token-form button[type=submit]")
        seen = agree(p, f)
        assert [row[:3] for row in seen["nodes"]] == [["ib-a", "a1", "alive"]]
        assert not p.is_visible("#token-input")
        assert p.evaluate("sessionStorage.getItem('llmgw-twin.admin-token')") == f.admin

        # forgotten: the fleet leaves the page, the form is back, and stays after a reload
        p.click("#forget")
        assert view(p)["nodes"] == [] and p.is_visible("#token-input")
        assert p.evaluate("sessionStorage.length") == 0
        p.reload()
        assert p.is_visible("#token-input")
        assert p.evaluate("document.body.dataset.conn") == "auth"

        admin_reads = [r for r in requests if "/v1/admin/" in r.url]
        asked = {r.all_headers().get("authorization") for r in admin_reads}
        assert asked == {f"Bearer {wrong}", f"Bearer {f.admin}"}  # never without a token
        for r in requests:
            assert wrong not in r.url and f.admin not in r.url, r.url
        refused = "Failed to load resource: the server responded with a status of 401"
        assert [m for m in problems if refused not in m] == []
        assert any(refused in m for m in problems)


def test_without_auth_no_token_is_asked_and_a_lost_controller_is_shown(tmp_path: Path) -> None:
    with page() as p:
        requests, problems = watch(p)
        with live_controller(lambda: create_controller_app(runtime_of(tmp_path))) as url:
            with httpx.Client(base_url=url, trust_env=False, timeout=10) as client:
                r = client.post("/v1/agents/register", json=registration("n1"))
                assert r.status_code == 200, r.text
            p.goto(f"{url}/status")
            p.wait_for_selector('#fabrics tr[data-node="n1"]')
            assert p.evaluate("document.body.dataset.conn") == "ok"
            assert not p.is_visible("#token-input")
            admin_reads = [r for r in requests if "/v1/admin/" in r.url]
            assert admin_reads
            assert all("authorization" not in r.all_headers() for r in admin_reads)
        # the controller is gone: the page says so, backs off, and keeps what it saw last
        p.wait_for_function("() => document.body.dataset.conn === 'down'")
        assert p.text_content("#conn-label") == "disconnected"
        assert "retrying in" in (p.text_content("#conn-detail") or "")
        assert (p.text_content("#updated") or "").startswith("last updated ")
        assert p.is_visible('#fabrics tr[data-node="n1"]')
        assert "stale" in (p.get_attribute("#main", "class") or "")
        unreachable = "net::ERR_CONNECTION_REFUSED"
        assert [m for m in problems if unreachable not in m] == []
