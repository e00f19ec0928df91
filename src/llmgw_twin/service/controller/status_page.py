"""`GET /status`: the fleet at a glance, one self-contained HTML page served by the controller.

Role: the page is static (markup, style and script, no fleet data and no credential in it), so
it is served to anyone; its script (`status_assets.SCRIPT`) reads the admin API with the admin
token the operator types in or passes once in the address's `#token=` fragment, and polls it
(docs/services.md, "Status page"). The only thing the page says about the controller is whether
it asks for a token (`data-auth` on the body), which `/health` says as well.

Invariants:
- No external resource: one inline `<style>` and one inline `<script>`, allowed by their
  SHA-256 in a strict Content-Security-Policy (`default-src 'none'`, `connect-src 'self'`, no
  form targets, no framing); `X-Frame-Options: DENY`, no referrer, not cached.
- The markup has no `style` or event-handler attributes; the token input has no `name`, so a
  form submission could never carry it into a URL (and `form-action 'none'` forbids one).
"""

from __future__ import annotations

import base64
import hashlib

from fastapi.responses import HTMLResponse

from llmgw_twin.service.controller.status_assets import SCRIPT

STYLE = """
:root { font: 14px/1.4 system-ui, sans-serif; color: #1d2330; background: #f4f5f7; }
body { margin: 0; }
[hidden] { display: none !important; }
header { display: flex; align-items: center; gap: 16px; padding: 10px 20px;
  background: #1d2330; color: #f4f5f7; flex-wrap: wrap; }
h1 { font-size: 18px; margin: 0; font-weight: 600; }
h2 { font-size: 15px; margin: 18px 0 8px; }
h3 { font-size: 14px; margin: 0 0 6px; }
main { padding: 0 20px 30px; }
main.stale { opacity: 0.55; }
.conn { display: flex; align-items: center; gap: 6px; }
.conn .dot { width: 10px; height: 10px; border-radius: 50%; background: #888; }
.conn-ok .dot { background: #2fb85f; }
.conn-down .dot, .conn-auth .dot { background: #e5484d; }
.conn-wait .dot { background: #f0b429; }
.muted { color: #8a93a6; }
header .muted { color: #b8c0d0; }
#forget { margin-left: auto; }
form { display: flex; gap: 8px; align-items: center; padding: 10px 20px; background: #fff7e0;
  border-bottom: 1px solid #e8d9a8; flex-wrap: wrap; }
form input { width: 32em; font: inherit; padding: 3px 6px; }
.error { color: #c4262c; }
.summary { display: flex; gap: 10px; flex-wrap: wrap; margin-top: 14px; }
.chip { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; padding: 6px 10px; }
.banner { background: #fde8e8; border: 1px solid #f3b7b9; border-radius: 6px; padding: 8px 12px;
  margin-top: 10px; }
.fabrics { display: grid; grid-template-columns: repeat(auto-fill, minmax(620px, 1fr));
  gap: 12px; }
.fabric { background: #fff; border: 1px solid #dde1e8; border-radius: 8px; padding: 10px 12px; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #eceef2;
  vertical-align: top; }
th { font-weight: 600; color: #5a6275; font-size: 12px; }
.badge { display: inline-block; border-radius: 4px; padding: 0 6px; font-size: 12px;
  background: #e4e7ee; }
.health-alive, .link-up, .state-ready { background: #d5f5e0; color: #146c34; }
.health-suspect, .state-placed, .state-starting, .state-adopting, .state-degraded {
  background: #fdefc8; color: #7a5500; }
.health-lost, .link-down, .state-failed, .state-pending { background: #fde0e0; color: #a11b20; }
.link-stale, .shards-stale { background: #e4e7ee; color: #5a6275; font-style: italic; }
.strip { display: flex; gap: 2px; flex-wrap: wrap; max-width: 260px; }
.gpu { width: 11px; height: 15px; border-radius: 2px; border: 1px solid #b9c0cc;
  background: #fff; }
.gpu-used { background: #4c7ef0; border-color: #2f5fcc; }
.gpu-failed { background: #e5484d; border-color: #a11b20; }
.flags { color: #7a5500; font-size: 12px; }
.reason { color: #a11b20; max-width: 520px; overflow-wrap: anywhere; }
#pending li { margin: 3px 0; }
#events { list-style: none; padding: 0; margin: 0; background: #fff; border: 1px solid #dde1e8;
  border-radius: 8px; max-height: 420px; overflow: auto;
  font: 12px/1.5 ui-monospace, monospace; }
#events li { padding: 1px 10px; border-bottom: 1px solid #f0f1f4; overflow-wrap: anywhere; }
#events .t { color: #8a93a6; margin-right: 10px; }
#events .k { font-weight: 600; margin-right: 10px; }
"""

