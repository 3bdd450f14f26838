"""The chat page of ``adarag serve`` in a real browser: Debian's chromium, driven by Selenium
through chromium-driver (``make browser`` installs both; ``.ci/run`` runs it).

The first test asks a question and sees the answer stream in with its source, TTFT and cache
tiers, uploads a PDF and asks about it; the others check a failed request, Enter and Shift+Enter,
the stop button, a source opened and a confirmed delete. With
``ADARAG_CHAT_SCREENSHOT=docs/chat.png`` they save the pages docs/usage.md shows (``chat.png``,
and ``chat-error.png``, ``chat-stop.png`` and ``chat-source.png`` beside it). Without chromium
they are skipped, except under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.documents import PDF_FACT, pdf_bytes
from tests.documents_server import markdown_knowledge_server
from tests.reliability.http_server import Served

pytestmark = pytest.mark.integration
API_KEY = "page-key"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1000,720",
)
WAIT_S = 600


def _browser_or_skip() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    missing = [
        name for name, path in (("chromium", chromium), ("chromium-driver", driver)) if not path
    ]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (the dev extra)")
    if missing:
        reason = (
            f"no {' and '.join(missing)}: the chat page's browser test needs Debian's chromium "
            "and chromium-driver (`make browser` installs them as root) and selenium"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    assert chromium and driver
    return chromium, driver


@pytest.fixture()
def browser(tmp_path) -> Iterator:
    chromium, driver_path = _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture()
def page_server(shared_rag, tmp_path) -> Iterator[Served]:
    with markdown_knowledge_server(
        shared_rag, tmp_path, "page", API_KEY, default_max_tokens=24
    ) as (served, _):
        yield served


@pytest.fixture()
def long_answer_server(shared_rag, tmp_path) -> Iterator[Served]:
    with markdown_knowledge_server(
        shared_rag, tmp_path, "page-long", API_KEY, default_max_tokens=400
    ) as (served, _):
        yield served


def _open(browser, server: Served, key: str = API_KEY):
    """The page, its key given, its documents listed; returns a waiter."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S)
    browser.get(f"{server.url}/")
    _use_key(browser, key)
    if key == API_KEY:
        wait.until(lambda d: "storage.md" in d.find_element(By.ID, "documents").text)
    return wait


def _use_key(browser, key: str) -> None:
    from selenium.webdriver.common.by import By

    field = browser.find_element(By.ID, "api-key")
    field.clear()
    field.send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "#key-form button").click()


def _screenshot(browser, name: str) -> None:
    """Saves the page beside ``$ADARAG_CHAT_SCREENSHOT`` as ``name``, when that is set."""
    target = os.environ.get("ADARAG_CHAT_SCREENSHOT")
    if target:
        assert browser.save_screenshot(str(Path(target).with_name(name)))


def _record_requests(browser) -> None:
    """From now on the page's request bodies are kept in ``window.sentBodies``."""
    browser.execute_script(
        "window.sentBodies = []; const send = window.fetch;"
        "window.fetch = (url, options) => {"
        "  if (options && typeof options.body === 'string') window.sentBodies.push(options.body);"
        "  return send(url, options); };"
    )


def _ask(browser, question: str, wait):
    from selenium.webdriver.common.by import By

    before = len(browser.find_elements(By.CSS_SELECTOR, ".message.assistant"))
    browser.find_element(By.ID, "question").send_keys(question)
    browser.find_element(By.ID, "send").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message.assistant")) > before)
    bubble = browser.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1]
    wait.until(lambda d: bubble.get_attribute("data-done") == "true" or _error(d))
    assert not _error(browser), _error(browser)
    sources = [li.text for li in bubble.find_elements(By.CSS_SELECTOR, ".sources li")]
    return bubble, sources


def _error(browser) -> str:
    from selenium.webdriver.common.by import By

    return " ".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, ".message.error"))


