"""The chat page of ``adarag serve`` in a real browser: Debian's chromium, driven by Selenium
through chromium-driver (``make browser`` installs both; ``.ci/run`` runs it).

The test asks a question and sees the answer stream in with its source, TTFT and cache tiers,
uploads a PDF and asks about it. With ``ADARAG_CHAT_SCREENSHOT=docs/chat.png`` it saves the
page as docs/usage.md shows it. Without chromium it is skipped, except under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
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