BODY = """
<header>
  <h1>llmgw-twin fleet</h1>
  <div id="conn" class="conn conn-wait" role="status" aria-live="polite">
    <span class="dot"></span><strong id="conn-label">connecting</strong>
    <span id="conn-detail"></span>
  </div>
  <span id="updated" class="muted">never updated</span>
  <button id="forget" type="button" hidden>forget token</button>
</header>
<form id="token-form" hidden autocomplete="off">
  <label for="token-input">Admin or reader token</label>
  <input id="token-input" type="password" autocomplete="off" spellcheck="false"
    maxlength="256">
  <button type="submit">use token</button>
  <span id="token-error" class="error"></span>
  <span class="muted">kept in this tab only (sessionStorage)</span>
</form>
<main id="main">
  <section id="summary" class="summary"></section>
  <div id="banners"></div>
  <h2>Fabrics</h2>
  <div id="fabrics" class="fabrics"></div>
  <h2>Pending replicas</h2>
  <ul id="pending"></ul>
  <p id="pending-none" class="muted">none</p>
  <h2>Replicas</h2>
  <table><thead><tr><th>replica</th><th>model</th><th>state</th><th>fabric</th><th>nodes</th>
    <th>shards up</th><th>reason</th></tr></thead><tbody id="replicas"></tbody></table>
  <h2>Deployments</h2>
  <table><thead><tr><th>model</th><th>profile</th><th>wanted</th><th>live</th><th>ready</th>
    </tr></thead><tbody id="deployments"></tbody></table>
  <div id="quarantines-box" hidden>
    <h2>Quarantines</h2>
    <table><thead><tr><th>node</th><th>profile</th><th>until</th><th>reason</th></tr></thead>
      <tbody id="quarantines"></tbody></table>
  </div>
  <h2>Recent events <span class="muted" id="events-note"></span></h2>
  <ol id="events"></ol>
</main>
"""


def _source(text: str) -> str:
    """A CSP source that allows exactly `text` as an inline element's content."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        f"script-src {_source(SCRIPT)}",
        f"style-src {_source(STYLE)}",
        "connect-src 'self'",
        "img-src data:",  # the empty favicon, so the browser asks the controller for none
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def render(auth_required: bool) -> str:
    """The page: `auth_required` says whether the script must ask for a token before it reads."""
    for text in (SCRIPT, STYLE):
        assert "</" not in text, "an inline element's text must not close a tag"
    auth = "required" if auth_required else "none"
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="referrer" content="no-referrer">\n'
        "<title>llmgw-twin fleet status</title>\n"
        '<link rel="icon" href="data:,">\n'
        f"<style>{STYLE}</style>\n</head>\n"
        f'<body data-auth="{auth}">{BODY}<script>{SCRIPT}</script>\n</body>\n</html>\n'
    )


_PAGES = {required: render(required).encode("utf-8") for required in (False, True)}


def status_response(auth_required: bool) -> HTMLResponse:
    """`GET /status`'s answer: the page and its headers."""
    return HTMLResponse(_PAGES[auth_required], headers=HEADERS)
