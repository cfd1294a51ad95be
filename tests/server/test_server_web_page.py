"""The chat page at ``/`` of ``tensorplug serve``, in a real headless Chromium driven by
Selenium against a real server (uvicorn on a free port, the tiny model): a reply
streams into its bubble, Stop ends it, Regenerate asks again, the conversation is
kept over a reload, the key is asked for and used, and the model's markdown cannot run
script. The browser tests skip where Chromium is not installed; ``.ci/run`` installs
it from the system's packages."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

pytest.importorskip("fastapi", reason="the server needs tensorplug-llm[serve]")

import uvicorn
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tiny_server import TinyModel, tiny_model

from tensorplug_llm.server import ServerConfig, create_app

KEY = "sk-web"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 60  # generous: every wait ends as soon as its condition holds

browser_test = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="the chat page is tested in Chromium: apt-get install chromium chromium-driver "
    "(.ci/run installs them)",
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModel]:
    m = tiny_model(tmp_path_factory.mktemp("web"))
    yield m
    m.close()


class HeldStream:
    """The app, with a streamed chat held after the first event that brings a letter or
    digit until the client goes away: a generation as long as the test needs to press Stop
    in, however fast the tiny model is. Held on text the page shows: the tiny model's first
    pieces can be control characters, or markdown that renders as nothing. Records the text
    it let through and the client's disconnect."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.sent = ""
        self.disconnected = threading.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await self.app(scope, receive, send)
            return
        gone = asyncio.Event()
        holding = False

        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
                self.disconnected.set()
            return message

        async def held(message: Message) -> None:
            nonlocal holding
            if holding:  # nothing more reaches the client, which is gone once this returns
                await asyncio.wait_for(gone.wait(), WAIT_S)
                return
            await send(message)
            for line in message.get("body", b"").decode().splitlines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    self.sent += delta.get("content") or ""
            holding = any(character.isalnum() for character in self.sent)

        await self.app(scope, watched, held)


@contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """``app`` on uvicorn at a free port of the loopback; yields the page's URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("Chromium is not installed")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (apps/llm[test])")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    yield driver
    driver.quit()


def until(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition, f"the page did not show {what}")


def element(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css)


def elements(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, css))


def kept(driver: Any) -> list[dict[str, Any]]:
    """The conversations the page keeps in localStorage."""
    conversations: list[dict[str, Any]] = json.loads(
        driver.execute_script("return localStorage.getItem('tensorplug.conversations')")
    )
    return conversations


def set_field(driver: Any, css: str, value: str) -> None:
    field = element(driver, css)
    field.clear()
    field.send_keys(value)


def setting(driver: Any, name: str, value: str) -> None:
    """Sets one of the settings (their panel opened first)."""
    if not element(driver, "#settings").get_attribute("open"):
        element(driver, "#settings summary").click()
    set_field(driver, f"#{name}", value)


def send(driver: Any, text: str) -> None:
    set_field(driver, "#prompt", text)
    element(driver, "#send").click()


def idle(driver: Any) -> bool:
    """No reply streaming, and at least one reply shown."""
    return bool(
        element(driver, "#send").is_enabled()
        and elements(driver, ".message.assistant")
        and not elements(driver, ".message.streaming")
    )


def reply_of(url: str, text: str, max_tokens: int, key: str = "") -> dict[str, Any]:
    """The server's own greedy answer to ``text``, as JSON."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0}  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    answer: dict[str, Any] = httpx.post(
        url + "v1/chat/completions", json=body, headers=headers, timeout=WAIT_S
    ).json()
    return answer


def test_the_page_and_its_files_are_public_and_the_api_is_not(model: TinyModel) -> None:
    http = TestClient(create_app(model.llm, ServerConfig(api_key=KEY)))
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="web/app.js">' in page.text
    for path, kind in (("/web/app.js", "javascript"), ("/web/style.css", "text/css"),
                       ("/web/vendor/marked.esm.js", "javascript")):  # fmt: skip
        r = http.get(path)
        assert r.status_code == 200 and kind in r.headers["content-type"], path
    assert http.head("/").status_code == 200
    assert http.get("/web/nosuch.js").status_code == 404
    assert http.get("/props").status_code == 401