def test_the_page_streams_answers_with_sources_and_answers_from_an_uploaded_file(
    browser, page_server, tmp_path
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S)
    browser.get(f"{page_server.url}/")
    wait.until(lambda d: "API key" in d.find_element(By.ID, "status").text)  # 401 without it
    browser.find_element(By.ID, "api-key").send_keys(API_KEY)
    browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
    wait.until(lambda d: d.find_element(By.ID, "model").text)
    wait.until(lambda d: "storage.md" in d.find_element(By.ID, "documents").text)

    bubble, sources = _ask(browser, "Where are bicycles stored?", wait)
    assert bubble.find_element(By.CSS_SELECTOR, ".text").text.strip()
    assert int(bubble.get_attribute("data-deltas")) > 1  # it streamed in, delta by delta
    assert "storage.md" in sources[0]
    meta = bubble.find_element(By.CSS_SELECTOR, ".meta").text
    assert "server TTFT" in meta and "cache tiers:" in meta and "from cache" in meta

    pdf = tmp_path / "gate-manual.pdf"
    pdf.write_bytes(pdf_bytes([["Gate manual"], ["Access", PDF_FACT]]))
    browser.find_element(By.ID, "upload").send_keys(str(pdf))
    browser.find_element(By.CSS_SELECTOR, "#upload-form button").click()
    wait.until(lambda d: "gate-manual.pdf is ready" in d.find_element(By.ID, "status").text)
    assert "gate-manual.pdf (2 chunks, ready)" in browser.find_element(By.ID, "documents").text

    bubble, sources = _ask(browser, "What is the north gate access code?", wait)
    # retrieval also reads the earlier turn (chat.standalone_question), so the file is among them
    assert any("gate-manual.pdf" in source and "page 2" in source for source in sources)
    assert len(browser.find_elements(By.CSS_SELECTOR, ".message.user")) == 2  # kept
    screenshot = Path(os.environ.get("ADARAG_CHAT_SCREENSHOT") or tmp_path / "chat.png")
    assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 0


def test_a_failed_request_shows_the_servers_message_and_leaves_the_history(browser, page_server):
    from selenium.webdriver.common.by import By

    wait = _open(browser, page_server, key="wrong-key")
    wait.until(lambda d: "API key" in d.find_element(By.ID, "status").text)
    browser.find_element(By.ID, "question").send_keys("Where are bicycles stored?")
    browser.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant.error"))
    (failed,) = browser.find_elements(By.CSS_SELECTOR, ".message.assistant")
    assert "invalid or missing API key" in failed.find_element(By.CSS_SELECTOR, ".failure").text
    assert "..." not in failed.text  # no answer is still awaited
    assert browser.find_element(By.ID, "send").is_enabled()

    _use_key(browser, API_KEY)
    wait.until(lambda d: "storage.md" in d.find_element(By.ID, "documents").text)
    _record_requests(browser)
    browser.find_element(By.ID, "question").send_keys("Which room has the bicycles?")
    browser.find_element(By.ID, "send").click()
    bubbles = browser.find_elements(By.CSS_SELECTOR, ".message.assistant")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".message.assistant")) == 2)
    bubble = browser.find_elements(By.CSS_SELECTOR, ".message.assistant")[-1]
    wait.until(lambda d: bubble.get_attribute("data-done") == "true")
    assert bubbles and not bubble.get_attribute("data-failed")
    (sent,) = [json.loads(body) for body in browser.execute_script("return window.sentBodies")]
    # the failed question is not part of the conversation the next one is asked in
    assert sent["messages"] == [{"role": "user", "content": "Which room has the bicycles?"}]
    _screenshot(browser, "chat-error.png")


