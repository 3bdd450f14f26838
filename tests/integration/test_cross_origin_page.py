"""A web page of another origin, in a real browser, can neither add documents nor query.

``adarag serve`` without an API key (how it starts) listens on 127.0.0.1; a page served from
another local port (another origin) runs in headless Chromium and tries what any site could:
a multipart form posted into a hidden frame, ``fetch`` uploads as multipart and as JSON (sent
as ``text/plain`` in ``no-cors`` mode, and as ``application/json``, which the browser asks
about first), a query, and reading the document list. The server refuses them all (nothing is
added, nothing answered); its own chat page, from its own origin, still uploads and answers.
Chromium comes from ``make browser``; without it the test is skipped, except under ``CI=true``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.integration.test_chat_page import _error, browser  # noqa: F401 (the fixture)
from tests.reliability.http_server import Served
from tests.reliability.kb_server import kb_serving, listed

pytestmark = pytest.mark.integration
WAIT_S = 300

ATTACK_PAGE = """<!doctype html>
<html><body>
<iframe name="sink" style="display:none"></iframe>
<form id="form" method="post" enctype="multipart/form-data" target="sink" action="TARGET/v1/files">
  <input type="file" name="file" id="file"><input name="purpose" value="assistants">
</form>
<script>
const target = "TARGET";
const results = {};
async function attempt(name, request) {
  try {
    const response = await request();
    results[name] = response.type === "opaque" ? "opaque" : String(response.status);
  } catch (err) {
    results[name] = "blocked";
  }
}
async function run() {
  const transfer = new DataTransfer();
  transfer.items.add(new File(["# planted\\n\\nthe gate code is 0000\\n"], "planted-form.md"));
  document.getElementById("file").files = transfer.files;
  document.getElementById("form").submit();
  const form = new FormData();
  form.append("file", new File(["the gate code is 0000"], "planted-fetch.md"));
  const json = JSON.stringify({filename: "planted-json.md", text: "the gate code is 0000"});
  const question = JSON.stringify({question: "code?", chunks: ["the code is 1"]});
  await attempt("multipart", () => fetch(`${target}/v1/files`,
    {method: "POST", mode: "no-cors", body: form}));
  await attempt("json-as-text", () => fetch(`${target}/v1/files`,
    {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: json}));
  await attempt("json", () => fetch(`${target}/v1/files`,
    {method: "POST", headers: {"Content-Type": "application/json"}, body: json}));
  await attempt("query", () => fetch(`${target}/v1/rag/query`,
    {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: question}));
  await attempt("query-json", () => fetch(`${target}/v1/rag/query`,
    {method: "POST", headers: {"Content-Type": "application/json"}, body: question}));
  await attempt("list", () => fetch(`${target}/v1/files`));
  await new Promise(resolve => setTimeout(resolve, 1000));  // the form post lands
  document.title = "done " + JSON.stringify(results);
}
run();
</script>
</body></html>
"""


@pytest.fixture()
def kb_server(tiny_checkpoints, tmp_path) -> Iterator[Served]:
    with kb_serving(tiny_checkpoints["llama"], tmp_path, default_max_tokens=4) as (served, _):
        yield served


@pytest.fixture()
def attack_page(kb_server) -> Iterator[str]:
    """The URL of the attacking page, on another port (another origin) of 127.0.0.1."""
    page = ATTACK_PAGE.replace("TARGET", kb_server.url).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _requests_counted(served: Served) -> list[str]:
    metrics = httpx.get(f"{served.url}/metrics", timeout=30).text
    return [line for line in metrics.splitlines() if line.startswith("adarag_requests_total{")]


def test_a_page_of_another_origin_is_refused_and_the_chat_page_still_works(
    browser,  # noqa: F811
    kb_server,
    attack_page,
    tmp_path,
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S)
    browser.get(attack_page)
    wait.until(lambda d: d.title.startswith("done"))
    results = browser.title.removeprefix("done ")
    assert '"list":"blocked"' in results and '"json":"blocked"' in results, results
    assert not any(name.startswith("planted") for name in listed(kb_server))
    assert _requests_counted(kb_server) == []  # no query reached the engine

    browser.get(f"{kb_server.url}/")
    wait.until(lambda d: d.find_element(By.ID, "model").text)
    notes = tmp_path / "lodge.md"
    notes.write_text("# Lodge\n\nThe lodge gate opens at seven.\n")
    browser.find_element(By.ID, "upload").send_keys(str(notes))
    browser.find_element(By.CSS_SELECTOR, "#upload-form button").click()
    wait.until(lambda d: "lodge.md is ready" in d.find_element(By.ID, "status").text)
    browser.find_element(By.ID, "question").send_keys("When does the gate open?")
    browser.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant"))
    bubble = browser.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1]
    wait.until(lambda d: bubble.get_attribute("data-done") == "true" or _error(d))
    assert not _error(browser), _error(browser)
    assert any("ok" in line for line in _requests_counted(kb_server))