@browser_test
def test_a_reply_streams_in_is_regenerated_and_is_kept_over_a_reload(
    model: TinyModel, browser: Any
) -> None:
    with serving(create_app(model.llm)) as url:
        browser.get(url)
        until(browser, lambda d: element(d, "#model").text == "tiny.gguf", "the model's name")
        until(browser, lambda d: element(d, "#context").text == "context: 0 / 256 tokens",
              "the context size")  # fmt: skip
        setting(browser, "temperature", "0")
        setting(browser, "max_tokens", "12")
        send(browser, "hello")
        until(browser, idle, "a finished reply")
        expected = reply_of(url, "hello", 12)
        text = expected["choices"][0]["message"]["content"]
        assert text
        [conversation] = kept(browser)
        assert conversation["title"] == "hello"
        assert conversation["messages"] == [{"role": "user", "content": "hello"},
                                            {"role": "assistant", "content": text}]  # fmt: skip
        used = expected["usage"]["total_tokens"]
        assert conversation["tokens"] == used
        assert element(browser, "#context").text == f"context: {used} / 256 tokens"
        rendered = browser.execute_async_script(
            "import('/web/render.js').then(m => arguments[1](m.renderMarkdown(arguments[0])))",
            text,
        )
        shown = element(browser, ".message.assistant .content").get_attribute("innerHTML")
        assert shown == rendered

        element(browser, "#regenerate").click()  # greedy: the same reply, in its place
        until(browser, idle, "the regenerated reply")
        assert kept(browser)[0]["messages"] == conversation["messages"]
        assert len(elements(browser, ".message")) == 2

        browser.refresh()
        until(browser, lambda d: len(elements(d, ".message")) == 2, "the kept messages")
        assert element(browser, ".message.user .content").text == "hello"
        assert (
            element(browser, ".message.assistant .content").get_attribute("innerHTML") == rendered
        )
        assert element(browser, "#temperature").get_attribute("value") == "0"  # settings kept
        until(browser, lambda d: element(d, "#context").text == f"context: {used} / 256 tokens",
              "the kept context use")  # fmt: skip

        element(browser, "#new-chat").click()
        assert len(elements(browser, "#conversations li")) == 2
        assert elements(browser, ".message") == []
        element(browser, f'#conversations li[data-id="{conversation["id"]}"] .delete').click()
        assert [c["id"] for c in kept(browser)] != [conversation["id"]]
        assert len(kept(browser)) == len(elements(browser, "#conversations li")) == 1


@browser_test
def test_stop_ends_a_streaming_reply_and_the_server_sees_it(model: TinyModel, browser: Any) -> None:
    app = HeldStream(create_app(model.llm))
    with serving(app) as url:
        browser.get(url)
        until(browser, lambda d: element(d, "#model").text == "tiny.gguf", "the model's name")
        setting(browser, "temperature", "0")  # the same pieces every run
        setting(browser, "max_tokens", "200")
        send(browser, "tell me a long story")
        streamed = ".message.assistant.streaming .content"
        until(browser, lambda d: elements(d, streamed) and element(d, streamed).text,
              "streamed text while the reply runs")  # fmt: skip
        assert not element(browser, "#send").is_enabled()
        element(browser, "#stop").click()
        until(browser, lambda d: app.disconnected.is_set(), "the request aborted")
        until(browser, idle, "the stopped reply")
        assert element(browser, ".message.assistant .note").text == "stopped"
        assert not element(browser, "#stop").is_enabled()
        [conversation] = kept(browser)
        assert conversation["messages"][-1] == {"role": "assistant", "content": app.sent,
                                                "stopped": True}  # fmt: skip


@browser_test
def test_the_page_asks_for_the_key_and_works_with_it(model: TinyModel, browser: Any) -> None:
    with serving(create_app(model.llm, ServerConfig(api_key=KEY))) as url:
        browser.get(url)
        until(browser, lambda d: element(d, "#key-dialog").is_displayed(), "the key dialog")
        until(browser, lambda d: element(d, "#model").text == "tiny.gguf", "the model's name")
        set_field(browser, "#api-key", "wrong")
        element(browser, "#key-save").click()
        until(browser, lambda d: element(d, "#key-error").text == "The server refused this key.",
              "the refused key")  # fmt: skip
        set_field(browser, "#api-key", KEY)
        element(browser, "#key-save").click()
        until(browser, lambda d: not element(d, "#key-dialog").is_displayed(), "the key taken")
        assert element(browser, "#context").text == "context: 0 / 256 tokens"
        setting(browser, "temperature", "0")
        setting(browser, "max_tokens", "8")
        send(browser, "hello")
        until(browser, idle, "a finished reply")
        text = reply_of(url, "hello", 8, KEY)["choices"][0]["message"]["content"]
        assert kept(browser)[0]["messages"][-1] == {"role": "assistant", "content": text}


@browser_test
def test_markdown_is_rendered_and_the_models_html_cannot_run(
    model: TinyModel, browser: Any
) -> None:
    with serving(create_app(model.llm)) as url:
        browser.get(url)
        until(browser, lambda d: element(d, "#model").text == "tiny.gguf", "the model's name")
        untrusted = (
            "**bold** `x < 1`\n\n```py\nprint('<b>')\n```\n\n"
            '<img src="x" onerror="window.ran = 1"><script>window.ran = 2</script>'
            "[link](javascript:window.ran=3)"
        )
        html = browser.execute_async_script(
            "import('/web/render.js').then(m => arguments[1](m.renderMarkdown(arguments[0])))",
            untrusted,
        )
    assert "<strong>bold</strong>" in html and "<code>x &lt; 1</code>" in html
    assert "<pre><code class=\"language-py\">print('&lt;b&gt;')" in html
    assert "<img" in html and "onerror" not in html and "<script" not in html
    assert "javascript:" not in html