def test_enter_sends_and_shift_enter_starts_a_new_line(browser, page_server):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    wait = _open(browser, page_server)
    question = browser.find_element(By.ID, "question")
    question.send_keys("Where are bicycles stored?")
    ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()
    question.send_keys("Answer briefly.")
    assert question.get_attribute("value") == "Where are bicycles stored?\nAnswer briefly."
    assert not browser.find_elements(By.CSS_SELECTOR, ".message.user")  # not sent yet

    question.send_keys(Keys.ENTER)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".message.user"))
    sent = browser.find_element(By.CSS_SELECTOR, ".message.user").text
    assert sent.splitlines() == ["Where are bicycles stored?", "Answer briefly."]
    bubble = browser.find_element(By.CSS_SELECTOR, ".message.assistant")
    wait.until(lambda d: bubble.get_attribute("data-done") == "true" or _error(d))
    assert not _error(browser), _error(browser)
    assert question.get_attribute("value") == ""


def test_stop_aborts_the_streaming_answer_and_keeps_what_arrived(browser, long_answer_server):
    from selenium.webdriver.common.by import By

    wait = _open(browser, long_answer_server)
    stop = browser.find_element(By.ID, "stop")
    assert not stop.is_enabled()  # nothing to stop
    browser.find_element(By.ID, "question").send_keys(
        "Write a long story about the bicycles in the storage room, with many details."
    )
    browser.find_element(By.ID, "send").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".message.assistant"))
    bubble = browser.find_element(By.CSS_SELECTOR, ".message.assistant")
    wait.until(lambda d: int(bubble.get_attribute("data-deltas")) >= 2 or _error(d))
    _screenshot(browser, "chat-stop.png")
    stop.click()
    wait.until(lambda d: bubble.get_attribute("data-done") == "true" or _error(d))
    assert not _error(browser), _error(browser)
    assert bubble.get_attribute("data-stopped") == "true"
    kept = bubble.find_element(By.CSS_SELECTOR, ".text").text
    assert kept.strip() and "stopped" in bubble.find_element(By.CSS_SELECTOR, ".meta").text
    time.sleep(1)
    assert bubble.find_element(By.CSS_SELECTOR, ".text").text == kept  # nothing more arrives
    assert browser.find_element(By.ID, "send").is_enabled() and not stop.is_enabled()


def test_a_source_opens_to_show_what_the_answer_says_of_it(browser, page_server):
    from selenium.webdriver.common.by import By

    wait = _open(browser, page_server)
    bubble, sources = _ask(browser, "Where are bicycles stored?", wait)
    source = bubble.find_element(By.CSS_SELECTOR, ".sources li details")
    assert source.get_attribute("open") is None
    source.find_element(By.TAG_NAME, "summary").click()
    wait.until(lambda d: source.get_attribute("open") is not None)
    names = [dt.text for dt in source.find_elements(By.TAG_NAME, "dt")]
    values = [dd.text for dd in source.find_elements(By.TAG_NAME, "dd")]
    assert "source" in names and "storage.md" in values
    assert "chunk_id" in names and values[names.index("chunk_id")]
    assert source.find_element(By.CSS_SELECTOR, ".source-text").text.strip()  # what it read
    _screenshot(browser, "chat-source.png")


def test_delete_asks_before_it_removes_a_document(browser, page_server):
    from selenium.webdriver.common.by import By

    wait = _open(browser, page_server)
    browser.find_element(By.CSS_SELECTOR, "#documents button").click()
    wait.until(lambda d: d.switch_to.alert)
    assert "storage.md" in browser.switch_to.alert.text
    browser.switch_to.alert.dismiss()
    time.sleep(1)
    assert "storage.md" in browser.find_element(By.ID, "documents").text  # kept
    assert "deleted" not in browser.find_element(By.ID, "status").text

    browser.find_element(By.CSS_SELECTOR, "#documents button").click()
    wait.until(lambda d: d.switch_to.alert)
    browser.switch_to.alert.accept()
    wait.until(lambda d: "deleted storage.md" in d.find_element(By.ID, "status").text)
    assert "storage.md" not in browser.find_element(By.ID, "documents").text
