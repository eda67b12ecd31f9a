"""A real browser: headless Debian Chromium driven by Playwright against a live app on the embedded model.

Asserts on the DOM, not on pixels; saves a screenshot under artifacts/.
Skips only when Chromium is missing or cannot start here.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import specdec
from conftest import free_port
from app import build_demo, launch_kwargs
from specdec.lookup import DEFAULT_LOOKUP

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


@pytest.fixture(scope="module")
def url():
    demo = build_demo(specdec.load(device="cpu"))
    _, local, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True,
                              quiet=True, **launch_kwargs())
    yield local
    demo.close()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Chromium not found at {CHROMIUM} (Debian: apt-get install -y chromium)")
    with sync_api.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS, timeout=60_000)
        except sync_api.Error as e:
            pytest.skip(f"Chromium cannot run here: {e}")
        yield b
        b.close()


def set_number(page, elem_id: str, value) -> None:
    """Type into a slider's number box and commit it, as a user would."""
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    box.blur()


@pytest.mark.timeout(180)
def test_generate_in_a_real_browser(url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1700})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="domcontentloaded", timeout=60_000)
    prompt = page.locator("#prompt textarea")
    prompt.wait_for(timeout=60_000)

    # The sampler view renders without any generation, and follows the sliders.
    page.wait_for_selector("#sampler-plot .js-plotly-plot", timeout=60_000)
    set_number(page, "top-k", 3)
    page.wait_for_function(
        "() => [...document.querySelectorAll('#sampler-plot .gtitle')].some(t => t.textContent.includes('top-k 3'))",
        timeout=30_000)
    assert page.locator("#sampler-plot .gtitle").first.text_content().count("3 of top 20 kept") == 1

    # The prompt lookup controls sit with the tree controls, at their defaults.
    assert page.locator("#lookup input[type=number]").input_value() == str(DEFAULT_LOOKUP)
    assert page.locator("#lookup-mode input[value=first]").is_checked()

    prompt.fill("class Stack:")
    set_number(page, "max-new", 24)
    page.click("#generate-btn")

    page.wait_for_selector("#tokens .sd-tok", timeout=60_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('#stats')].some(s => s.textContent.includes('done: reached max new tokens'))",
        timeout=90_000)
    page.wait_for_selector("#tree-plot .js-plotly-plot .scatterlayer .point", timeout=30_000)
    # Tokens: coloured spans with a hover title, and the prompt in front.
    spans = page.locator("#tokens .sd-tok")
    assert spans.count() == 24
    assert page.locator("#tokens .sd-prompt").text_content() == "class Stack:"
    title = spans.first.get_attribute("title")
    assert title.startswith("round 0 · ") and "target p=" in title
    kinds = {c for i in range(spans.count()) for c in spans.nth(i).get_attribute("class").split()}
    assert kinds & {"sd-accepted", "sd-correction", "sd-bonus"}
    assert page.locator("#legend .sd-legend").count() == 1

    # The draft tree of the last round: a title, one marker per node (+ the target's token), labels.
    tree_title = page.locator("#tree-plot .gtitle").first.text_content()
    assert tree_title.startswith("Round ") and "drafts" in tree_title
    assert page.locator("#tree-plot .scatterlayer .point").count() >= 5
    assert page.locator("#tree-plot .scatterlayer .textpoint").count() >= 5
    for chart in ("len-plot", "depth-plot", "tps-plot"):
        assert page.locator(f"#{chart} .js-plotly-plot").count() == 1, chart
    assert "denominator" in page.locator("#depth-plot .gtitle").first.text_content()

    # Step back to round 1 with the round slider.
    set_number(page, "round-slider", 1)
    page.wait_for_function(
        "() => [...document.querySelectorAll('#tree-plot .gtitle')].some(t => t.textContent.startsWith('Round 1:'))",
        timeout=30_000)
    assert "Round 1" in page.locator("#round-info").text_content()
    page.wait_for_timeout(500)  # let plotly finish its last redraw before the screenshot
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "app_browser.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert not errors, errors
    page.close()
